"""Gradient-norm spike monitor: counts per-policy spikes and plots the norms.

The quantity Dr. MAS is about is the per-agent gradient norm: a shared baseline far from one
agent's reward distribution inflates that agent's gradient and training spikes. This callback
watches the pre-clip total norm each policy reports and counts the spikes, so a run (and an
ablation between advantage estimators) can be judged by a number and a picture.

Contract with the LightningModule: ``training_step`` returns a dict with
``"grad_norms": {policy_name: pre_clip_total_norm}`` whenever a policy's optimiser stepped (or
skipped a non-finite step); ``pl_module.iteration`` is the RL iteration counter and
``pl_module.log_scalars(dict)`` logs at step = iteration.
"""

from __future__ import annotations

import io
import math
import os
import statistics
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from drmas.atomic import write_bytes

__all__ = ["GradNormSpikeMonitor"]


class GradNormSpikeMonitor(Callback):
    """Count and plot per-policy gradient-norm spikes.

    A *spike* is a pre-clip gradient norm greater than ``factor`` times the median of the
    previous ``window`` finite norms of the same policy, once at least ``min_history`` such
    norms exist (before that, nothing is a spike). Spikes stay in the window: a run that
    settles at a higher level stops counting after the median catches up. Non-finite norms
    (a step the module skipped) are recorded as skipped and never enter the median.

    Logged after each training batch, for every policy that reported a norm:
    ``train/<policy>/grad_norm_spikes`` (cumulative spike count) and
    ``train/<policy>/grad_norm_skipped`` (cumulative count of non-finite norms).

    At the end of training it writes ``grad_norms.png`` into the trainer's log dir (or
    ``default_root_dir`` without a logger): one line per policy on a log-scale y axis, spikes
    marked with red circles, skipped steps as dotted vertical lines.
    """

    def __init__(
        self, factor: float = 3.0, window: int = 20, min_history: int = 5, plot: bool = True
    ) -> None:
        """
        Args:
            factor: a norm above ``factor`` x the rolling median of the previous norms is a spike.
            window: how many previous finite norms of the same policy the rolling median uses.
            min_history: no spike is counted until a policy has at least this many finite norms.
            plot: write ``grad_norms.png`` into the log dir when training ends.
        """
        if factor <= 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if not 1 <= min_history <= window:
            raise ValueError(f"min_history must be in [1, window={window}], got {min_history}")
        self.factor = float(factor)
        self.window = int(window)
        self.min_history = int(min_history)
        self.plot = plot
        # Per policy, in arrival order: (iteration, norm). Non-finite norms are kept (as skipped).
        self.history: dict[str, list[tuple[int, float]]] = {}
        # Per policy: (iteration, norm) of every spike, and a parallel index into ``history``.
        self.spikes: dict[str, list[tuple[int, float]]] = {}
        self._spike_index: dict[str, list[int]] = {}
        self.plot_path: str | None = None

    # ------------------------------------------------------------------ bookkeeping

    def spike_count(self, policy: str) -> int:
        return len(self.spikes.get(policy, []))

    def skipped_count(self, policy: str) -> int:
        return sum(1 for _, v in self.history.get(policy, []) if not math.isfinite(v))

    def _recent_finite(self, policy: str) -> list[float]:
        recent: list[float] = []
        for _, v in reversed(self.history.get(policy, [])):
            if math.isfinite(v):
                recent.append(v)
                if len(recent) == self.window:
                    break
        return recent

    def record(self, policy: str, iteration: int, norm: float) -> bool:
        """Record one norm of ``policy``; return whether it is a spike."""
        prev = self._recent_finite(policy)
        is_spike = (
            math.isfinite(norm)
            and len(prev) >= self.min_history
            and norm > self.factor * statistics.median(prev)
        )
        history = self.history.setdefault(policy, [])
        self.spikes.setdefault(policy, [])
        self._spike_index.setdefault(policy, [])
        if is_spike:
            self.spikes[policy].append((iteration, norm))
            self._spike_index[policy].append(len(history))
        history.append((iteration, norm))
        return is_spike

    # ------------------------------------------------------------------ hooks

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(outputs, dict) or not outputs.get("grad_norms"):
            return
        iteration = int(pl_module.iteration)
        metrics: dict[str, float] = {}
        for policy, norm in outputs["grad_norms"].items():
            # float() also accepts 0-d tensors; a step may hand them over undetached.
            self.record(policy, iteration, float(norm))
            metrics[f"train/{policy}/grad_norm_spikes"] = float(self.spike_count(policy))
            metrics[f"train/{policy}/grad_norm_skipped"] = float(self.skipped_count(policy))
        pl_module.log_scalars(metrics)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.plot:
            return
        # trainer.log_dir broadcasts from rank 0, so every rank must evaluate it; only rank 0 writes.
        log_dir = trainer.log_dir or trainer.default_root_dir
        if trainer.is_global_zero and any(self.history.values()):
            self.plot_path = self.write_plot(os.path.join(log_dir, "grad_norms.png"))
            rank_zero_info(f"GradNormSpikeMonitor: wrote {self.plot_path}")
            image = None
            for lg in trainer.loggers:  # the same picture under TensorBoard's Images
                writer = getattr(lg, "experiment", None)
                if hasattr(writer, "add_image"):
                    image = self._figure_pixels() if image is None else image
                    writer.add_image("grad_norms", image, global_step=int(pl_module.iteration),
                                     dataformats="HWC")

    # ------------------------------------------------------------------ plot

    def _x_positions(self, policy: str) -> list[float]:
        """Iteration-aligned x: the j-th of m updates in iteration t sits at t + j/m.

        Several optimiser steps happen per iteration; spreading them inside the iteration keeps
        every policy on the same axis as TensorBoard (step = iteration) without vertical stacks.
        """
        its = [it for it, _ in self.history[policy]]
        per_it: dict[int, int] = {}
        for it in its:
            per_it[it] = per_it.get(it, 0) + 1
        seen: dict[int, int] = {}
        xs = []
        for it in its:
            j = seen.get(it, 0)
            seen[it] = j + 1
            xs.append(it + j / per_it[it])
        return xs

    def write_plot(self, path: str) -> str:
        """Write the norm plot as a PNG to ``path`` (atomically) and return the path."""
        buf = io.BytesIO()
        self._figure().savefig(buf, format="png")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_bytes(path, buf.getvalue())
        return path

    def _figure_pixels(self) -> Any:
        """The plot as an ``[H, W, 3]`` uint8 array (for TensorBoard's Images)."""
        import numpy as np

        canvas = self._figure().canvas
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[..., :3].copy()

    def _figure(self) -> Any:
        # The Agg canvas is used directly, without pyplot, so the user's global matplotlib
        # backend and pyplot's figure registry are left alone (and no display is needed).
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(8, 4.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for n, policy in enumerate(sorted(self.history)):
            if not self.history[policy]:
                continue
            color = f"C{n % 10}"
            xs = self._x_positions(policy)
            # Non-finite (and, on a log axis, zero) norms are gaps in the line.
            ys = [v if math.isfinite(v) and v > 0 else float("nan") for _, v in self.history[policy]]
            ax.plot(xs, ys, color=color, linewidth=1.2, label=f"{policy} ({self.spike_count(policy)} spikes)")
            for x, (_, v) in zip(xs, self.history[policy]):
                if not math.isfinite(v):
                    ax.axvline(x, color=color, linestyle=":", linewidth=0.8)
            idx = self._spike_index.get(policy, [])
            if idx:
                ax.scatter(
                    [xs[i] for i in idx],
                    [self.history[policy][i][1] for i in idx],
                    s=60,
                    facecolors="none",
                    edgecolors="red",
                    linewidths=1.5,
                    zorder=3,
                )
        if any(math.isfinite(v) and v > 0 for values in self.history.values() for _, v in values):
            ax.set_yscale("log")  # a log axis without one positive value cannot place its ticks
        ax.set_xlabel("RL iteration")
        ax.set_ylabel("pre-clip grad norm")
        ax.set_title(f"grad norms (spike: > {self.factor:g} x median of previous {self.window})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        return fig

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        # Plain lists of numbers only, so the checkpoint loads with torch.load(weights_only=True).
        return {
            "history": {p: [[int(i), float(v)] for i, v in h] for p, h in self.history.items()},
            "spike_index": {p: list(map(int, idx)) for p, idx in self._spike_index.items()},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        history = state_dict.get("history", {})
        self.history = {p: [(int(i), float(v)) for i, v in h] for p, h in history.items()}
        self._spike_index = {p: list(idx) for p, idx in state_dict.get("spike_index", {}).items()}
        self.spikes = {
            p: [self.history[p][i] for i in self._spike_index.get(p, [])] for p in self.history
        }
