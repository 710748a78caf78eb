"""The LightningCLI shared by the recipes: RL-friendly trainer defaults and an end-of-run summary."""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from drmas.callbacks import GradNormSpikeMonitor, HFCheckpoint, RolloutStats
from drmas.data.datamodule import RolloutDataModule
from drmas.modules.multi_agent import MultiAgentRL

__all__ = ["DrmasCLI", "format_summary", "run_recipe"]


class DrmasCLI(LightningCLI):
    """LightningCLI for ``MultiAgentRL`` + ``RolloutDataModule`` with a recipe's workflow as default."""

    def __init__(self, workflow: str, name: str, default_config: str | None = None, **kwargs: Any) -> None:
        self._workflow, self._name = workflow, name
        # The default config is read first; --config files and flags override it.
        parser_kwargs = {"fit": {"default_config_files": [default_config]}} if default_config else {}
        super().__init__(
            MultiAgentRL,
            RolloutDataModule,
            trainer_defaults=trainer_defaults(name),
            save_config_kwargs={"overwrite": True},
            parser_kwargs=parser_kwargs,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser) -> None:
        parser.set_defaults({"data.workflow": {"class_path": self._workflow}})


def trainer_defaults(name: str) -> dict[str, Any]:
    # One epoch = one RL iteration; the rollout data is rebuilt every epoch; every scalar is
    # logged by the module with the iteration as step, so Lightning's own cadence is moot.
    return {
        "max_epochs": 4,
        "reload_dataloaders_every_n_epochs": 1,
        "log_every_n_steps": 1,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "enable_progress_bar": False,
        "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                   "init_args": {"save_dir": "runs", "name": name}},
        "callbacks": [
            RolloutStats(),
            GradNormSpikeMonitor(),
            HFCheckpoint(),
            # Full training state for --ckpt_path resume, at every iteration's end (Lightning
            # writes through a temporary file, so an interrupted save leaves the old one intact).
            ModelCheckpoint(save_last=True, save_top_k=0, every_n_epochs=1),
        ],
    }


def format_summary(module: MultiAgentRL, log_dir: str | None) -> str:
    """Per agent: reward and valid-format ratio at the first and last iteration; val before/after."""
    rows = [h for h in module.history if any(k.startswith("rollout/") for k in h)]
    vals = [h for h in module.history if any(k.startswith("val/") for k in h)]
    lines = []
    if log_dir:
        lines.append(f"TensorBoard logs: {log_dir}   (tensorboard --logdir {os.path.dirname(log_dir)})")
        lines.append(f"HF checkpoints:   {os.path.join(log_dir, 'hf')}")
        lines.append(f"resume with:      --ckpt_path {os.path.join(log_dir, 'checkpoints', 'last.ckpt')}")
    if rows:
        first, last = rows[0], rows[-1]
        agents = sorted({k.split("/")[1] for h in rows for k in h if k.count("/") == 2 and k.startswith("rollout/")})
        lines.append(f"\n{'agent':10s} {'reward@first':>12s} {'reward@last':>12s} {'valid@first':>12s} {'valid@last':>11s}")
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


def run_recipe(workflow: str, name: str, default_config: str | None = None, args: Any = None) -> DrmasCLI:
    """Run a recipe's CLI; after ``fit``, print where the logs are and the summary table."""
    cli = DrmasCLI(workflow, name, default_config, args=args)
    if getattr(cli, "subcommand", None) == "fit" and cli.trainer.is_global_zero:
        print(format_summary(cli.model, cli.trainer.log_dir), flush=True)
    return cli
