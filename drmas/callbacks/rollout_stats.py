"""Per-agent statistics of each rollout, and sample completions as text."""

from __future__ import annotations

from collections import defaultdict

import lightning as L

from drmas.algorithms import baseline_inflation, singleton_prompts
from drmas.callbacks.contracts import AgentModule, PreparedSource, require
from drmas.data.tables import agent_table, log_table
from drmas.data.gathered import outcome_scalars
from drmas.records import PreparedIteration, RolloutResult

__all__ = ["RolloutStats", "rollout_scalars"]


def rollout_scalars(result: RolloutResult) -> dict[str, float]:
    """``rollout/success_rate``, ``rollout/turns_mean``, ``rollout/<agent>/{reward_mean,valid_ratio}``
    (as validation computes them), and per agent ``advantage_abs_mean``, ``response_tokens_mean``,
    ``samples`` and ``baseline_inflation`` (what one baseline per task would do to its advantages,
    whichever estimator trains: :func:`~drmas.algorithms.baseline_inflation`), and per agent and
    turn ``singleton_prompts_turn<t>`` (the share of its samples whose prompt no other trajectory of
    the task reached: :func:`~drmas.algorithms.singleton_prompts`)."""
    out = outcome_scalars(result, "rollout")
    for agent, factor in baseline_inflation(result.samples).items():
        out[f"rollout/{agent}/baseline_inflation"] = factor
    for (agent, turn), share in singleton_prompts(result.samples).items():
        out[f"rollout/{agent}/singleton_prompts_turn{turn}"] = share
    by_agent = defaultdict(list)
    for s in result.samples:
        by_agent[s.agent].append(s)
    for agent, samples in by_agent.items():
        n = len(samples)
        out[f"rollout/{agent}/advantage_abs_mean"] = sum(abs(s.advantage) for s in samples) / n
        out[f"rollout/{agent}/response_tokens_mean"] = sum(len(s.response_ids) for s in samples) / n
        out[f"rollout/{agent}/samples"] = float(n)
    return out


class RolloutStats(L.Callback):
    """Logs the statistics and timings of each prepared iteration (the data module's ``current``)
    at its iteration, and every ``log_completions_every`` iterations, per agent, a table of its
    samples of the best, median and worst advantage (:func:`~drmas.data.tables.agent_table`)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require(pl_module, AgentModule, "RolloutStats")
        require(trainer.datamodule, PreparedSource, "RolloutStats")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """TensorBoard's Custom Scalars tab: per agent, its reward and valid ratio in one chart and
        its policy's grad norm in the next (on one axis the norm would flatten the rates)."""
        agents: dict[str, str] = pl_module.agent_map
        if not agents or not trainer.is_global_zero:
            return
        charts = {}
        for agent, policy in agents.items():
            charts[f"{agent}: reward, valid ratio"] = ["Multiline", [f"rollout/{agent}/reward_mean",
                                                                     f"rollout/{agent}/valid_ratio"]]
            charts[f"{agent}: grad norm of {policy}"] = ["Multiline", [f"train/{policy}/grad_norm"]]
        layout = {"agents": charts}
        for lg in trainer.loggers:
            writer = getattr(lg, "experiment", None)
            if hasattr(writer, "add_custom_scalars"):
                writer.add_custom_scalars(layout)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm = trainer.datamodule
        prepared: PreparedIteration | None = dm.current
        if prepared is None:
            return
        pl_module.log_scalars({**rollout_scalars(prepared.rollout), **prepared.timings, **prepared.scalars},
                              step=prepared.iteration)
        every = dm.log_completions_every
        if every and prepared.iteration % every == 0 and trainer.is_global_zero:
            self._log_tables(trainer, prepared)

    @staticmethod
    def _log_tables(trainer: L.Trainer, prepared: PreparedIteration) -> None:
        by_agent = defaultdict(list)
        for s in prepared.samples:
            by_agent[s.agent].append(s)
        for agent, samples in by_agent.items():
            log_table(trainer, f"completions/{agent}", agent_table(samples), prepared.iteration)
