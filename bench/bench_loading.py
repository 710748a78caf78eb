"""Peak host memory per rank while a sharded (FSDP) run builds its policies: every rank loading the
whole model and then sharding it (how drmas loaded before), against the meta device plus each
rank reading only its rows (``drmas.modules.policy.deferred_weights``), in the same run.

Each way starts 2 CPU ranks (gloo) that build the module, shard it (Lightning's
``configure_model``) and stop before any training; each rank reports its peak resident memory
(``VmHWM``) once every weight is in place (before the model checks' forward passes, which on a
sharded model all-gather each layer as training does), and its resident memory once the module
is built and once it is sharded. A fresh interpreter per way, so one
way's peak is not the other's.

    python bench/bench_loading.py [--model embedded:smollm2-135m-instruct] [--kl 0.05] [--devices 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def memory_mib(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (the peak) of this process's own address space;
    ``ru_maxrss`` would carry the launching rank's peak over ``exec`` into the ranks it starts."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


def one_way(args: argparse.Namespace) -> None:
    """A rank of one way (this script again, under Lightning's launcher)."""
    import lightning as L

    from drmas.algorithms import LossConfig
    from drmas.modules import MultiAgentRL, PolicyConfig
    from drmas.modules.policy import Policy, deferred_weights
    from drmas.modules.sharding import FSDP

    before = memory_mib("VmHWM")  # imports only
    # the peak once the weights are in place, before the checks of what the model allows run a
    # few forward passes (on a sharded model those all-gather every layer, as training will)
    loaded: list[float] = []
    check = Policy._check_model
    Policy._check_model = lambda self: (loaded.append(memory_mib("VmHWM")), check(self))[1]

    class Stop(L.Callback):
        def on_fit_start(self, trainer, module):  # after configure_model: sharded and loaded
            with open(os.path.join(args.out, f"rank{trainer.global_rank}.json"), "w") as f:
                json.dump({"peak_mib": max(loaded), "imports_mib": before, "built_mib": built,
                           "sharded_mib": memory_mib("VmRSS"), "read": module.weights_read}, f)
            trainer.strategy.barrier()
            os._exit(0)

    with deferred_weights(args.way == "deferred"):
        module = MultiAgentRL(policies={"p": PolicyConfig(model=args.model)}, engine="hf",
                              loss=LossConfig(kl_coef=args.kl))
    built = memory_mib("VmRSS")
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy=FSDP(), max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Stop()])
    trainer.fit(module, train_dataloaders=[[0]])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded:smollm2-135m-instruct")
    p.add_argument("--kl", type=float, default=0.05, help="kl_coef: > 0 adds the frozen reference copy")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--way", choices=("whole", "deferred"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.way:
        return one_way(args)
    from drmas.models import resolve_model_path

    resolve_model_path(args.model)  # converted once, outside the measurement
    results = {}
    for way in ("whole", "deferred"):
        out = tempfile.mkdtemp(prefix=f"drmas-loading-{way}-")
        cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--kl", str(args.kl),
               "--devices", str(args.devices), "--way", way, "--out", out]
        subprocess.run(cmd, check=True, cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results[way] = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(args.devices)]
    print(f"{args.model}, kl_coef {args.kl}, {args.devices} CPU ranks (gloo); MiB per rank")
    print(f"{'way':10s} {'rank':>4s} {'peak':>8s} {'imports':>8s} {'built':>8s} {'sharded':>8s}  read")
    for way, ranks in results.items():
        for r, x in enumerate(ranks):
            print(f"{way:10s} {r:4d} {x['peak_mib']:8.0f} {x['imports_mib']:8.0f} {x['built_mib']:8.0f} "
                  f"{x['sharded_mib']:8.0f}  "
                  f"{x['read'].get('p', 'whole model on every rank')}")
    for r in range(args.devices):
        whole, late = results["whole"][r], results["deferred"][r]
        print(f"rank {r}: peak {late['peak_mib'] / whole['peak_mib']:.2f}x; above the imports "
              f"{(late['peak_mib'] - late['imports_mib']) / (whole['peak_mib'] - whole['imports_mib']):.2f}x")


if __name__ == "__main__":
    main()
