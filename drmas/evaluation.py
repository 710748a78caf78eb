"""``python recipes/<recipe>.py validate`` and ``test``: evaluate the configured policies, or a
checkpoint, on the val or test split, and write the numbers beside the logs.

The policies are what the config says (``--model.policies.<p>.model`` may name the HF export of
a run, ``hf/iter_<k>/<policy>``), with a Lightning checkpoint of ``fit`` (``--ckpt_path``)
loaded over them. Each policy samples with its ``generation.eval``. Written to the run's log dir:
``eval_<split>.json`` (every scalar) and ``eval_<split>.md`` (a table per source).
"""

from __future__ import annotations

import json
import os
import pickle
from typing import Any

import torch

from drmas.atomic import write_text

__all__ = ["evaluate", "format_table", "load_weights"]


def load_weights(module: Any, ckpt_path: str) -> int:
    """Load a ``fit`` checkpoint's weights into ``module``; returns the iteration it was written at."""
    if os.path.isdir(ckpt_path):
        raise ValueError(f"{ckpt_path} is a sharded (FSDP) checkpoint: evaluate the run's HF export instead "
                         f"(--model.policies.<policy>.model <run>/hf/iter_<k>/<policy>)")
    if not os.path.isfile(ckpt_path):
        raise FileNotFoundError(f"no checkpoint at {ckpt_path}")
    try:  # tensors and plain values only: a checkpoint from elsewhere runs no code when read
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{ckpt_path} holds more than tensors and plain values, which drmas does not "
                         f"unpickle (it could run code): {str(err).splitlines()[0][:300]}") from None
    if "drmas" not in ckpt:
        raise ValueError(f"{ckpt_path} was not written by drmas (recipes/<recipe>.py fit)")
    module.load_state_dict(ckpt["state_dict"])
    for name, version in ckpt["drmas"]["versions"].items():
        module.policies[name].version = version  # the engines re-sync from these weights
    return int(ckpt["drmas"]["iteration"])


def evaluate(module: Any, datamodule: Any, split: str, ckpt_path: str | None,
             out_dir: str | None) -> dict[str, float]:
    """Play the split's evaluation tasks with each policy's eval generation settings; write and return
    the scalars."""
    iteration = load_weights(module, ckpt_path) if ckpt_path else 0
    module.to(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    module.eval()
    rollouts = datamodule.rollouts
    rollouts.bind(module)
    scalars = rollouts.validate_all(module, split, datamodule.validation.swap_probe)
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        record = {"split": split, "ckpt_path": ckpt_path, "iteration": iteration, "k": rollouts.validation.k,
                  "tasks": len(rollouts.val_task_list(split)), "scalars": scalars,
                  "examples": examples(rollouts.last_validation)}
        write_text(os.path.join(out_dir, f"eval_{split}.json"), json.dumps(record, indent=2) + "\n")
        write_text(os.path.join(out_dir, f"eval_{split}.md"),
                   format_table(scalars, rollouts.validation.k) + "\n")
    return scalars


def examples(result: Any) -> dict[str, str]:
    """Each agent's first completion of the evaluation (its first task's first episode): what
    the policy says, to read beside the numbers."""
    out: dict[str, str] = {}
    for s in result.samples if result is not None else ():
        out.setdefault(s.agent, s.text)
    return out


def format_table(scalars: dict[str, float], k: int) -> str:
    """One row per source (and ``all``): avg@k, pass@k, success rate, turns; then one row per agent."""
    tops = sorted({key.split("/")[0] for key in scalars})
    lines = []
    for top in tops:
        sources = sorted({key.split("/")[1] for key in scalars if key.startswith(f"{top}/") and
                          f"{top}/{key.split('/')[1]}/avg@{k}" in scalars})
        lines += [f"### {top}", "", f"| source | avg@{k} | pass@{k} |", "|---|---|---|"]
        for source, prefix in [("all", top)] + [(s, f"{top}/{s}") for s in sources]:
            lines.append(f"| {source} | {scalars[f'{prefix}/avg@{k}']:.3f} | "
                         f"{scalars[f'{prefix}/pass@{k}']:.3f} |")
        lines += ["", f"success rate {scalars[f'{top}/success_rate']:.3f}, "
                      f"turns {scalars[f'{top}/turns_mean']:.2f}", ""]
        agents = sorted({key.split("/")[1] for key in scalars
                         if key.startswith(f"{top}/") and key.endswith("/valid_ratio")})
        if agents:
            lines += ["| agent | reward | valid |", "|---|---|---|"]
            lines += [f"| {a} | {scalars[f'{top}/{a}/reward_mean']:.3f} | "
                      f"{scalars[f'{top}/{a}/valid_ratio']:.2f} |" for a in agents]
            lines.append("")
    return "\n".join(lines).rstrip()
