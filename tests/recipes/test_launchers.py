"""Two gloo ranks started by a launcher other than Lightning's: by hand, as srun starts them (no
observer kills the other ranks when one dies), and by torchrun with restarts. A rank killed without
a word is named by the others from its stopped heartbeat; a torchrun restart starts clean (the
store outlives an attempt, so every key drmas and torch keep there is under the attempt's prefix)
and resumes from the last whole iteration."""

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
from recipe_runs import ROOT, TINY, run_dir, scalars
from test_fsdp_faults import FSDP, exit_lines, exits, saved_iteration
from test_resume import FAULTY

pytestmark = pytest.mark.integration  # two ranks in processes of their own

RUN = [*FSDP, "--trainer.max_epochs", "3"]


def _args(tmp, *extra: str) -> list[str]:
    return [str(ROOT / "recipes" / "search.py"), "fit", *TINY, "--trainer.logger.init_args.save_dir",
            str(tmp / "runs"), *RUN, *extra]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _by_hand(tmp, fault: str, *extra: str, env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Both ranks as srun starts them: each its own process with its rank in the environment."""
    port, procs = _free_port(), []
    for rank in (0, 1):
        ranked = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                  "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0",
                  "TMPDIR": str(tmp), **(env or {})}
        procs.append(subprocess.Popen([sys.executable, FAULTY, fault, "2", *_args(tmp, *extra)], cwd=tmp,
                                      env=ranked, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def test_a_rank_killed_without_a_word_is_named_and_the_run_resumes(tmp_path):
    (tmp_path / "exits").mkdir()
    ranks = _by_hand(tmp_path, "kill_update", env={"FAULT_RANK": "1", "FAULT_EXITS": str(tmp_path / "exits")})
    assert ranks[1].returncode == -9
    assert ranks[0].returncode == 1, ranks[0].stderr[-4000:]
    line = exit_lines(tmp_path / "exits", ranks=1)[0]
    assert re.match(r"drmas: rank 1 died during iteration 2 without a word \(no heartbeat: killed, out of "
                    r"memory or crashed; .*\); rank 0 stopped in ", line), line
    assert saved_iteration(os.path.join(run_dir(tmp_path), "checkpoints", "last.ckpt")) == 1
    again = _by_hand(tmp_path, "none", "--ckpt_path", "last")
    assert [r.returncode for r in again] == [0, 0], again[0].stderr[-4000:] + again[1].stderr[-4000:]
    assert sorted(scalars(run_dir(tmp_path))["rollout/success_rate"]) == [2, 3]  # from iteration 1 on
    assert saved_iteration(os.path.join(run_dir(tmp_path), "checkpoints", "last.ckpt")) == 3


@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
                    reason="torchrun is not installed beside this interpreter")
def test_a_torchrun_restart_resumes_and_finishes(tmp_path):
    """Rank 1's optimiser step raises in the first attempt only: the first attempt ends as designed
    (one line naming rank 1), torchrun starts a second one, which resumes from iteration 1 and
    finishes. Without the attempt's prefix the second attempt's gloo mesh dialled the first one's
    dead ranks ("Connection refused"), and its ranks read the first attempt's failure line."""
    (tmp_path / "exits").mkdir()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "TMPDIR": str(tmp_path), "FAULT_RANK": "1", "FAULT_ATTEMPT": "0",
           "FAULT_EXITS": str(tmp_path / "exits")}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", FAULTY,
                           "step_error", "2", *_args(tmp_path, "--ckpt_path", "last")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    # the first attempt: the ranks ended (exit 1), naming rank 1. torchrun has returned, so the
    # records are final (no wait): the agent SIGTERMs the ranks left once one exits, so under load
    # rank 1, still waiting for its line to be read, may be stopped before it records its exit
    ended = exits(tmp_path / "exits", wait=0)
    assert 0 in ended and {code for code, _ in ended.values()} == {1}
    failed = (r"drmas: rank 1 failed during iteration 2( in the optimiser step of policy shared)?: "
              r"RuntimeError: CUDA out of memory")
    assert all(re.match(failed, line) for line in exit_lines(tmp_path / "exits", wait=0).values())
    # the second: resumed from iteration 1, played 2 and 3
    assert "--ckpt_path last: resuming from" in proc.stdout + proc.stderr
    assert saved_iteration(os.path.join(run_dir(tmp_path), "checkpoints", "last.ckpt")) == 3
    assert sorted(scalars(run_dir(tmp_path))["rollout/success_rate"]) == [2, 3]
