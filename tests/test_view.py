"""The episodes page (``python -m drmas.view``): a tree node's candidates with the executed one
marked, silent groups counted per agent and turn, and the filters, on hand-made records; the pages
of real runs are read in headless Chromium in tests/recipes/test_search_recipe.py."""

import gzip
import json
import os
import re
import shutil
import subprocess

import pytest

from drmas.atomic import write_bytes
from drmas.data.episodes import episodes_path
from drmas.view import load_run, main, render, silent_groups


def record(agent, turn, reward, candidate=0, chosen=True, task="t1", traj="t1#tree"):
    return {"split": "train", "iteration": 1, "task": task, "source": "src", "trajectory": traj,
            "agent": agent, "policy": "shared", "turn": turn, "candidate": candidate, "chosen": chosen,
            "prompt": "<p>rompt", "response": f"{agent} says {reward}", "prompt_tokens": 3,
            "response_tokens": 2, "valid": True, "team_reward": 0.0, "local_reward": reward,
            "role_reward": reward, "failure": None, "reward": reward, "advantage": 0.0, "version": 0,
            "episode_success": False, "episode_team_reward": 0.0, "info": {}}


TREE = [record("planner", 0, 0.5, 0, False), record("planner", 0, 0.9, 1, True),
        record("planner", 0, 0.1, 2, False), record("user", 0, -0.1, 0, True),
        record("user", 0, -0.1, 1, False), record("user", 0, -0.1, 2, False)]


def test_a_tree_node_shows_its_candidates_and_the_executed_one_and_silent_groups_are_counted():
    # the user's three candidates all scored -0.1: a silent group (zero advantages); the planner's differ
    assert silent_groups(TREE) == {("user", 0): 1}
    # parallel samples (one candidate per step) group by task, agent and turn
    parallel = [record("a", 0, 1.0, traj="t1#0"), record("a", 0, 1.0, traj="t1#1"),
                record("b", 0, 0.0, traj="t1#0"), record("b", 0, 1.0, traj="t1#1")]
    assert silent_groups(parallel) == {("a", 0): 1}
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
NO_CHROMIUM = ("no Chromium: `apt-get install chromium chromium-driver` (scripts/setup.sh --dev does it "
               "as root on Debian)")


def rendered(page, fragment=""):
    """The page's DOM after its script ran, as headless Chromium holds it."""
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
            f"file://{os.path.abspath(page)}{fragment}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout


def shown(dom):
    return int(re.search(r'<span id="shown">(\d+)</span>', dom)[1])


@pytest.mark.integration  # a browser process per page read
@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_page_filters_in_a_browser(tmp_path):
    page = tmp_path / "page.html"
    page.write_text(render([("train", 1, TREE)], "run"))
    assert shown(rendered(page)) == 6
    assert shown(rendered(page, "#agent=user")) == 3
    assert shown(rendered(page, "#rmin=0.4")) == 2  # the planner's 0.5 and 0.9
    assert shown(rendered(page, "#task=t1&agent=planner")) == 3 and shown(rendered(page, "#task=t2")) == 0
    # and a picture of it, kept beside the test's files (docs/img/episodes_page.png is the main job's)
    shot = tmp_path / "page.png"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
            "--window-size=900,700", f"file://{page}#agent=planner"]
    subprocess.run(argv, capture_output=True, timeout=120)
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (900, 700) and len(set(image.convert("L").getdata())) > 2  # not blank
