"""What a user reads: a tiny-random run prints drmas's own lines only (the precision, one line per
policy, the summary); ``--verbose`` brings the third-party notes back."""

import pytest
from forked import run_script
from recipe_runs import ROOT, TINY

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own


def run(tmp, *args):
    argv = [str(ROOT / "recipes" / "math_team.py"), "fit", *TINY,
            "--trainer.logger.init_args.save_dir", str(tmp / "runs"),
            "--model.engine", "hf", "--trainer.max_epochs", "1", "--data.validation.tasks", "1", *args]
    proc = run_script(argv, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (proc.stdout + proc.stderr).splitlines()


def test_the_console_shows_drmas_lines_only_unless_verbose(tmp_path):
    lines = run(tmp_path)
    assert (lines[0].startswith("precision: ")
            and lines[1].startswith("policy shared: tiny-random, 3.2M parameters"))
    noise = [line for line in lines if any(s in line for s in (
        "Warning", "warn", "GPU available", "Tip", "FLOPs", "Seed set", "Loading weights", "Trainer.fit",
        "%|"))]
    assert noise == []
    # measured: 23 lines (2 at start, one per iteration (stdout is a pipe here), the summary of 3
    # paths, the agent table and 10 val lines, the HF export and the grad-norm plot)
    assert sum(line.startswith("iteration 1/1 | ") for line in lines) == 1
    assert len(lines) <= 25, "\n".join(lines)
    verbose = run(tmp_path, "--verbose")
    assert any("GPU available" in line for line in verbose) and len(verbose) > len(lines)
