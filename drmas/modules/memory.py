"""The accelerator memory plan printed at start on a GPU: what each policy's training state needs
per device, next to the rollout engines' share, and a refusal with the numbers when it cannot fit.

Counted: fp32 weights, gradients and the two AdamW moments (16 bytes per parameter), divided
over the ranks when sharded and moved to CPU with offloading; a bf16 reference copy when
``kl_coef > 0``; one chunk of fp32 logits (and its softmax and gradient) in the log-prob pass;
the whole copy of the weights an engine keeps beside a sharded policy (``engine`` column:
``EngineSizing.keeps_copy``, for an engine that cannot generate with shards); the engines' fractions of
the device (weights and KV cache) during the rollout; what each engine still holds asleep during
the update (``EngineSizing.asleep_bytes``: an engine process's device context and what its sleep
does not release); one weight transfer's peak (``EngineSizing.transfer_bytes``: its buffer, raised to
the largest tensor, and one gathered tensor beside it, for the policy where that is largest), in
the rollout peak, since the sync runs with the engines' weights awake. On the host: the weights
engines asleep at level 1 keep there (``EngineSizing.asleep_host_bytes``: frozen policies, LoRA bases).
Also in the peaks: FSDP2's root group (embeddings, final norm, head) held unsharded, with its
gradient, from the forward to the end of the backward, and each process's CUDA context (an
estimate). Per engine, what it takes as it starts on its GPU and the KV cache left to it
(``EngineSizing.startup_budgets``: each engine class's own rules, e.g. a profiling pass and CUDA
graphs): an engine whose KV cache cannot hold one sequence is refused here, naming the settings
that would let it start, instead of by the engine itself after the weights loaded.
Once the engines have slept, what each one really holds is measured per process and compared with
the plan (:func:`residue_report`).
Not counted: activations, which depend on sequence lengths and gradient checkpointing; the plan
is therefore a floor, and the refusal only fires for configurations that cannot fit at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from drmas.engines import policy_settings
from drmas.models.shapes import model_shape

__all__ = ["CONTEXT_BYTES", "PLAN_LENGTH", "PolicyMemory", "memory_plan", "plan_length",
           "plan_terms", "policy_memory", "residue_report"]

GIB = 1024**3

CONTEXT_BYTES = GIB // 2
"""A process's CUDA context (and the libraries' workspaces it loads) on a device: an estimate."""

PLAN_LENGTH = 4096
"""The sequence length the memory plan counts for an engine that declares no limit of its own."""


@dataclass(frozen=True)
class PolicyMemory:
    """What the plan needs to know about one policy."""

    name: str
    parameters: int
    vocab_size: int
    chunk_tokens: int
    """Response tokens per log-prob chunk (0 = every position of a micro-batch at once)."""
    tokens_per_micro_batch: int
    """Used for the logits when ``chunk_tokens`` is 0."""
    reference: bool = False
    trainable: bool = True
    """False: a frozen policy, with no gradients, optimiser state or training logits."""
    engine_copy_bytes: float = 0.0
    """A whole copy of the weights the rollout engine keeps on the device at all times
    (``EngineSizing.keeps_copy``)."""
    shards: int = 0
    """The ranks its training state is sharded over (per-policy pools: its pool's); 0: the plan's."""


def policy_memory(policy, kl: bool, max_len: int, engine_copy: bool = False, shards: int = 0) -> PolicyMemory:
    """A :class:`~drmas.modules.policy.Policy`'s entry (``max_len``: longest sequence;
    ``engine_copy``: its engine keeps an unsharded copy in the policy's dtype; ``shards``: its pool's
    ranks)."""
    c = policy.config
    params = sum(p.numel() for p in policy.model.parameters())  # a sharded parameter counts whole
    element = torch.empty((), dtype=getattr(torch, c.dtype)).element_size()
    trainable = policy.trainable
    return PolicyMemory(policy.name, params, policy.model.config.vocab_size, policy.chunk_tokens,
                        c.update.micro_batch_size * max_len, kl and trainable, trainable,
                        params * element if engine_copy else 0.0, shards)


def plan_length(engine: Any, settings: Any, config: Any) -> int:
    """The longest sequence the plan counts for a policy: its engine's limit, else ``PLAN_LENGTH``."""
    return engine.context_limit(policy_settings(settings, config)) or PLAN_LENGTH


def plan_terms(policies: dict[str, Any], engine: Any, settings: Any, team: dict[str, Any], ranks: int,
               device_bytes: int, offload: bool, sharded: bool, kl: bool,
               awake: bool = False, split: bool = False, mixed: bool = False, device_name: str = "",
               in_flight: dict[str, int] | None = None, shards: dict[str, int] | None = None
               ) -> dict[str, Any]:
    """:func:`memory_plan`'s arguments for these policies and their engines (an ``Engine`` class and
    its settings). ``awake``: the engines play rollouts during the update (``--data.rollout.staleness``),
    so the update's peak holds their whole fractions, not what they keep asleep, and an engine that
    could generate with the trained tensors keeps a copy of its own. ``split``: the engines run on a
    GPU of their own (``--model.engine_placement split``): the trainer's holds none of them, only
    the sending side of each weight transfer (their own GPU's budget is in ``budgets``). ``mixed``:
    FSDP2 gathers in bf16 (``bf16-mixed``); ``device_name`` and ``in_flight`` (sequences a rollout
    sends each policy's engine at once) size the engines' start-up (``EngineSizing.startup_budgets``).
    Under per-policy pools ``policies`` and ``team`` are those one device holds, and ``shards`` each one's
    pool size (``ranks``: the world's)."""
    sizing = engine.sizing
    copy = sizing.keeps_copy(sharded or awake) and not split
    fractions = [] if split else sizing.device_fractions(team, settings)
    asleep = ([] if split else [f * device_bytes for f in fractions] if awake
              else sizing.asleep_bytes(team, settings))
    shapes = {n: model_shape(p.model) for n, p in policies.items()}
    transfer = max(sizing.transfer_bytes(policy_settings(settings, p.config), shapes[n].largest, split)
                   for n, p in policies.items())
    parameters = {n: s.parameters for n, s in shapes.items()}
    # FSDP2 keeps the root group (embeddings, final norm, head) gathered from the forward to the end
    # of the backward, with its gradient unsharded until the reduce-scatter: the largest policy's
    root = max((s.root for n, s in shapes.items() if policies[n].trainable), default=0)
    shards = shards or {}
    spread = max((shards.get(n, ranks) for n, p in policies.items() if p.trainable), default=ranks)
    root_bytes = 2 * root * (2 if mixed else 4) if sharded and spread > 1 and not offload else 0.0
    entries = [policy_memory(p, kl, plan_length(engine, settings, p.config), copy, shards.get(n, 0))
               for n, p in policies.items()]
    return dict(policies=entries,
                ranks=ranks, device_bytes=device_bytes,
                engine_fractions=fractions, offload=offload,
                engine_asleep=asleep, transfer_bytes=transfer, awake=awake, split=split,
                host_bytes=0.0 if split else sizing.asleep_host_bytes(team, settings, parameters),
                root_bytes=float(root_bytes), contexts=1 + (0 if split else len(fractions)),
                budgets=sizing.startup_budgets(team, settings, shapes, device_bytes, device_name,
                                               in_flight or {}, split))


def memory_plan(policies: list[PolicyMemory], ranks: int, device_bytes: int, engine_fractions: list[float],
                offload: bool = False, engine_asleep: list[float] = (), transfer_bytes: float = 0.0,
                host_bytes: float = 0.0, awake: bool = False, split: bool = False, root_bytes: float = 0.0,
                contexts: int = 0, budgets: list[Any] = ()) -> tuple[str, bool]:
    """The plan as a table (GiB per device) and whether it fits.

    Engines sleep during the update and the policies' gradients are freed after each step, so the
    two peaks are the update (weights + grads + optimiser + logits of every policy + what each engine
    holds asleep, ``engine_asleep`` in bytes, + FSDP2's unsharded root, ``root_bytes``) and the
    rollout (weights + optimiser + each engine's fraction of the device, ``engine_fractions``, + one
    transfer's staging buffer + the engine processes' CUDA contexts). The trainer's own CUDA context
    is in both (``contexts``: the processes on this device, trainer first; an estimate each).
    ``awake``: the engines play rollouts through the update (``engine_asleep`` then holds their whole
    fractions); ``split``: they run on a GPU of their own (none here, only the weight transfer's
    sending side). ``budgets``: each engine's start-up on its GPU (``EngineSizing.startup_budgets``); one
    whose KV cache cannot hold a sequence makes the plan fail.
    """
    rows, update, resident = [], 0.0, 0.0
    for p in policies:
        state = 0.0 if offload else p.parameters / (p.shards or ranks)
        weights, grads, optim = 4 * state, 4 * state * p.trainable, 8 * state * p.trainable
        ref = 2 * p.parameters / (p.shards or ranks) if p.reference and not offload else 0.0
        tokens = p.chunk_tokens or p.tokens_per_micro_batch
        logits = 3 * 4 * tokens * p.vocab_size * p.trainable  # logits, softmax and their gradient, fp32
        copy = p.engine_copy_bytes  # never sharded, never offloaded
        update += weights + grads + optim + ref + logits + copy
        resident += weights + optim + ref + copy
        rows.append((p.name, weights, grads, optim, ref, logits, copy))
    engines = sum(engine_fractions) * device_bytes
    asleep = float(sum(engine_asleep))
    trainer_context = CONTEXT_BYTES if contexts else 0.0
    engine_contexts = CONTEXT_BYTES * max(contexts - 1, 0)
    update += asleep + root_bytes + trainer_context
    rollout = resident + engines + transfer_bytes + trainer_context + engine_contexts
    pools = {p.shards for p in policies if p.shards and p.shards != ranks}
    over = f"{ranks} rank(s)" if not pools else "each policy over its pool's ranks: " + ", ".join(
        f"{p.name} {p.shards}" for p in policies)
    lines = [f"memory plan per device ({over}, {device_bytes / GIB:.1f} GiB; activations not counted)",
             f"{'policy':12s} {'weights':>8s} {'grads':>8s} {'adam':>8s} {'ref':>8s} "
             f"{'logits':>8s} {'engine':>8s}"]
    lines += [f"{name:12s} " + " ".join(f"{v / GIB:8.2f}" for v in values) for name, *values in rows]
    where = ("on a GPU of their own" if split else
             f"{'awake' if awake else 'asleep'} {asleep / GIB:.2f}")
    lines.append(f"update peak {update / GIB:.2f} GiB (engines {where}); "
                 f"rollout peak {rollout / GIB:.2f} GiB (engines {engines / GIB:.2f} GiB = "
                 f"{' + '.join(f'{f:g}' for f in engine_fractions) or '0'}; weight transfer "
                 f"{transfer_bytes / GIB:.2f})")
    if root_bytes or contexts:
        lines.append(f"in the peaks: FSDP2's unsharded root (the largest policy's embeddings, final norm and "
                     f"head, weights and gradients) {root_bytes / GIB:.2f} in the update; CUDA contexts "
                     f"{CONTEXT_BYTES / GIB:.2f} each (an estimate): the trainer's in both, "
                     f"{max(contexts - 1, 0)} engine process(es)' in the rollout (asleep: in what they hold)")
    lines += [b.line() for b in budgets]
    if host_bytes:
        lines.append(f"host memory per rank: {host_bytes / GIB:.2f} GiB of weights kept by engines asleep "
                     "at level 1 (frozen policies, LoRA bases), times the ranks of a node")
    refused = [b.refusal() for b in budgets if not b.fits]
    lines += refused
    fits = max(update, rollout) <= device_bytes
    if not fits:
        lines.append(f"does not fit in {device_bytes / GIB:.1f} GiB: shard over more ranks "
                     "(--trainer.devices), offload (--trainer.strategy fsdp_offload), lower the engines' "
                     "share (--model.engine_settings) or logprob_chunk_tokens, or use a smaller model")
    return "\n".join(lines), fits and not refused


def residue_report(measured: dict[str, tuple[float, str]], plan: dict) -> list[str]:
    """Lines comparing what each engine holds asleep, ``measured`` per engine as (bytes, how it was
    read), with what the plan counted (``plan``: :func:`memory_plan`'s keyword arguments); and the
    plan again when, with the measured values, it no longer fits."""
    if not measured:
        return []
    planned = list(plan.get("engine_asleep") or [0.0])
    lines = [f"engine {name} asleep holds {got / GIB:.2f} GiB of the device ({how}; the plan counted "
             f"{planned[0] / GIB:.2f})" for name, (got, how) in measured.items()]
    if len(measured) == len(planned):
        text, fits = memory_plan(**{**plan, "engine_asleep": [got for got, _ in measured.values()]})
        if not fits:
            lines.append("with the engines' measured residue the plan no longer fits (expect an "
                         f"out-of-memory in the update):\n{text}")
    return lines
