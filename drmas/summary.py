"""The lines a run ends with: where its logs and checkpoints went, and per agent its reward and
valid-format ratio at the first and last iteration, with validation before and after."""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from drmas.callbacks import HFCheckpoint
from drmas.records import EPISODES_DIR

__all__ = ["format_summary"]


def format_summary(module: Any, trainer: Any = None) -> str:
    """Where the logs and checkpoints went; per agent, reward and valid-format ratio at the first
    and last iteration; validation before and after."""
    rows = [h for h in module.history if any(k.startswith("rollout/") for k in h)]
    vals = [h for h in module.history if any(k.startswith("val/") for k in h)]
    lines = []
    if trainer is not None and trainer.log_dir:
        lines.append(f"TensorBoard logs: {trainer.log_dir}   "
                     f"(tensorboard --logdir {os.path.dirname(trainer.log_dir)})")
        episodes = os.path.join(trainer.log_dir, EPISODES_DIR)
        if os.path.isdir(episodes):
            lines.append(f"episodes:         {episodes}   (one .jsonl.gz per iteration and validation)")
        for cb in trainer.callbacks:
            if isinstance(cb, HFCheckpoint):
                lines.append(f"HF checkpoints:   {cb.resolve_dirpath(trainer)}")
            elif isinstance(cb, ModelCheckpoint):
                # a top-k kept by a metric (a resumed run's before it ranks: the path, no score)
                if cb.monitor and cb.best_model_path and cb.best_model_score is not None:
                    lines.append(f"best checkpoint:  {cb.best_model_path} ({cb.monitor} = "
                                 f"{float(cb.best_model_score):.3f})")
                if cb.last_model_path:
                    lines.append(f"resume with:      --ckpt_path {cb.last_model_path}")
    if rows:
        first, last = rows[0], rows[-1]
        agents = sorted({k.split("/")[1] for h in rows for k in h
                         if k.count("/") == 2 and k.startswith("rollout/")})
        lines.append(f"\n{'agent':10s} {'reward@first':>12s} {'reward@last':>12s} "
                     f"{'valid@first':>12s} {'valid@last':>11s}")
        for a in agents:
            g = lambda h, k: h.get(f"rollout/{a}/{k}", float("nan"))  # noqa: E731
            lines.append(f"{a:10s} {g(first, 'reward_mean'):12.3f} {g(last, 'reward_mean'):12.3f} "
                         f"{g(first, 'valid_ratio'):12.2f} {g(last, 'valid_ratio'):11.2f}")
        lines.append(f"(iterations {first['iteration']} and {last['iteration']}; "
                     f"success rate {first.get('rollout/success_rate', float('nan')):.2f} -> "
                     f"{last.get('rollout/success_rate', float('nan')):.2f})")
    if vals:
        for key in sorted(k for k in vals[0] if k.startswith("val/")):
            lines.append(f"{key}: {vals[0][key]:.3f} (iteration {vals[0]['iteration']}) -> "
                         f"{vals[-1].get(key, float('nan')):.3f} (iteration {vals[-1]['iteration']})")
    return "\n".join(lines)
