"""A configuration that cannot work, run as a user would: one ``error:`` line naming the value
and what is accepted, exit code 2, no traceback (``DRMAS_DEBUG=1`` shows it)."""

import os

import pytest
from forked import run_script
from recipe_runs import ROOT, TINY

from drmas.checkout import recipe_script

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

MISTAKES = {
    "unknown estimator": ("math", ["--data.rollout.estimator",
                                   "grpoo"], "unknown estimator 'grpoo'; known: "),
    "unknown game": ("games", ["--data.workflow.init_args.game", "chess"],
                     "game must be one of ['plan_path', 'sokoban', 'sudoku'], got 'chess'"),
    "settings that cannot work together": ("math", ["--data.rollout.sampling", "tree"],
                                           "does not support sampling='tree'; it supports: parallel"),
    "a missing file": ("math", ["--data.workflow.init_args.train_file", "nowhere.jsonl"],
                       "train data 'nowhere.jsonl': no such file"),
    "an agent without a policy": ("math",
                                  ["--model.policies", "{a: {model: tiny-random}, b: {model: tiny-random}}"],
                                  "agent 'solver' has no policy: set --model.agents"),
    "a misspelt key": ("math", ["--data.grup_size", "2"], "grup_size"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_configuration_mistake_is_one_error_line(mistake, tmp_path):
    recipe, args, expected = MISTAKES[mistake]
    argv = [recipe_script(recipe), "fit", *TINY, "--trainer.logger.init_args.save_dir",
            str(tmp_path / "runs"), "--model.engine", "hf", *args]
    proc = run_script(argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_drmas_debug_shows_the_traceback(tmp_path):
    argv = [str(ROOT / "recipes" / "games.py"), "fit", *TINY, "--trainer.logger.init_args.save_dir",
            str(tmp_path / "runs"), "--data.workflow.init_args.game", "chess"]
    proc = run_script(argv, cwd=tmp_path, env={**os.environ, "DRMAS_DEBUG": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "got 'chess'" in proc.stderr
