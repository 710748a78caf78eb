"""The first-minute pass (``--model.preflight``) on a real run of the search recipe: a weight
transfer whose engine process alters one tensor as it arrives (faulty.py's ``corrupt_transfer``)
ends the run before the validation before training, naming the tensor, the policy and the rank, on
the vLLM engine and on the HF engine in its process. The clean pass on two ranks of sharded
policies (the sums added up over the shards) runs in test_fsdp_recipes.py."""

import os
import re

import pytest
from forked import run_script
from recipe_runs import ROOT, TINY

from corrupt_engine import TENSOR

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

FAULTY = os.path.join(os.path.dirname(__file__), "faulty.py")


def corrupted(tmp, *args):
    argv = [FAULTY, "corrupt_transfer", "0", str(ROOT / "recipes" / "search.py"), "fit", *TINY,
            "--trainer.logger.init_args.save_dir", str(tmp / "runs"), "--model.preflight", "true", *args]
    return run_script(argv, cwd=tmp, env={**os.environ, "TMPDIR": str(tmp)})


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_a_corrupted_weight_transfer_ends_the_run_in_its_first_minute_naming_the_tensor(tmp_path, engine):
    # the HF engine receives weights only in a process of its own: rollouts behind the update
    args = ["--model.engine", engine] + (["--data.rollout.staleness", "1"] if engine == "hf" else [])
    proc = corrupted(tmp_path, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    line = (rf"error: first-minute pass: the weight transfer's check failed on rank 0 for policy shared: "
            rf"{re.escape(TENSOR)} arrived with sum \S+ and sum of squares \S+, sent \S+ and \S+ \(")
    assert re.search(line, out, re.M), out[-4000:]
    # in its first minute: nothing validated, trained or checkpointed, no traceback
    assert "Traceback" not in out and "iteration 1" not in out
    assert "val/" not in out and "no checkpoint was written yet" in out
    assert not list((tmp_path / "runs").rglob("last.ckpt"))
