"""``validate`` and ``test`` as users run them: on a fit checkpoint (greedy sampling reproduces
the run's final validation, and the trained policy's greedy answers, not the untrained one's) and
on a run's HF export; the JSON and markdown written."""

import json
import os

import pytest
from forked import run_script
from recipe_runs import ROOT, TINY, run_dir, run_recipe, scalars

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

GREEDY = ["--model.engine", "hf", "--model.policies.shared.generation.eval.temperature", "0",
          "--data.validation.tasks", "2"]


def evaluate(tmp, subcommand, *args):
    argv = [str(ROOT / "recipes" / "math_team.py"), subcommand, *TINY,
            "--trainer.logger.init_args.save_dir", str(tmp / "runs"), *GREEDY, *args]
    proc = run_script(argv, cwd=tmp, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def read_record(tmp, split):
    return json.loads(open(os.path.join(run_dir(tmp), f"eval_{split}.json")).read())


def test_validate_a_checkpoint_and_test_an_hf_export(tmp_path):
    # a learning rate that changes the random model's greedy answers in one step
    run_recipe("math", tmp_path, *GREEDY, "--model.loss.entropy_coef", "0.01", "--trainer.max_epochs", "1",
               "--model.policies.shared.optim.lr", "0.05")
    fit_dir = run_dir(tmp_path)
    final = {tag: points[1] for tag, points in scalars(fit_dir).items() if tag.startswith("val/")}
    proc = evaluate(tmp_path, "validate", "--ckpt_path", os.path.join(fit_dir, "checkpoints", "last.ckpt"))
    out = run_dir(tmp_path)
    record = json.loads(open(os.path.join(out, "eval_val.json")).read())
    assert record["iteration"] == 1 and record["split"] == "val" and record["tasks"] == 2
    assert record["scalars"] == pytest.approx(final)  # every val/ scalar of the fit's last validation
    assert "| arithmetic |" in open(os.path.join(out, "eval_val.md")).read() and "| solver |" in proc.stdout
    # the checkpoint's weights answered: the same greedy text as its HF export, not the untrained model's
    export = os.path.join(fit_dir, "hf", "iter_1", "shared")
    evaluate(tmp_path, "validate", "--model.policies.shared.model", export)
    assert read_record(tmp_path, "val")["examples"] == record["examples"]
    evaluate(tmp_path, "validate")
    untrained = read_record(tmp_path, "val")["examples"]
    assert set(untrained) == {"solver", "verifier"} and untrained["solver"] != record["examples"]["solver"]

    evaluate(tmp_path, "test", "--model.policies.shared.model", export)
    record = json.loads(open(os.path.join(run_dir(tmp_path), "eval_test.json")).read())
    assert record["split"] == "test" and record["ckpt_path"] is None
    assert ({"test/avg@2", "test/pass@2", "test/success_rate", "test/turns_mean", "test/solver/valid_ratio"}
            <= set(record["scalars"]))
