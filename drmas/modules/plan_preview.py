"""``--print_memory_plan DEVICE``: the memory plan a run of this config would print at start on its
GPUs, made on any machine from the models' shapes alone (each model's ``config.json``: a local
directory, or a hub id the local cache holds; no weights, no tokenizer, no GPU), and whether it
fits. ``DEVICE`` names the GPU: ``h100``, ``h200`` or ``a100`` (the memory each reports), a size
in GiB, or ``cuda`` (this machine's first GPU)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import torch

from drmas.engines import parse_settings, resolve_engine
from drmas.modules.memory import GIB, memory_plan, plan_terms
from drmas.modules.policy import agent_policies
from drmas.modules.pools import engine_askers, holdings, pooled, resolve_pools
from drmas.modules.sharding import is_sharded

__all__ = ["DEVICES", "parse_device", "preview"]

DEVICES = {
    "h100": (79.2, "NVIDIA H100 80GB HBM3"),
    "h200": (139.8, "NVIDIA H200"),
    "a100": (79.2, "NVIDIA A100-SXM4-80GB"),  # an engine may size its batches by the name
}
"""GPU kinds by name: the memory torch reports for each (GiB) and its device name."""


def parse_device(text: str) -> tuple[int, str]:
    """``(bytes, name)`` of the GPU ``text`` names (see the module docstring); a bad name is refused
    naming the choices."""
    key = str(text).strip().lower()
    if key in DEVICES:
        gib, name = DEVICES[key]
        return int(gib * GIB), name
    if key == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--print_memory_plan cuda: this machine has no GPU; name one (h100, h200, "
                             "a100) or its memory in GiB")
        props = torch.cuda.get_device_properties(0)
        return props.total_memory, props.name
    try:
        gib = float(key)
    except ValueError:
        gib = -1.0
    if not gib > 0:
        raise ValueError(f"--print_memory_plan takes h100, h200, a100, cuda or a size in GiB, got {text!r}")
    return int(gib * GIB), f"a GPU of {gib:g} GiB"


def _dataclass(value: Any, kind: Any) -> Any:
    """``value`` (a parsed namespace or mapping) as the dataclass type ``kind`` describes."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--value", type=kind)
    plain = value.as_dict() if hasattr(value, "as_dict") else value
    if isinstance(plain, dict):
        plain = {k: v.as_dict() if hasattr(v, "as_dict") else v for k, v in plain.items()}
    return parser.instantiate(parser.parse_object({"value": plain})).value


def _workflow_agents(workflow: Any) -> tuple[str, ...]:
    """The agents a config's workflow has: its class's, else its ``agents`` argument, else none."""
    if isinstance(workflow, str):
        workflow = {"class_path": workflow}
    args = workflow.get("init_args") or {}
    try:
        module, _, name = str(workflow.get("class_path")).rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return ()
    declared = getattr(cls, "agents", None)
    return tuple(args.get("agents") or (declared if isinstance(declared, tuple) else ()))


def preview(config: Any, device: str) -> tuple[str, bool]:
    """The memory plan of ``config`` (a recipe's parsed ``fit`` config) on the GPU ``device`` names,
    and whether it fits; the models are built on the meta device from their ``config.json``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from drmas.models import resolve_model_path
    from drmas.modules.policy_config import PolicyConfig

    device_bytes, device_name = parse_device(device)
    model, trainer, data = config.model, config.trainer, config.data
    team = {name: _dataclass(c, PolicyConfig) for name, c in model.policies.items()}
    engine_name, engine = resolve_engine(model.engine)
    settings = parse_settings(engine_name, engine, dict(model.engine_settings or {}))
    ranks = trainer.devices if isinstance(trainer.devices, int) else len(trainer.devices or [1])
    strategy = trainer.strategy if isinstance(trainer.strategy, str) else "auto"
    policies = {}
    for name, c in team.items():
        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model_path(c.model)))
        policies[name] = SimpleNamespace(name=name, config=c, model=built, trainable=c.trainable,
                                         chunk_tokens=c.update.logprob_chunk_tokens)
    agents = _workflow_agents(data.workflow)
    rollout = data.rollout
    mapping = agent_policies(agents, dict(model.agents or {}), list(team)) if agents else {}
    world = ranks * (trainer.num_nodes or 1)
    tasks = -(-rollout.tasks_per_iteration // max(world, 1))
    pools = resolve_pools(team, world)  # a bad layout refused as the run would refuse it
    askers = engine_askers(pools, world)
    in_flight = {n: tasks * rollout.group_size * list(mapping.values()).count(n) * askers[n] for n in team}
    layout = holdings(pools, world) if pooled(pools, world) else {tuple(team): tuple(range(world))}
    plans, fits = [], True
    for held, on in layout.items():
        if not held:  # a rank that plays rollouts and holds no policy
            continue
        terms = plan_terms({n: policies[n] for n in held}, engine, settings, {n: team[n] for n in held},
                           world, device_bytes, offload=strategy == "fsdp_offload",
                           sharded=is_sharded(strategy) and world > 1, kl=model.loss.kl_coef > 0,
                           awake=rollout.staleness > 0, split=model.engine_placement == "split",
                           mixed=str(trainer.precision or "").startswith("bf16"), device_name=device_name,
                           in_flight={n: in_flight[n] for n in held},
                           shards={n: len(pools[n]) for n in held} if len(layout) > 1 else None)
        text, ok = memory_plan(**terms)
        plans.append(text if len(layout) == 1 else f"ranks {_span(on)} (policies {', '.join(held)}):\n{text}")
        fits = fits and ok
    head = (f"memory plan of this config on {world} x {device_name} ({device_bytes / GIB:.1f} GiB), from the "
            "models' shapes; sequences a rollout sends each policy's engine at once: "
            + ", ".join(f"{n} {k or 'unknown (the engine decides)'}" for n, k in in_flight.items()))
    return "\n".join([head, *plans]), fits


def _span(ranks: tuple[int, ...]) -> str:
    """``0-3`` for contiguous ranks, else the list."""
    contiguous = list(ranks) == list(range(ranks[0], ranks[-1] + 1))
    return f"{ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 1 else ", ".join(map(str, ranks))
