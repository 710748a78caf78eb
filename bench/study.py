"""Studies that outlive a session: each run is one recipe process with its own log folder under
the study's output folder, and a second call of the study with the same folder continues it.

A run's state is read from its folder, nothing else:

- finished: ``run.json`` says so (written when the process exits 0): its events are read back
  (its resume checkpoint is deleted then; the final weights stay in its ``hf/`` folder);
- started: ``run.json`` without ``finished``: the run continues from its last checkpoint
  (``--ckpt_path last``; the checkpoint is written atomically after every iteration, so a run
  killed anywhere loses at most the iteration in flight); without a checkpoint (it stayed on
  another machine) its partial logs are removed and it starts again;
- new: no ``run.json``: it starts.

One process runs a run at a time (``held``: a lock file beside its folder); a second study of the
same folder stops at that run with the holder's pid.

``run.json`` records the machine and the precision a run started with; the run is always
continued in that precision, and where this machine's default differs (a run started where bf16
is native, continued where it is emulated) the study stops with the reason rather than mix two
precisions in one curve. Every run logs to ``version_0`` of its folder, whichever call wrote it.
A finished run's folder, less its weights (``hf/``), is a few MB: kept in git (``bench/results/``),
it carries the study from one machine to the next.

The first run trained in a call measures its iterations from its checkpoint's writes and the
study prints its expected wall time before going on; each run prints one line per iteration.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from drmas.atomic import write_text  # noqa: E402
from drmas.checkout import recipe_script  # noqa: E402

__all__ = ["Run", "Study", "StudyStopped", "finish_panel"]


class StudyStopped(Exception):
    """A run cannot go on here (another precision, or its process failed); the message says why."""


@dataclass
class Run:
    """One recipe process of a study: ``recipes/<recipe>.py fit <args>`` logging to ``logs``."""

    name: str
    recipe: str
    args: list[str]
    logs: str
    iterations: int
    validations: int = 2
    """How many times the run validates (before training, then every val_every and at the end)."""
    precision: str | None = None
    """``--trainer.precision`` pinned for every machine (e.g. ``32-true``: a study that continues on
    any CPU kind); None: the default of the machine the run starts on."""

    @property
    def run_dir(self) -> str:
        return os.path.join(self.logs, self.recipe, "version_0")

    @property
    def record(self) -> dict:
        path = os.path.join(self.logs, "run.json")
        return json.load(open(path)) if os.path.exists(path) else {}

    @property
    def finished(self) -> bool:
        return bool(self.record.get("finished"))

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.run_dir, "checkpoints", "last.ckpt")

    def done_iterations(self) -> int:
        """Iterations in its last checkpoint (0 before the first; all of them once finished)."""
        if self.finished:
            return self.iterations
        if not os.path.exists(self.checkpoint):
            return 0
        import torch

        state = torch.load(self.checkpoint, map_location="cpu", weights_only=True, mmap=True)
        return int(state["drmas"]["iteration"])


@contextmanager
def held(run: Run):
    """One process at a time per run, through a lock file beside its folder: a second study of the
    same folder (another terminal, or a study asked again while one runs) would remove its logs as
    those of a run without a checkpoint, or run it twice into them."""
    os.makedirs(os.path.dirname(os.path.abspath(run.logs)), exist_ok=True)
    with open(os.path.abspath(run.logs) + ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise StudyStopped(f"{run.name} is being run by another process ({f.read().strip()}); let it "
                               "finish or stop it before running this study again") from None
        f.truncate(0)
        f.write(f"pid {os.getpid()}")
        f.flush()
        yield  # the lock ends with the file's closing, or with the process


@dataclass
class Study:
    """Runs to bring to their end, one after another, with progress and an expected wall time."""

    runs: list[Run]
    per_iteration_s: float | None = None
    first_iteration_s: float | None = None
    _started: float = field(default_factory=time.perf_counter)

    def run_all(self) -> list[Run]:
        """Bring every run to its end; the finished ones are returned in order."""
        left = [r for r in self.runs if not r.finished]
        print(f"{len(self.runs) - len(left)} of {len(self.runs)} runs finished before; {len(left)} to run",
              flush=True)
        for n, run in enumerate(left):
            done = run.done_iterations()
            what = f"continuing after iteration {done}" if done else "starting"
            minutes = (time.perf_counter() - self._started) / 60
            print(f"[{n + 1}/{len(left)}] {run.name}: {what} ({minutes:.1f} min so far)", flush=True)
            with held(run):
                self._run(run, left[n:], done)
        return self.runs

    def expected_s(self, runs: list[Run]) -> float:
        """Seconds the ``runs`` still need at the measured pace: each iteration, plus each
        validation left (the first iteration's extra time: loading and one validation)."""
        assert self.per_iteration_s is not None and self.first_iteration_s is not None
        validation = max(0.0, self.first_iteration_s - self.per_iteration_s)
        total = 0.0
        for r in runs:
            done = r.done_iterations()
            left_vals = r.validations * (r.iterations - done) / r.iterations
            total += (r.iterations - done) * self.per_iteration_s + left_vals * validation
        return total

    def _run(self, run: Run, rest: list[Run], done: int) -> None:
        from drmas.hardware import default_precision, machine

        if run.record and not os.path.exists(run.checkpoint):
            # started, but its checkpoint is gone (lost with the machine it ran on, or it died
            # before the first iteration): its partial logs would mix into the new run's curves
            print(f"    {run.name}: started on {run.record.get('machine')} without a checkpoint here; "
                  f"starting it again", flush=True)
            shutil.rmtree(run.logs)
        os.makedirs(run.logs, exist_ok=True)
        record = run.record
        here = run.precision or default_precision()
        if not record:
            record = {"name": run.name, "machine": machine(), "precision": here, "args": run.args,
                      "started": time.strftime("%Y-%m-%d %H:%M:%S")}
            write_text(os.path.join(run.logs, "run.json"), json.dumps(record, indent=2) + "\n")
        elif record["precision"] != here:
            raise StudyStopped(
                f"{run.name} started in {record['precision']} on {record['machine']}; "
                f"this run now asks for {here} ({machine()}). "
                "Continuing it here would put two precisions in one curve: continue the "
                f"study on a machine like the first, or delete {run.logs} to run it again here.")
        cmd = [sys.executable, recipe_script(run.recipe), "fit", *run.args,
               "--trainer.precision", record["precision"], "--trainer.max_epochs", str(run.iterations),
               "--trainer.logger.init_args.save_dir", run.logs, "--trainer.logger.init_args.version", "0",
               "--ckpt_path", "last", "--data.rollout.progress", "false"]
        logs = os.path.join(run.logs, "stdout.log"), os.path.join(run.logs, "stderr.log")
        with open(logs[0], "a") as out, open(logs[1], "a") as err:
            proc = subprocess.Popen(cmd, cwd=run.logs, stdout=out, stderr=err)
            self._watch(proc, run, done, rest)
        if proc.returncode != 0:
            tail = open(os.path.join(run.logs, "stderr.log")).read()[-3000:]
            raise StudyStopped(f"{run.name} failed (exit {proc.returncode}); its logs: {run.logs}\n{tail}")
        record.update(finished=time.strftime("%Y-%m-%d %H:%M:%S"))
        write_text(os.path.join(run.logs, "run.json"), json.dumps(record, indent=2) + "\n")
        # its weights stay in hf/; the optimiser's state is not needed again
        if os.path.isfile(run.checkpoint):
            os.remove(run.checkpoint)

    def _watch(self, proc: subprocess.Popen, run: Run, done: int, rest: list[Run]) -> None:
        """Until the process ends: a line per iteration (seen as a rewrite of its checkpoint);
        after the first two, the expected wall time of what is left, once per study call."""
        start = last = time.perf_counter()
        seen = os.stat(run.checkpoint).st_mtime if os.path.exists(run.checkpoint) else None
        while proc.poll() is None:
            time.sleep(2.0)
            mtime = os.stat(run.checkpoint).st_mtime if os.path.exists(run.checkpoint) else None
            if mtime is None or mtime == seen:
                continue
            seen, now = mtime, time.perf_counter()
            done += 1
            if self.first_iteration_s is None:
                self.first_iteration_s = now - start
            elif self.per_iteration_s is None:
                self.per_iteration_s = now - last
                left = self.expected_s(rest)
                print(f"    measured: {self.first_iteration_s:.0f} s for the first iteration (loading and a "
                      f"validation), {self.per_iteration_s:.0f} s for the next; expected wall time of the "
                      f"{len(rest)} run(s) left: {left / 3600:.1f} h", flush=True)
            print(f"    {run.name}: iteration {done}/{run.iterations} ({now - last:.0f} s)", flush=True)
            last = now
        # the last iterations can end between two looks (a fast run): a finished run did them all
        mtime = os.stat(run.checkpoint).st_mtime if os.path.exists(run.checkpoint) else None
        final = run.iterations if proc.returncode == 0 else done + (mtime is not None and mtime != seen)
        if final > done:
            print(f"    {run.name}: iteration {final}/{run.iterations} "
                  f"({time.perf_counter() - last:.0f} s)", flush=True)


def finish_panel(ax, title: str, ylabel: str | None = None) -> None:
    """A study's plot panel: its title, the RL iterations on x, a light grid and the legend."""
    ax.set_title(title)
    ax.set_xlabel("RL iteration")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
