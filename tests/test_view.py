"""The episodes page (``python -m drmas.view``): a tree node's candidates with the executed one
marked, silent groups counted per agent and turn, and the filters, on hand-made records; the pages
of real runs are read in headless Chromium in tests/recipes/test_search_recipe.py."""

import contextlib
import gzip
import json
import os
import shutil

import pytest

from drmas.atomic import write_bytes
from drmas.data.episodes import episodes_path
from drmas.view import load_run, main, render, silent_groups


def record(agent, turn, reward, candidate=0, chosen=True, task="t1", traj="t1#tree", advantage=0.0):
    return {"split": "train", "iteration": 1, "task": task, "source": "src", "trajectory": traj,
            "agent": agent, "policy": "shared", "turn": turn, "candidate": candidate, "chosen": chosen,
            "group": str((task, traj, agent, turn)), "prompt": "<p>rompt",
            "response": f"{agent} says {reward}",
            "prompt_tokens": 3, "response_tokens": 2, "cut": False, "valid": True, "team_reward": 0.0,
            "local_reward": reward, "role_reward": reward, "failure": None, "reward": reward,
            "advantage": advantage, "version": 0, "logprob_gap": None, "tokens": None,
            "token_logprob_diff": None, "episode_success": False, "episode_team_reward": 0.0, "info": {}}


# at_grpo's groups, a node each: the planner's rewards 0.5, 0.9, 0.1 (std 0.4) give advantages 0, 1,
# -1 (one zero does not make a group silent); the user's three -0.1 give three zeros: silent
TREE = [record("planner", 0, 0.5, 0, False), record("planner", 0, 0.9, 1, True, advantage=1.0),
        record("planner", 0, 0.1, 2, False, advantage=-1.0), record("user", 0, -0.1, 0, True),
        record("user", 0, -0.1, 1, False), record("user", 0, -0.1, 2, False)]
# an agents-workflow call: the program's messages, a tool call, the tokens with the trainer's gaps
CALL = {**record("coder", 0, 0.75, task="t2", traj="t2#0"), "response": "def f", "cut": True,
        "logprob_gap": 0.15, "tokens": ["def", " f"], "token_logprob_diff": [-0.25, 0.05],
        "info": {"call": 3, "messages": [{"role": "system", "content": "You code."},
                                         {"role": "user", "content": "Write f."}],
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "run_tests", "arguments": "{}"}}]}}


def test_a_tree_node_shows_its_candidates_and_the_executed_one_and_silent_groups_are_counted():
    # the user's three candidates all scored -0.1: a silent group (zero advantages); the planner's differ
    assert silent_groups(TREE) == {("user", 0): 1}
    # drmas's groups (task, agent) span turns: a silent one counts at each of its turns
    drmas = [{**record("a", turn, 1.0, traj=f"t1#{turn}"), "group": "a"} for turn in (0, 1)]
    drmas += [{**record("b", 0, 0.0, traj="t1#0", advantage=-0.7), "group": "b"},
              {**record("b", 0, 1.0, traj="t1#1", advantage=0.7), "group": "b"}]
    assert silent_groups(drmas) == {("a", 0): 1, ("a", 1): 1}
    # an estimator that names no group: one agent's samples of one task at one turn, by their rewards
    unnamed = [{**record(a, 0, reward, traj=f"t1#{j}"), "group": None}
               for a, rewards in (("a", (1.0, 1.0)), ("b", (0.0, 1.0))) for j, reward in enumerate(rewards)]
    assert silent_groups(unnamed) == {("a", 0): 1}
    page = render([("train", 1, TREE)], "run")
    assert page.count("class=node ") == 2 and page.count(": 3 candidates") == 2
    assert page.count('class="sample chosen"') == 2 and page.count('class="sample"') == 4
    assert page.count("not executed") == 4
    assert "silent groups (all rewards equal, so no advantage): <span class=silent-count>user turn 0: 1" \
        in page
    assert "&lt;p&gt;rompt" in page and "<p>rompt" not in page  # text is escaped, never markup
    assert "http" not in page  # nothing fetched: the page is whole


def test_the_command_reads_a_runs_folder_in_order_and_names_a_missing_one(tmp_path, capsys):
    for split, k in [("val", 0), ("train", 1), ("val", 1), ("train", 2)]:
        path = episodes_path(str(tmp_path), split, k)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_bytes(path, gzip.compress("\n".join(json.dumps(r) for r in TREE).encode()))
    order = [("val", 0), ("train", 1), ("val", 1), ("train", 2)]
    assert [(s, k) for s, k, _ in load_run(str(tmp_path))] == order
    assert [(s, k) for s, k, _ in load_run(str(tmp_path), [1])] == [("train", 1), ("val", 1)]
    out = main([str(tmp_path)])
    assert out == str(tmp_path / "episodes.html")
    assert "24 samples of 4 iteration(s)" in capsys.readouterr().out
    page = open(out).read()
    assert "validation before training" in page and "validation after iteration 1" in page
    with pytest.raises(FileNotFoundError, match=r"no episodes under .*nothing"):
        load_run(str(tmp_path / "nothing"))


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
except ImportError:
    webdriver = None
BROWSER = CHROMIUM and DRIVER and webdriver
NO_BROWSER = ("no headless Chromium to drive: `apt-get install chromium chromium-driver` (scripts/setup.sh "
              "--dev does it as root on Debian) and `pip install selenium` (the dev extra)")


@contextlib.contextmanager
def browser():
    """Headless Chromium, driven through Debian's chromedriver (nothing downloaded)."""
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=900,700"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def shown(driver, page=None, fragment=""):
    """The samples the page says it shows, once it is open (``page``) with a filter in its address."""
    if page is not None:
        driver.get(f"file://{os.path.abspath(page)}{fragment}")
    return int(driver.find_element(By.ID, "shown").text)


def visible(driver, css):
    return sum(e.is_displayed() for e in driver.find_elements(By.CSS_SELECTOR, css))


@pytest.mark.integration  # a browser process
@pytest.mark.skipif(not BROWSER, reason=NO_BROWSER)
def test_the_page_filters_in_a_browser(tmp_path):
    page = tmp_path / "page.html"
    page.write_text(render([("train", 1, TREE + [CALL])], "run"))
    with browser() as b:
        assert shown(b, page) == 7
        # what a person does: pick an agent, type a reward bound, clear them
        Select(b.find_element(By.ID, "agent")).select_by_visible_text("user")
        assert shown(b) == 3 and visible(b, "details.sample") == 3
        Select(b.find_element(By.ID, "agent")).select_by_index(0)  # all
        b.find_element(By.ID, "rmin").send_keys("0.4")
        assert shown(b) == 3  # the planner's 0.5 and 0.9, the coder's 0.75
        assert b.current_url.endswith("#rmin=0.4")  # the filter is in the address, to share
        b.find_element(By.ID, "rmin").clear()
        b.find_element(By.ID, "task").send_keys("t2")
        assert shown(b) == 1 and visible(b, "details.task") == 1  # the one task followed
        # an address with a filter opens filtered
        assert shown(b, page, "#task=t1&agent=planner") == 3
        # the coder's tokens shaded by the trainer-vs-engine gap, its messages and tool call shown
        assert shown(b, page, "#task=t2") == 1
        b.find_element(By.CSS_SELECTOR, '[data-task="t2"] details.sample summary').click()
        spans = b.find_elements(By.CSS_SELECTOR, ".tokens span")
        assert [e.text for e in spans] == ["def", " f"]
        assert [e.get_attribute("title") for e in spans] == ["-0.2500", "+0.0500"]
        assert [e.text for e in b.find_elements(By.CSS_SELECTOR, ".message b")] == ["system", "user"]
        assert '"name": "run_tests"' in b.find_element(By.CSS_SELECTOR, ".tool-call").text
        # and a picture of it, kept beside the test's files (docs/img/episodes_page.png is the main job's)
        shot = tmp_path / "page.png"
        b.save_screenshot(str(shot))
    from PIL import Image

    with Image.open(shot) as image:
        assert image.width == 900 and image.convert("L").getextrema()[0] < 200  # not blank: the text is dark
