"""What the trainer needs to generate with its policies: its engines as one object
(:class:`RolloutEngines`: one engine per policy, built by its class and agreed on by every rank),
the ``generate`` function the workflows call, the chat prompt's token ids, and the engine call
that names the policy and the agent when it fails."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any, Sequence

import torch
from lightning.pytorch.utilities import rank_zero_info

from drmas.engines import Engine, EngineError, Placement, parse_settings, policy_settings, resolve_engine
from drmas.engines.base import FullState
from drmas.engines.placement import engine_gpu, local_ranks, overlap_cores, pin_process, rank_cores
from drmas.models.shapes import model_shape
from drmas.modules.memory import memory_plan, plan_terms, residue_report
from drmas.ranks import agree, at
from drmas.records import ChatPrompt, Completion, GenerateFn, GenerationSettings
from drmas.tool_calls import fallback_messages, resolve_format

__all__ = ["BusyClock", "PolicyGenerate", "RolloutEngines", "encode_prompt", "engine_seed",
           "release_cached_memory", "run_engine"]


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
        self.cls.sizing.check_memory(team, self.settings, torch.cuda.is_available(), placement == "split")
        self.built: dict[str, Engine] = {}
        """Each policy's engine, once built (:meth:`build`)."""
        self.pool: dict[str, Engine] = {}  # engines shared by policies (LoRA adapters on one base)
        self.synced: dict[str, int] = {}  # policy -> the weight version its engine serves (-1: none yet)
        self.busy: dict[str, BusyClock] = {}
        self.plan: dict | None = None  # the memory plan's terms (GPU), until the engines first slept
        self.staleness = 0  # set by the rollout side (set_staleness) before the engines are built
        self.cpus: tuple[int, ...] | None = None  # engine processes' cores, when not the rank's
        self.gpu: torch.device | None = None  # the engines' GPU, when not the trainer's

    def _placement(self) -> Placement:
        host = self.host
        return Placement(host.rank, host.local_rank, host.world_size, host.device, host.rank, host._sharded,
                         self.staleness > 0, self.cpus, self.gpu, self._in_flight())

    def _in_flight(self) -> dict[str, int]:
        """Sequences a training rollout sends each policy's engine at once on this rank, at most: the
        rank's tasks x the group size x the agents the policy plays (none when no rollout data
        module is attached)."""
        rollouts = getattr(getattr(self.host._trainer, "datamodule", None), "rollouts", None)
        config = getattr(rollouts, "config", None)
        if config is None or not self.host.agent_map:
            return {}
        tasks = -(-config.tasks_per_iteration // self.host.world_size)
        agents = [self.host.policy_of(a) for a in self.host.agent_map]
        return {name: tasks * config.group_size * agents.count(name) for name in self.host.policies}

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
        except ValueError as err:
            failure = err
        self._agree(failure)
        if self.host.device.type != "cuda":  # the plan is about accelerator memory
            return
        device = torch.cuda.get_device_properties(self.host.device)
        trainer = self.host.trainer
        self.plan = plan_terms(self.host.policies, self.cls, self.settings, self.team, self.host.world_size,
                               device.total_memory, getattr(trainer.strategy, "cpu_offload", False),
                               self.host._sharded, self.host.loss.kl_coef > 0, awake=self.staleness > 0,
                               split=self.gpu is not None, mixed=str(trainer.precision).startswith("bf16"),
                               device_name=device.name, in_flight=self._in_flight())
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
        shapes = {name: model_shape(p.model) for name, p in self.host.policies.items()}
        budgets = self.cls.sizing.startup_budgets(self.team, self.settings, shapes, device_bytes, device_name,
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
        """The policy's engine (built at the first call)."""
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

    def reseed(self, seed: int) -> None:
        """Reseed every engine from ``seed`` (engines drawing from an RNG of their own: a stream each)."""
        for k, engine in enumerate(self.built.values()):
            engine.reseed(engine_seed(seed, k))

    def busy_seconds(self) -> dict[str, float]:
        """Seconds each policy's engine answered requests since the last call (overlapping ones once)."""
        return {name: self.busy[name].take() if name in self.busy else 0.0 for name in self.host.policies}

    def cache_stats(self) -> tuple[int, int]:
        """``(prompt tokens, of which from a prefix cache)`` of this rank's engines since the last call."""
        stats = [e.take_cache_stats() for e in self.built.values()]
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
        """Close every engine (again: a no-op)."""
        for engine in self.built.values():
            engine.close()
        self.built.clear()
        self.pool.clear()


class PolicyGenerate:
    """``generate(agent, prompts, n)`` on the agent's policy with its train or eval generation settings, and
    what an endpoint needs to answer within that policy (:meth:`settings`, :meth:`prompt_tokens`)."""

    def __init__(self, engines: RolloutEngines, train: bool) -> None:
        self.engines, self.module, self.train = engines, engines.host, train

    def _policy(self, agent: str) -> Any:
        return self.module.policies[self.module.policy_of(agent)]

    def _params(self, policy: Any) -> Any:
        return policy.config.generation.train if self.train else policy.config.generation.eval

    def check_stop(self) -> None:
        """Raise when this rank was preempted (SIGTERM)."""
        self.module.stop_signal.raise_if_requested()

    def __call__(self, agent: str, prompts: Sequence[ChatPrompt], n: int) -> list[list[Completion]]:
        if not prompts:
            return []
        self.check_stop()  # preempted: stop before the next request, not after the rollout
        policy = self._policy(agent)
        params = self._params(policy)
        # each prompt its own stop strings and length, within the policy's budget
        stops = [list(dict.fromkeys([*params.stop, *p.stop])) for p in prompts]
        budgets = [params.max_new_tokens if p.max_new_tokens is None
                   else min(p.max_new_tokens, params.max_new_tokens)
                   for p in prompts]  # a budget below 1 is refused by the engine, naming the prompt
        config = policy.config
        ids = [encode_prompt(policy.tokenizer, p, config.chat_template_kwargs, config.tool_format)
               for p in prompts]
        with self.engines.busy.setdefault(policy.name, BusyClock()):
            outs = run_engine(self.engines.engine(policy.name), self.engines.name, policy.name, agent,
                              ids, n, params, stops, budgets)
        # what the agent's parser reads: the prefill it was given, then the response
        return [[dataclasses.replace(c, text=p.prefill + c.text) for c in completions]
                for p, completions in zip(prompts, outs)]

    def settings(self, agent: str) -> GenerationSettings:
        """The agent's policy's sampling and length budget."""
        return self._params(self._policy(agent))

    def context_length(self, agent: str) -> int | None:
        """The agent's engine's context length, else its model's position limit."""
        policy = self._policy(agent)
        engine = self.engines.built.get(policy.name)
        return (getattr(engine, "context_length", None)
                or getattr(policy.model.config, "max_position_embeddings", None))

    def prompt_tokens(self, agent: str, prompt: ChatPrompt) -> int:
        policy = self._policy(agent)
        return len(encode_prompt(policy.tokenizer, prompt, policy.config.chat_template_kwargs,
                                 policy.config.tool_format))

    def tool_format(self, agent: str) -> tuple[str, Any]:
        policy = self._policy(agent)
        return resolve_format(policy.config.tool_format, policy.tokenizer.chat_template)[0], policy.tokenizer

    def tokenizer(self, agent: str) -> Any:
        return self._policy(agent).tokenizer


class BusyClock:
    """Seconds of requests in flight (``with clock:`` around each): requests that overlap, from the
    episode loop's threads, count once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open, self._since, self._total = 0, 0.0, 0.0

    def __enter__(self) -> None:
        with self._lock:
            if not self._open:
                self._since = time.perf_counter()
            self._open += 1

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self._open -= 1
            if not self._open:
                self._total += time.perf_counter() - self._since

    def take(self) -> float:
        """The seconds since the last call (a request still in flight counts up to now)."""
        with self._lock:
            now = time.perf_counter()
            total = self._total + (now - self._since if self._open else 0.0)
            self._total, self._since = 0.0, now
            return total


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


def encode_prompt(tokenizer, prompt: ChatPrompt, template_kwargs: dict[str, Any] | None = None,
                  tool_format: str = "auto") -> list[int]:
    """Token ids of the chat prompt with the generation header and the assistant prefill; tools
    and tool calls rendered by the template where it takes them (earlier calls' arguments as
    objects, as serving engines pass them: templates that apply ``tojson`` would show a string encoded
    twice), else in the hermes format. A message's ``name`` is given to a template that reads it;
    elsewhere it prefixes a user's, system's or tool's content and is left out of an assistant's
    (whose content is what the policy itself wrote)."""
    messages = [{"role": r, "content": c} for r, c in prompt.messages]
    template = tokenizer.chat_template or ""
    takes_name = any(f"message{k}" in template for k in (".name", "['name']", '["name"]'))
    for m, extra in zip(messages, prompt.fields):
        m.update(json.loads(extra) if extra else {})
        name = m.get("name") if not takes_name else None
        if name is not None:
            del m["name"]
            if m["role"] != "assistant":
                m["content"] = f"{name}: {m['content']}"
    kwargs = {**(template_kwargs or {}),  # the request's own variables over the policy's
              **(json.loads(prompt.template_kwargs) if prompt.template_kwargs else {})}
    if prompt.tools or any("tool_calls" in m or "tool_call_id" in m for m in messages):
        tools = [json.loads(t) for t in prompt.tools]
        if resolve_format(tool_format, template)[1]:
            kwargs["tools"] = tools or None
            for m in messages:
                for c in m.get("tool_calls") or ():
                    fn = c.get("function") or {}
                    if isinstance(fn.get("arguments"), str):
                        fn["arguments"] = _json_object(fn["arguments"])
        else:
            messages = fallback_messages(messages, tools)
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    ) + prompt.prefill
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # as the program sent it


def run_engine(engine: Any, kind: str, policy: str, agent: str, ids: list[list[int]], n: int, params: Any,
               stops: Any = None, max_new_tokens: Any = None) -> Any:
    """``engine.generate(ids, n, params, stops, max_new_tokens)``; any failure re-raised as
    :class:`EngineError` naming the policy and the agent, so a lost device or a bad request says
    whose rollout it ended."""
    try:
        return engine.generate(ids, n, params, stops, max_new_tokens)
    except Exception as err:
        raise EngineError(f"the {kind} engine of policy {policy!r} failed generating for agent {agent!r} "
                          f"({len(ids)} prompts x {n}): {type(err).__name__}: {err}") from err
