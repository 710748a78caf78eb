"""What the trainer needs to generate with its policies: its engines as one object
(:class:`RolloutEngines`: one engine per policy, built by its class and agreed on by every rank;
under per-policy pools, connections to the other pools' engines), handing out the ``generate``
function the workflows call (:mod:`drmas.modules.policy_generate`)."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from drmas.engines import Engine, Placement, parse_settings, policy_settings, resolve_engine
from drmas.engines.base import FullState
from drmas.engines.served import EngineClient, RemoteEngine
from drmas.engines.placement import engine_gpu, local_ranks, overlap_cores, pin_process, rank_cores
from drmas.models.shapes import model_shape
from drmas.modules.memory import memory_plan, plan_terms, residue_report
from drmas.modules.policy_generate import BusyClock, PolicyGenerate
from drmas.modules.pools import Pools, engine_askers, holdings
from drmas.ranks import agree, at
from drmas.records import GenerateFn

__all__ = ["RolloutEngines", "engine_seed", "release_cached_memory"]


class RolloutEngines:
    """A rank's rollout engines, one per policy, as one object the trainer holds
    (``MultiAgentRL.engines``): the engine class and its settings, where the engines run, their
    build, weight sync, sleep and reseeding, and the ``generate`` function routed by agent to
    policy.

    ``host``: the trainer it serves, of which it reads the policies and the agent map, the ranks
    and the device, the trainer's strategy and precision (the memory plan), the loss (staleness
    needs importance weights), the stop signal and ``gather_objects`` (the ranks agree on every
    build and sync). Its own state is created here, nothing of it in the host."""

    def __init__(self, host: Any, engine: str, settings: dict[str, Any] | None, placement: str,
                 team: dict[str, Any]) -> None:
        """Resolve the engine (``auto`` picks one), parse its settings and each policy's overrides
        (unknown keys refused by name), and refuse engines that cannot fit, before anything is built."""
        self.host = host
        self.name, self.cls = resolve_engine(engine)
        if placement not in ("shared", "split"):
            raise ValueError(f"--model.engine_placement must be shared or split, got {placement!r}")
        self.placement = placement
        # the engine parses its own settings: their type depends on which engine `auto` picks here
        self.settings = parse_settings(self.name, self.cls, dict(settings or {}))
        for name, config in team.items():  # each policy's overrides, checked before anything is built
            parse_settings(self.name, self.cls, dict(config.engine_settings),
                           f"the engine_settings of policy {name!r}", self.settings)
        self.team = team
        if all(getattr(c, "ranks", None) is None for c in team.values()):  # else per pool (check_pools)
            self.cls.sizing.check_memory(team, self.settings, torch.cuda.is_available(), placement == "split")
        self.built: dict[str, Engine] = {}
        """Each policy's engine, once built (:meth:`build`), of the policies this rank holds."""
        self.remote: dict[str, Engine] = {}
        """Under per-policy pools, each policy other ranks hold: a rank of its pool's engine, reached at
        its address (:class:`~drmas.engines.served.RemoteEngine`), connected after the build."""
        self.pool: dict[str, Engine] = {}  # engines shared by policies (LoRA adapters on one base)
        self.synced: dict[str, int] = {}  # policy -> the weight version its engine serves (-1: none yet)
        self.busy: dict[str, BusyClock] = {}
        self.plan: dict | None = None  # the memory plan's terms (GPU), until the engines first slept
        self.staleness = 0  # set by the rollout side (set_staleness) before the engines are built
        self.cpus: tuple[int, ...] | None = None  # engine processes' cores, when not the rank's
        self.gpu: torch.device | None = None  # the engines' GPU, when not the trainer's

    def check_pools(self, pools: Pools, world_size: int) -> None:
        """Per-policy pools: refuse, before anything is built, engines that cannot fit beside each other
        on a device, for every set of policies some rank holds (its engines share that rank's device)."""
        for held in holdings(pools, world_size):
            if held:
                self.cls.sizing.check_memory({n: self.team[n] for n in held}, self.settings,
                                             torch.cuda.is_available(), self.placement == "split")

    def _team_here(self) -> dict[str, Any]:
        """The settings of the policies whose engines this rank builds (under pools, its own)."""
        pools, rank = self.host.pools, self.host.rank
        return {n: c for n, c in self.team.items() if not pools or rank in pools[n]}

    def _placement(self) -> Placement:
        host = self.host
        return Placement(host.rank, host.local_rank, host.world_size, host.device, host.rank, host._sharded,
                         self.staleness > 0, self.cpus, self.gpu, host.pooled,
                         self._in_flight())

    def _in_flight(self) -> dict[str, int]:
        """Sequences a training rollout sends each policy's engine at once on this rank, at most: the
        rank's tasks x the group size x the agents the policy plays, x the ranks that ask one engine of
        its pool under per-policy pools (none when no rollout data module is attached)."""
        rollouts = getattr(getattr(self.host._trainer, "datamodule", None), "rollouts", None)
        config = getattr(rollouts, "config", None)
        if config is None or not self.host.agent_map:
            return {}
        tasks = -(-config.tasks_per_iteration // self.host.world_size)
        agents = [self.host.policy_of(a) for a in self.host.agent_map]
        askers = engine_askers(self.host.pools, self.host.world_size) if self.host.pools else {}
        return {name: tasks * config.group_size * agents.count(name) * askers.get(name, 1)
                for name in self._team_here()}

    def set_staleness(self, staleness: int) -> None:
        """Rollouts lag ``staleness`` updates (``--data.rollout.staleness``): engines stay awake and
        keep weights of their own; the loss then needs the behaviour policy's importance weights."""
        if staleness and self.host.loss.importance_cap is None:
            raise ValueError(f"--data.rollout.staleness {staleness} trains on samples of older weights: the "
                             "loss corrects for them with truncated importance weights, so "
                             "--model.loss.importance_cap must be set (2.0 is the default; docs/async.md)")
        self.staleness = staleness

    def place(self) -> None:
        """Every rank's engines placed (:meth:`_choose_places`) and checked by their class, agreed by
        every rank before any rank builds an engine; then, on GPUs, the memory plan (refused when it
        does not fit)."""
        failure = None
        try:
            self._choose_places()
            self.cls.check_placement(self._placement())
            if self.host.pooled and not self.cls.own_process(True):
                raise ValueError(f"per-policy pools send agents' calls to other ranks' engines, which must "
                                 f"run in processes of their own: the {self.name} engine does not")
        except ValueError as err:
            failure = err
        self._agree(failure)
        if self.host.device.type != "cuda":  # the plan is about accelerator memory
            return
        device = torch.cuda.get_device_properties(self.host.device)
        trainer = self.host.trainer
        shards = {n: len(self.host.pools[n]) for n in self.host.policies} if self.host.pooled else None
        self.plan = plan_terms(self.host.policies, self.cls, self.settings, self._team_here(),
                               self.host.world_size, device.total_memory,
                               getattr(trainer.strategy, "cpu_offload", False),
                               self.host._sharded, self.host.loss.kl_coef > 0, awake=self.staleness > 0,
                               split=self.gpu is not None, mixed=str(trainer.precision).startswith("bf16"),
                               device_name=device.name, in_flight=self._in_flight(), shards=shards)
        plan, fits = memory_plan(**self.plan)
        rank_zero_info(plan)
        if not fits:
            refused = [b.refusal() for b in self.plan["budgets"] if not b.fits]
            raise ValueError(refused[0] if refused else plan)

    def refuse_unstartable(self) -> None:
        """On a GPU, raise :meth:`startup_refusal`'s line for this rank's GPU, if any."""
        if self.host.device.type == "cuda":
            device = torch.cuda.get_device_properties(self.host.device)
            refusal = self.startup_refusal(device.total_memory, device.name)
            if refusal:
                raise ValueError(refusal)

    def startup_refusal(self, device_bytes: int, device_name: str) -> str | None:
        """The line refusing an engine that could not start on a GPU of ``device_bytes`` (its KV cache
        would not hold one sequence: ``EngineSizing.startup_budgets``), from the models' shapes alone, so
        before any weights are read; None when every engine can start."""
        team = self._team_here()
        shapes = {name: model_shape(self.host.policies[name].model) for name in team}
        budgets = self.cls.sizing.startup_budgets(team, self.settings, shapes, device_bytes, device_name,
                                                  self._in_flight(), self.placement == "split")
        return next((b.refusal() for b in budgets if not b.fits), None)

    def _choose_places(self) -> None:
        """Where this rank's engines run: ``--model.engine_placement split``, on a GPU the trainer
        leaves free (:func:`~drmas.engines.placement.engine_gpu`; engines in processes of their own
        only); else on the trainer's device, on cores of their own on CPU when they play behind the
        update (:func:`~drmas.engines.placement.overlap_cores`)."""
        if self.placement == "split":
            if not self.cls.own_process(True):
                raise ValueError(f"--model.engine_placement split runs engines in processes of their own, "
                                 f"which the {self.name} engine does not")
            count = torch.cuda.device_count() if self.host.device.type == "cuda" else 0
            self.gpu = engine_gpu(self.host.device, self.host.trainer.device_ids, count, self.host.local_rank)
            print(f"[rank {self.host.rank}] engines on {self.gpu} (--model.engine_placement split), "
                  f"the trainer on {self.host.device}", flush=True)
            return
        if not self.staleness or self.host.device.type != "cpu" or not self.cls.own_process(True):
            return  # an engine in a thread of the trainer's shares its cores
        trainer, engines = overlap_cores(rank_cores(self.host.local_rank, local_ranks(self.host.world_size)))
        if trainer != engines:
            self.cpus = tuple(engines)
            pin_process(trainer)
            if self.host.rank == 0:
                print(f"rollouts behind the update: the trainer on cores {trainer}, its engines on "
                      f"{engines}", flush=True)

    def _agree(self, failure: BaseException | None) -> None:
        """A collective: raise this rank's ``failure``, or another rank's, on every rank alike."""
        agree(self.host.gather_objects, self.host.rank, failure)

    def engine(self, name: str) -> Engine:
        """The policy's engine (built at the first call; another rank's under pools, connected at the
        build)."""
        if name in self.remote:
            return self.remote[name]
        if name not in self.built:
            policy = self.host.policies[name]
            own = policy_settings(self.settings, policy.config)
            self.built[name], fresh = self.cls.create(policy, own, self._placement(), self.pool, self.team)
            self.synced[name] = 0 if fresh else -1  # -1: synced before its first use
        return self.built[name]

    def sync_weights(self, seed: int | None = None) -> None:
        """Make every engine serve its policy's current weights (only after they changed, or
        after the engine slept and discarded them), then reseed each from ``seed`` (the rollout's:
        of the run's seed, the rank and the iteration). Engines are built at the first call, and
        the ranks agree that every rank built its own before any weights are gathered for them,
        and that every rank's sync went through: a rank whose engine fails still takes part in
        every gather of the sharded weights that the others make, then every rank raises."""
        at("the weight sync")
        release_cached_memory(self.host.device)
        self.build()
        failure = None
        for name, policy in self.host.policies.items():
            engine = self.engine(name)
            if self.synced[name] != policy.version or engine.asleep:
                weights = FullState(policy.model, engine.transfer_dtype)
                try:
                    if failure is None:  # after a failure: the gathers only
                        engine.sync_weights(weights)
                        self.synced[name] = policy.version
                except Exception as err:  # the engine process died, a transfer failed
                    failure = err
                if self.host._sharded:
                    weights.finish()
        if failure is None:
            try:
                for engine in self.built.values():
                    engine.wake()  # engines that kept their weights asleep and had nothing sent
            except Exception as err:
                failure = err
        self._agree(failure)
        if seed is not None:
            self.reseed(seed)

    def resend(self) -> None:
        """Have the next :meth:`sync_weights` send every policy's weights, as if they had changed."""
        for name in self.host.policies:
            self.synced[name] = -1

    def build(self) -> None:
        """Build the engines this rank does not have yet (one after the other where the engine class
        says so), and agree with every rank that each built its own."""
        if all(name in self.built for name in self.host.policies):
            return
        failure = None
        alone = self.cls.builds_alone(self.host.device)
        try:
            for name in self.host.policies:
                if alone:  # the previous engine finished building before this one starts
                    for engine in self.built.values():
                        engine.ready()
                self.engine(name)
            for engine in self.built.values():
                engine.ready()
        except Exception as err:  # an engine that cannot load on this rank (memory, files)
            failure = err
        self._agree(failure)
        if self.host.pooled:
            self._connect()

    def _connect(self) -> None:
        """Per-policy pools: every rank's engine addresses, gathered (a collective), and a connection to
        an engine of each policy this rank does not hold, on a rank of its pool (rank r asks the pool's
        (r mod size)-th rank, so the pool's ranks share the others' requests)."""
        mine = {name: (getattr(e, "address", None), getattr(e, "key", None))
                for name, e in self.built.items()}
        everyone = self.host.gather_objects(mine)
        for engine in self.built.values():  # its draws independent of the other ranks' requests
            if isinstance(engine, EngineClient):
                engine.seed_prompts()
        failure = None
        try:
            for name in self.host.elsewhere:
                pool = self.host.pools[name]
                owner = pool[self.host.rank % len(pool)]
                address, key = everyone[owner][name]
                if address is None:
                    raise ValueError(f"the {self.name} engine of policy {name!r} on rank {owner} runs in its "
                                     "trainer's process: other ranks cannot reach it")
                self.remote[name] = RemoteEngine(address, key, name, owner, f"rank {self.host.rank}",
                                                 getattr(self.built.get(name), "kind", self.name))
        except Exception as err:
            failure = err
        self._agree(failure)
    def reseed(self, seed: int) -> None:
        """Reseed every engine from ``seed`` (engines drawing from an RNG of their own: a stream each)."""
        for k, engine in enumerate([*self.built.values(), *self.remote.values()]):
            engine.reseed(engine_seed(seed, k))

    def busy_seconds(self) -> dict[str, float]:
        """Seconds each policy's engine answered requests since the last call (overlapping ones once)."""
        return {name: self.busy[name].take() if name in self.busy else 0.0
                for name in [*self.host.policies, *self.remote]}

    def cache_stats(self) -> tuple[int, int]:
        """``(prompt tokens, of which from a prefix cache)`` of this rank's engines since the last call."""
        stats = [e.take_cache_stats() for e in [*self.built.values(), *self.remote.values()]]
        return sum(s[0] for s in stats), sum(s[1] for s in stats)

    def generate_fn(self, train: bool) -> GenerateFn:
        """The ``generate(agent, prompts, n)`` function workflows call, routed by policy."""
        return PolicyGenerate(self, train)

    def sleep(self, report: bool) -> None:
        """The rollout is done: engines give their accelerator memory to the update (those that can
        sleep; a no-op for the rest) until the next :meth:`sync_weights` wakes them; rollouts played
        behind the update keep them awake. After the first sleep on a GPU, what it really left is
        printed against the memory plan (``report``: on this rank)."""
        for engine in self.built.values() if not self.staleness else ():  # (split: no-op)
            engine.sleep()
        if self.plan is not None and report:
            for line in residue_report({n: e.asleep_measured for n, e in self.built.items()
                                        if e.asleep_measured is not None}, self.plan):
                print(line, flush=True)
        self.plan = None

    def close(self) -> None:
        """Close every engine (again: a no-op); under per-policy pools, first say what each engine of
        this rank answered, per asking rank."""
        for engine in self.remote.values():
            engine.close()
        self.remote.clear()
        if self.host.pooled:
            for name, engine in self.built.items():
                try:
                    served = engine.served()["requests"]
                except Exception:  # a dead or in-process engine: nothing to say
                    continue
                asked = ", ".join(f"{'this rank' if k == 'owner' else k}: {n}"
                                  for k, n in sorted(served.items()))
                print(f"[rank {self.host.rank}] the {self.name} engine of policy {name} answered {asked}",
                      flush=True)
        for engine in self.built.values():
            engine.close()
        self.built.clear()
        self.pool.clear()


def release_cached_memory(device: Any) -> None:
    """Hand the trainer's cached accelerator memory back before any engine wakes: what the update freed
    (activations, gradients, FSDP buffers, a transfer's buffer) stays reserved in torch's caching
    allocator otherwise, and an engine waking its weights and KV cache could run out of memory."""
    if getattr(device, "type", "cpu") == "cuda":
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def engine_seed(rollout_seed: int, k: int) -> int:
    """The seed of a rank's ``k``-th engine for a rollout of ``rollout_seed``."""
    return (rollout_seed * 1_000_033 + k) % 2**63
