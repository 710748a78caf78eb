"""The documented entry points: the README's commands and the example they run."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    return re.findall(r"```bash\n#[^\n]*\n([^\n]+)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readmes_second_command():
    commands = _readme_commands()
    assert len(commands) >= 2
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [commands[1]]


@pytest.mark.integration  # the example trains in a process of its own
def test_the_example_runs_and_drmas_centres_each_agent():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/agentwise_gradients.py"), "--model", "tiny-random",
         "--group", "4"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines()
            if line.startswith(("grpo_step ", "drmas "))}
    assert set(rows) == {(e, a) for e in ("grpo_step", "drmas") for a in ("judge", "picker")}
    for agent in ("judge", "picker"):
        reward_mean, _, adv_mean, _, grad_norm = map(float, rows[("drmas", agent)])
        assert abs(adv_mean) < 1e-3
        assert grad_norm >= 0
