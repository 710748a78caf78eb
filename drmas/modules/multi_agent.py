"""The LightningModule that holds every policy and updates each on its own agents' samples.

One Lightning epoch is one RL iteration (see ``RolloutDataModule``). Toward the rollout side the
module is a :class:`~drmas.data.rollouts.RolloutBackend`: it maps agents to policies, hands out a
``generate`` function, syncs its engines and says how each policy's micro-batches are packed;
it never calls the data module. Optimisation is manual:
one AdamW per policy, gradients accumulated over a policy's micro-batches, clipped per policy
(the pre-clip norm is recorded), and a non-finite loss or gradient skips that policy's step
and is logged. ``iteration`` counts RL iterations and is the x-axis of every logged scalar;
``trainer.global_step`` advances once per optimiser step and is not used for logging.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from collections import defaultdict
from typing import Any, Sequence

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from drmas.algorithms import LossConfig, policy_loss, truncated_importance_weights
from drmas.modules.agent_grads import AgentGradients
from drmas.modules.engine_routing import RolloutEngines
from drmas.modules.preflight import run_preflight
from drmas.modules.policy import Policy, PolicyConfig, agent_policies, make_policies
from drmas.modules.iteration_line import IterationLines
from drmas.modules.pools import Pools, pooled, refuse, resolve_pools
from drmas.modules.preemption import StopSignal
from drmas.modules.run_state import (capture_rng, epoch_scalars, load_state, record_micro_batch,
                                     restore_rank_rng, save_state)
from drmas.modules.scalar_log import ScalarLog
from drmas.modules.sharding import check_precision
from drmas.ranks import agree, at, group_gather, watch_state
from drmas.records import BatchSpec, GenerateFn, MicroBatch
from drmas.watch import watch

__all__ = ["MultiAgentRL", "check_precision"]

log = logging.getLogger(__name__)

class MultiAgentRL(L.LightningModule):
    def __init__(
        self,
        policies: dict[str, PolicyConfig] = {"shared": PolicyConfig()},  # noqa: B006 (jsonargparse needs a concrete default)
        agents: dict[str, str] | None = None,
        engine: str = "auto",
        engine_settings: dict[str, Any] | None = None,
        engine_placement: str = "shared",
        loss: LossConfig = LossConfig(),  # noqa: B008 (frozen)
        prefix_sharing: bool = True,
        agent_grad_norms: bool = False,
        preflight: bool | None = None,
    ) -> None:
        """
        Args:
            policies: policy name -> settings. One entry = all agents share one model.
            agents: agent -> policy name. Default: every agent to the only policy, or each
                agent to the policy of the same name.
            engine: rollout engine, by its name in ``drmas.engines.ENGINES`` (your own, once
                registered), or ``auto``: the available one the engines prefer (docs/engines.md).
            engine_settings: the engine's own settings, the keys of the dataclass it declares
                (``Engine.settings_type``), e.g. ``{max_model_len: 4096, kv_cache_gib: 2.0}``; a
                policy's ``engine_settings`` override them for its engine. Unknown keys are refused.
            engine_placement: ``shared``: each rank's engines run on its own device (GPU: asleep
                through the update); ``split``: on a GPU of their own, the node's GPUs that the
                trainer leaves free (docs/scaling.md).
            loss: the policy loss's terms, the same for every policy: ``clip_low``,
                ``clip_high``, ``dual_clip``, ``agg``, ``kl_coef``, ``entropy_coef``,
                ``importance_cap`` (:class:`~drmas.algorithms.losses.LossConfig`).
            prefix_sharing: run prompt prefixes shared by several samples once in the update
                (same log-probs and gradients; see ``drmas.packing``). Off for a model whose
                attention cannot take the block mask (one warning) or without chunked log-probs.
            agent_grad_norms: also log ``train/<policy>/<agent>/grad_norm``, the norm of each
                agent's own contribution to its policy's gradient (before clipping): micro-batches
                then hold one agent each, and a gradient-sized buffer per agent is kept. One
                device only; a diagnostic for the stability study (docs/stability.md).
            preflight: the first-minute pass at start (``drmas.modules.preflight``: engines, one
                checked weight transfer, sleep and wake, one micro-batch). Unset: on where the
                engines run on GPUs (a defect would otherwise surface hours in), off on CPU.

        The engines draw from ``--data.rollout.seed``: each is reseeded before every rollout from it, the
        rank and the iteration.
        """
        super().__init__()
        if not policies:
            raise ValueError("at least one policy is needed")
        # the rollout engines: settings checked (unknown keys named) and memory refused before any model loads
        self.engines = RolloutEngines(self, engine, engine_settings, engine_placement, dict(policies))
        # Plain values only: Lightning reads them back with torch.load(weights_only=True) on resume.
        self.save_hyperparameters(ignore=["policies", "loss"])
        self.hparams["policies"] = {k: dataclasses.asdict(v) for k, v in policies.items()}
        self.hparams["loss"] = dataclasses.asdict(loss)
        self.automatic_optimization = False
        if loss.kl_coef > 0:  # the frozen references are in eval mode on purpose
            warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
        self.policies = torch.nn.ModuleDict(make_policies(policies, loss.kl_coef > 0, prefix_sharing))
        """The policies this rank holds: every one, or under per-policy pools those whose pool it is in."""
        self.configs = dict(policies)  # every policy's settings, whichever ranks hold it
        self.pools: Pools = {}  # policy -> the ranks that hold it (set up with the ranks)
        self.elsewhere: dict[str, Policy] = {}  # policies other ranks hold: their tokenizer and settings
        self._pool_groups: dict[str, Any] = {}  # policy -> its pool's gloo group, under pools
        self.agent_map = dict(agents or {})
        self.loss = loss
        self.agent_grad_norms = agent_grad_norms
        self.preflight = preflight
        self._agent_grads = AgentGradients()
        self._optimizer_of: dict[str, int] = {}  # trained policy -> its optimiser's place
        self.iteration = 0
        self._bad_loss = False
        self.stop_signal = StopSignal()
        self.weights_read: dict[str, str] = {}  # policy -> how its shards were read (sharded loading)
        self._sharded = False
        self._old_logprobs: dict[tuple[str, int], torch.Tensor] = {}
        # (policy, index among its samples) -> mean |trainer - engine| log-prob per response token
        # of a sample this rank trained, until the data module writes its record
        self.sample_gaps: dict[tuple[str, int], tuple[float, Any]] = {}
        self._metrics: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(
            lambda: defaultdict(list))
        self.history: list[dict[str, float]] = []
        self.scalar_log = ScalarLog()
        self.lines = IterationLines()  # a line per iteration where stdout is a log, not a terminal

    # ---- agents, engines, generation ------------------------------------------------------

    def bind_agents(self, agents: Sequence[str]) -> dict[str, str]:
        """Resolve and check the agent -> policy map for a workflow's agents; return it."""
        self.agent_map = agent_policies(agents, self.agent_map, list(self.configs))
        return dict(self.agent_map)

    def policy_of(self, agent: str) -> str:
        return self.agent_map[agent]

    @property
    def pooled(self) -> bool:
        """Whether the policies live in per-policy pools (some rank does not hold every policy)."""
        return bool(self._pool_groups)

    def any_policy(self, name: str) -> Policy:
        """The policy of that name, held here or (per-policy pools) by other ranks: then its tokenizer
        and settings only."""
        return self.policies[name] if name in self.policies else self.elsewhere[name]

    @property
    def rank(self) -> int:
        return self.global_rank

    @property
    def world_size(self) -> int:
        return self._trainer.world_size if self._trainer is not None else 1

    # the engines' side of the rollout contract (drmas.data.rollouts.RolloutBackend)
    def generate_fn(self, train: bool) -> GenerateFn:
        return self.engines.generate_fn(train)

    def sync_weights(self, seed: int | None = None) -> None:
        self.engines.sync_weights(seed)

    def reseed(self, seed: int) -> None:
        self.engines.reseed(seed)

    def set_staleness(self, staleness: int) -> None:
        self.engines.set_staleness(staleness)

    def engine_cache_stats(self) -> tuple[int, int]:
        return self.engines.cache_stats()

    def engine_busy(self) -> dict[str, float]:
        return self.engines.busy_seconds()

    def gather_objects(self, obj: Any, background: bool = False) -> list[Any]:
        """Every rank's ``obj`` in rank order; a collective (``[obj]`` with one process), on the
        background rollout's gloo group when ``background``."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        group = watch.behind if background else watch.objects  # gloo, --gather_timeout_s
        torch.distributed.all_gather_object(out, obj, group=group)
        return out

    # ---- training -------------------------------------------------------------------------

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy`` (``drmas.modules.sharding.FSDP``): shard every policy
        (and its reference) with FSDP2 over the data-parallel ranks."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        self.engines.refuse_unstartable()  # before the shards load
        if self._sharded or not isinstance(strategy, ModelParallelStrategy):
            for policy in self.policies.values():
                if policy.deferred:  # built for sharding, trained whole after all
                    policy.load_weights(self.device)
            return
        from drmas.modules.sharding import shard_policies, take_pools

        if self.agent_grad_norms:
            raise ValueError("agent_grad_norms runs on one device: it is not supported with a sharded "
                             "strategy")
        meshes = dict.fromkeys(self.policies, self.device_mesh["data_parallel"])
        if pooled(self.pools, self.world_size):  # only this rank's policies stay (the others: elsewhere)
            meshes, self._pool_groups = take_pools(self.policies, self.elsewhere, self.pools, self.rank,
                                                   strategy.root_device.type)
        self.weights_read = shard_policies(self.policies, strategy, meshes)
        self._sharded = True

    def on_fit_start(self) -> None:
        check_precision(str(self.trainer.precision))
        if self.trainer.loggers:  # without a logger no file either (log_dir would be the working directory)
            # trainer.log_dir on every rank: under a sharded strategy it is a collective
            self.scalar_log.open(self.trainer.log_dir, self.trainer.is_global_zero)
        if self.trainer.is_global_zero:
            for policy in self.policies.values():
                print(policy.describe(self.engines.name), flush=True)
        self.stop_signal.install(self.trainer)
        self.engines.place()
        on_gpu = self.device.type == "cuda" or self.engines.gpu is not None
        if self.preflight if self.preflight is not None else on_gpu:
            run_preflight(self)
        self.lines.start()

    def configure_optimizers(self):
        total = self.trainer.max_epochs if self.trainer and self.trainer.max_epochs else 1
        trained = [p for p in self.policies.values() if p.trainable]  # frozen policies have no optimiser
        if not any(c.trainable for c in self.configs.values()):
            raise ValueError("every policy is frozen (trainable: false): there is nothing to train")
        self._optimizer_of = {p.name: i for i, p in enumerate(trained)}
        pairs = [p.make_optimizer(total) for p in trained]
        # Returned to Lightning so their states are checkpointed; stepped by begin_iteration.
        return [o for o, _ in pairs], [s for _, s in pairs]

    def optimizer_names(self) -> list[str]:
        """The policy of each optimiser :meth:`configure_optimizers` returned, in order (checkpoints
        key optimiser states by it)."""
        return list(self._optimizer_of)

    def _schedulers(self) -> list:
        scheds = self.lr_schedulers()
        return [] if scheds is None else scheds if isinstance(scheds, list) else [scheds]

    def _optimizer(self, name: str):
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        return opts[self._optimizer_of[name]]

    def token_logprobs(self, policy: Policy, batch: MicroBatch, temperature: float,
                       reference: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`Policy.token_logprobs`, with entropies when the loss needs them."""
        with_entropy = bool(self.loss.entropy_coef) and not reference
        return policy.token_logprobs(batch, temperature, with_entropy, reference)

    def training_step(self, batch: MicroBatch, batch_idx: int) -> dict[str, Any]:
        if batch.idle:  # per-policy pools: this rank's policies are done, another rank's are not
            return {}
        at(f"the forward and backward of policy {batch.policy}")
        # every rank of the policy's pool stops at the same micro-batch
        self.stop_signal.raise_if_any(len(self._pool(batch.policy)), self.device,
                                      self._pool_groups.get(batch.policy))
        policy = self.policies[batch.policy]
        generation = policy.config.generation.train
        logp, entropy = self.token_logprobs(policy, batch, generation.temperature)
        mask = batch.response_mask
        # First PPO epoch: the weights are still those that sampled, so the current log-probs
        # are the old ones; keep them for the later PPO epochs instead of an extra forward pass.
        if batch.ppo_epoch == 0:
            old = logp.detach()
            if policy.config.update.ppo_epochs > 1:
                for row, i in enumerate(batch.sample_index.tolist()):
                    self._old_logprobs[(batch.policy, i)] = old[row]
        else:
            old = torch.stack([self._old_logprobs[(batch.policy, i)] for i in batch.sample_index.tolist()])
        importance_weights = None
        if self.loss.importance_cap is not None:
            importance_weights = truncated_importance_weights(old, batch.engine_logprobs,
                                                              self.loss.importance_cap) * mask
        ref = None
        if self.loss.kl_coef > 0:
            with torch.no_grad():
                ref, _ = self.token_logprobs(policy, batch, generation.temperature, reference=True)
        loss, metrics = policy_loss(logp, old, batch.advantages, mask, self.loss, entropy=entropy,
                                    importance_weights=importance_weights, ref_logprobs=ref,
                                    norm_len=generation.max_new_tokens)
        finite = bool(torch.isfinite(loss))
        if finite and self.agent_grad_norms and batch.agent is not None:
            self._agent_grads.backward(policy.name, batch.agent, policy.trainable_parameters(),
                                       lambda: self.manual_backward(loss * batch.loss_scale))
        elif finite:
            self.manual_backward(loss * batch.loss_scale)
        else:
            self._bad_loss = True  # every rank skips this step (_step agrees on it)
            if len(self._pool(batch.policy)) > 1:  # a sharded backward is a collective: run it, finite
                self.manual_backward(torch.nan_to_num(loss, 0.0, 0.0, 0.0) * batch.loss_scale)
        if not batch.stand_in:  # a stand-in pass that keeps ranks in step has no statistics
            record_micro_batch(self._metrics[batch.policy], self.sample_gaps, batch,
                               bool(policy.chunk_tokens), loss, metrics, old, importance_weights,
                               self.loss.importance_cap)
        out: dict[str, Any] = {}
        if batch.step_after:
            out["grad_norms"] = {batch.policy: self._step(policy)}
        return out

    def _step(self, policy: Policy) -> float:
        """Clip and step ``policy``'s optimiser, or skip on every rank if any rank's loss or gradient
        is not finite; a step that raises on one rank is raised on every rank (agreed)."""
        at(f"the optimiser step of policy {policy.name}")
        opt = self._optimizer(policy.name)
        params = [p for p in policy.trainable_parameters() if p.grad is not None]
        clip = policy.config.optim.grad_clip if policy.config.optim.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, clip) if params else torch.zeros(())
        # sharded parameters give a DTensor: its full value is the global norm over all shards
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        bad = self._bad_loss or not math.isfinite(norm)
        group = self._pool_groups.get(policy.name)
        if group is not None:  # every rank of the policy's pool skips, or none
            flag = torch.tensor(float(bad))
            torch.distributed.all_reduce(flag, group=group)
            bad = bool(flag > 0)
        elif self._trainer is not None and self.trainer.world_size > 1:  # every rank skips, or none
            flag = torch.tensor(float(bad), device=self.device)
            bad = bool(self.trainer.strategy.reduce(flag, reduce_op="sum") > 0)
        bucket = self._metrics[policy.name]
        failure = None
        if bad:
            log.warning("policy %s: non-finite loss or gradient (norm=%s) at iteration %d; step skipped",
                        policy.name, norm, self.iteration)
            bucket["skipped_steps"].append((1.0, 0.0))
        else:
            try:
                opt.step()
                policy.version += 1
            except Exception as err:  # e.g. out of memory for the optimiser state on this rank
                failure = err
        opt.zero_grad(set_to_none=True)
        self._bad_loss = False
        agree(self.gather_objects if group is None else group_gather(group), self.rank, failure)
        bucket["grad_norm"].append((norm, 1.0))
        for agent, agent_norm in self._agent_grads.take_norms(policy.name).items():
            bucket[f"{agent}/grad_norm"].append((agent_norm, 1.0))
        return norm

    def batch_spec(self, policy: str) -> BatchSpec:
        """How ``policy``'s samples are packed: its tokenizer's pad id, micro-batch size, PPO epochs,
        and under per-policy pools the ranks that train it."""
        p = self.any_policy(policy)
        update = p.config.update
        return BatchSpec(p.tokenizer.pad_token_id, update.micro_batch_size, update.ppo_epochs,
                         self.loss.agg, p.prefix_sharing, self.agent_grad_norms, p.attention_window,
                         p.trainable, self.pools[policy] if self.pooled else None)

    def _pool(self, policy: str) -> Sequence[int]:
        """The ranks that train ``policy`` (every rank without pools)."""
        return self.pools[policy] if self.pooled else range(self.world_size)

    def begin_iteration(self) -> int:
        """Called by the rollout side when a rollout starts: iteration k runs as ``iteration == k``,
        with each policy's learning rate for iteration k."""
        self.iteration += 1
        watch_state.iteration = self.iteration
        self._old_logprobs.clear()
        # Stepped here, not at the end of the previous iteration: the checkpoint written at that
        # end then holds the schedule of the iteration it finished, and a resumed run steps it
        # once, exactly as the uninterrupted run does.
        if self.iteration > 1 and self._trainer is not None:
            for sched in self._schedulers():
                sched.step()
        return self.iteration

    def on_train_epoch_start(self) -> None:
        self.engines.sleep(report=self.global_rank == 0)  # the update's turn on the device
        self._update_started = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        at("the iteration's metrics gather")
        buckets = {name: dict(bucket) for name, bucket in self._metrics.items()}
        lrs = {name: self._optimizer(name).param_groups[0]["lr"] for name in buckets}
        # every rank trained on its own share (under pools, of its own policies)
        per_rank = self.gather_objects((buckets, lrs))
        scalars = {"time/update_s": time.perf_counter() - self._update_started,
                   **epoch_scalars([b for b, _ in per_rank],
                                   {n: c.update.ppo_epochs for n, c in self.configs.items()})}
        for _, rank_lrs in per_rank:
            scalars.update({f"train/{name}/lr": lr for name, lr in rank_lrs.items()})
        self._metrics.clear()
        self.log_scalars(scalars)
        if self.trainer.is_global_zero:  # the iteration's last scalars: validation and the rollout's are in
            self.lines.end(self.iteration, self.trainer.max_epochs, self.history)

    # ---- logging and checkpoints ------------------------------------------------------------

    def log_scalars(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log with the RL iteration as the x-axis (:class:`ScalarLog`: every logger, metrics.jsonl,
        ``trainer.callback_metrics``); keep a copy in ``history``."""
        step = self.iteration if step is None else step
        self.history.append({"iteration": step, **metrics})
        if self._trainer is not None:
            self.scalar_log.write(self.trainer.callback_metrics, self.loggers, metrics, step,
                                  self.trainer.is_global_zero)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # every rank's random state (each samples its own rollouts), and every policy's version and
        # schedule from the ranks that hold it: Lightning's own list of schedules is rank 0's
        scheds = self._schedulers() if self._trainer is not None else []
        mine = (capture_rng(), {n: p.version for n, p in self.policies.items()},
                dict(zip(self.optimizer_names(), (s.state_dict() for s in scheds))))
        everyone = self.gather_objects(mine)
        versions = {n: v for _, theirs, _ in everyone for n, v in theirs.items()}
        schedules = {n: s for *_, theirs in everyone for n, s in theirs.items()}
        checkpoint["drmas"] = save_state(self.iteration, versions, self.history, [r for r, *_ in everyone],
                                         self._precision(), schedules)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = load_state(checkpoint, self.world_size, self._precision())
        self.iteration, self.history = state["iteration"], state["history"]
        for n, v in state["versions"].items():
            self.any_policy(n).version = v
        if state.get("schedules") and self._optimizer_of:  # this rank's, by policy
            checkpoint["lr_schedulers"] = [state["schedules"][n] for n in self.optimizer_names()]
        restore_rank_rng(state["rng"], self.rank, self.world_size, self.iteration)

    def _precision(self) -> str | None:
        return str(self._trainer.precision) if self._trainer is not None else None

    def setup(self, stage: str) -> None:
        # before the policies are loaded (configure_model): a failure there ends every rank too
        watch.start(self.global_rank, self.world_size)  # another rank's failure stops this one too
        self.pools = resolve_pools(self.configs, self.world_size)
        if pooled(self.pools, self.world_size):  # refused before any weights are read
            from drmas.modules.sharding import FSDP

            rollout = getattr(getattr(self.trainer.datamodule, "rollouts", None), "config", None)
            refuse(self.pools, isinstance(self.trainer.strategy, FSDP),  # (its checkpoints: by policy)
                   getattr(rollout, "tasks_per_iteration", None))
        if any(c.ranks is not None for c in self.configs.values()):  # (else checked as the engines were set)
            self.engines.check_pools(self.pools, self.world_size)
        if self.trainer.is_global_zero:  # ended for another rank's failure: the events written so far kept
            watch.at_end(self._flush_logs)

    def _flush_logs(self) -> None:
        for logger in self.trainer.loggers:
            if hasattr(logger.experiment, "flush"):
                logger.experiment.flush()

    def teardown(self, stage: str) -> None:
        self.close_engines()

    def close_engines(self) -> None:
        """Close every rollout engine (again: a no-op). Also called when a run stops on an
        exception, for which Lightning skips :meth:`teardown`."""
        self.engines.close()
