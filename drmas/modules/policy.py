"""One trainable policy: a causal LM, its tokenizer, and its own optimiser and generation settings."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import logging
from typing import Iterator, Sequence

import torch
from torch import nn

from drmas.hardware import compute_device, fast_dtype
from drmas.models import load_causal_lm, load_tokenizer
from drmas.models.lora import activate, adapter_parameters, add_lora
from drmas.models.sharded_loading import empty_causal_lm, load_shards
from drmas.modules.policy_config import PolicyConfig, lr_factor
from drmas.tool_calls import resolve_format
from drmas.modules.logprobs import (attention_window, chunked_logprobs_match, full_logprobs,
                                    packed_logprobs_match, response_logprobs)
from drmas.records import MicroBatch

__all__ = ["Policy", "PolicyConfig", "agent_policies", "deferred_weights", "make_policies"]

log = logging.getLogger(__name__)


class Policy(nn.Module):
    """A policy's model and tokenizer; the tokenizer is left out of the state dict."""

    def __init__(self, name: str, config: PolicyConfig, reference: bool = False, prefix_sharing: bool = False,
                 shared: Policy | None = None) -> None:
        """``reference``: also keep a frozen copy of the initial model, bf16 where native (for a KL
        penalty; a LoRA policy's reference is its base, with the adapter switched off: no copy).
        ``prefix_sharing``: pack shared prompt prefixes in training, where the model allows it.
        ``shared``: a LoRA policy whose base (and tokenizer) this one shares."""
        super().__init__()
        self.name, self.config = name, config
        self.adapter: str | None = name if config.lora is not None else None
        # weights on the meta device until load_weights (FSDP: each rank reads only its shards)
        self.deferred = _DEFER.get() and shared is None and self.adapter is None
        if shared is not None:
            self.model, self.tokenizer = add_lora(shared.model, name, config.lora), shared.tokenizer
        elif self.deferred:
            self.model, self.tokenizer = (empty_causal_lm(config.model, config.dtype),
                                          load_tokenizer(config.model))
        else:
            self.model, self.tokenizer = load_causal_lm(config.model, dtype=config.dtype)
            if config.lora is not None:
                self.model = add_lora(self.model, name, config.lora)
        try:  # a named tool format the template cannot render is refused now, not at the first request
            resolve_format(config.tool_format, self.tokenizer.chat_template)
        except ValueError as err:
            raise ValueError(f"policy {name!r}: {err}") from None
        self.model_config = self.model.config  # kept where another rank holds the weights (pools)
        self.trainable = config.trainable
        if not self.trainable:
            self.model.requires_grad_(False)
        self.reference: nn.Module | None = None
        if reference and self.adapter is None and self.trainable:
            # bf16 halves its memory where it is native (it only ever runs without gradients);
            # where bf16 is emulated it would be the slowest forward of the update
            dtype = fast_dtype(compute_device(), next(self.model.parameters()).dtype)
            ref = (empty_causal_lm(config.model, dtype) if self.deferred
                   else copy.deepcopy(self.model).to(dtype))
            self.reference = ref.eval().requires_grad_(False)
        self.model.train()  # from_pretrained returns eval mode; the engines switch modes as they need
        if config.update.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            if self.adapter is not None:  # the frozen embeddings' output must carry a gradient
                self.model.enable_input_require_grads()
        self.version = 0  # optimiser steps taken; engines compare it to know when to re-sync
        self.chunk_tokens, self.prefix_sharing = config.update.logprob_chunk_tokens, prefix_sharing
        self.attention_window = attention_window(self.model.config)
        if not self.deferred:
            self._check_model()

    def load_weights(self, device: torch.device, mixed_precision: bool = False) -> str:
        """Give a deferred policy (and its reference) its weights on ``device``, each rank reading
        only its shards once the model is sharded (:func:`~drmas.models.sharded_loading.load_shards`);
        then check what the model allows (``mixed_precision``: it now computes in bf16). Returns
        how the weights were read."""
        how = load_shards(self.model, self.config.model, device)
        if self.reference is not None:
            load_shards(self.reference, self.config.model, device)
        self.deferred = False
        self._check_model(atol=2e-2 if mixed_precision else 1e-4)
        return how

    def _check_model(self, atol: float = 1e-4) -> None:
        """Fall back where the model cannot take the chunked log-probs or packed rows (each checked
        on a few tokens, to ``atol``: two bf16 kernels need not agree to fp32's 1e-4, while a model
        that post-processes its logits or ignores the block mask is off by far more), once, with a
        warning."""
        name, kind = self.name, type(self.model).__name__
        if self.chunk_tokens and not chunked_logprobs_match(self.model, atol):
            log.warning("policy %s: %s post-processes its logits; log-probs use the full-logits path",
                        name, kind)
            self.chunk_tokens = 0
        wanted = self.prefix_sharing
        self.prefix_sharing = wanted and self.chunk_tokens > 0 and packed_logprobs_match(self.model, atol)
        if wanted and not self.prefix_sharing:
            log.warning("policy %s: %s cannot run packed shared prefixes (needs SDPA or eager attention and "
                        "the chunked log-probs); every sample runs its whole prompt", name, kind)
        if self.prefix_sharing and self.attention_window is not None:
            log.warning("policy %s: %s attends within a sliding window of %d tokens, which packed rows "
                        "cannot follow: shared prefixes are packed only in micro-batches whose every sample "
                        "fits in it, the others run whole samples", name, kind, self.attention_window)

    def token_logprobs(self, batch: MicroBatch, temperature: float, with_entropy: bool = False,
                       reference: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[B, L-1]`` log-probs of each response token from logits / temperature (as the engine
        sampled), and entropies if asked; 0 at prompt and padding positions. ``reference``: those
        of the frozen reference (a LoRA policy's: its base, the adapter switched off)."""
        self.activate()
        if reference and self.adapter is not None:
            with self.model.disable_adapter():
                return self._token_logprobs(self.model, batch, temperature, False)
        model = self.reference if reference and self.reference is not None else self.model
        return self._token_logprobs(model, batch, temperature, with_entropy and not reference)

    def _token_logprobs(self, model: nn.Module, batch: MicroBatch, temperature: float,
                        with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.chunk_tokens:
            return response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                                     temperature, with_entropy, self.chunk_tokens, batch.packed)
        logp, entropy = full_logprobs(model, batch.input_ids, batch.attention_mask, temperature, with_entropy)
        zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
        mask = batch.response_mask
        return torch.where(mask, logp, zero), None if entropy is None else torch.where(mask, entropy, zero)

    def activate(self) -> None:
        """Select this policy's adapter on a (possibly shared) LoRA base; nothing otherwise."""
        if self.adapter is not None:
            activate(self.model, self.adapter)

    def describe(self, engine: str) -> str:
        """One line for the console: model, size, what is trained, dtype, engine."""
        total = sum(p.numel() for p in self.model.parameters())
        trained = sum(p.numel() for p in self.trainable_parameters())
        what = ("frozen" if not self.trainable
                else f"LoRA adapter {trained / 1e6:.2f}M trained" if self.adapter
                else "all trained")
        return (f"policy {self.name}: {self.config.model}, {total / 1e6:.1f}M parameters ({what}), "
                f"{self.config.dtype}, {engine} engine")

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What this policy's optimiser steps: its adapter, or every weight of its model (nothing
        when it is frozen)."""
        if not self.trainable:
            return []
        if self.adapter is not None:
            return adapter_parameters(self.model, self.adapter)
        return list(self.model.parameters())

    def train(self, mode: bool = True) -> "Policy":
        super().train(mode)
        if self.reference is not None:
            self.reference.eval()  # frozen: never dropout, whatever mode training puts us in
        return self

    def make_optimizer(self, total_iterations: int) -> tuple[torch.optim.Optimizer,
                                                             torch.optim.lr_scheduler.LambdaLR]:
        c = self.config.optim
        # The fused kernel wherever it exists. On GPUs the default (foreach) step allocates
        # temporaries as large as all parameters together (another 4 bytes/parameter, 32 GB for
        # 8B in fp32); on CPUs the default is a loop over tensors, 13x slower (135M: 2.1 s
        # against 0.16 s a step on 2 cores), the same numbers to one rounding.
        params = self.trainable_parameters()
        fused = True if params and all(p.device.type in ("cuda", "cpu") for p in params) else None
        opt = torch.optim.AdamW(params, lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay,
                                fused=fused)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda it: lr_factor(c, it, total_iterations))


_DEFER: contextvars.ContextVar[bool] = contextvars.ContextVar("drmas_deferred_weights", default=False)


@contextlib.contextmanager
def deferred_weights(enabled: bool = True) -> Iterator[None]:
    """Policies built inside get their weights later, from ``Policy.load_weights`` (which
    ``MultiAgentRL.configure_model`` calls after sharding): no rank ever holds a whole model. The
    CLI builds the model inside it for ``fit`` with ``--trainer.strategy fsdp``."""
    token = _DEFER.set(enabled)
    try:
        yield
    finally:
        _DEFER.reset(token)


def make_policies(configs: dict[str, PolicyConfig], reference: bool = False,
                  prefix_sharing: bool = False) -> dict[str, Policy]:
    """The policies by name; those whose adapters say ``share_base`` hold them on one base model,
    loaded once (they must name the same model and dtype)."""
    sharing = {name: c for name, c in configs.items() if c.share_base}
    if len({(c.model, c.dtype) for c in sharing.values()}) > 1:
        named = ", ".join(f"{name}: {c.model} ({c.dtype})" for name, c in sharing.items())
        raise ValueError(f"policies whose lora says share_base must name the same base model and dtype, "
                         f"got {named}")
    policies: dict[str, Policy] = {}
    first: Policy | None = None
    for name, cfg in configs.items():
        policies[name] = Policy(name, cfg, reference, prefix_sharing,
                                shared=first if cfg.share_base else None)
        if cfg.share_base and first is None:
            first = policies[name]
    return policies


def agent_policies(agents: Sequence[str], asked: dict[str, str], policies: list[str]) -> dict[str, str]:
    """Each agent's policy: as ``asked`` (``--model.agents``), else the only policy, else the policy
    named like the agent; an agent without one, a policy that does not exist or an agent asked for
    that the workflow does not have is refused, naming it."""
    mapping = {}
    for agent in agents:
        if agent in asked:
            mapping[agent] = asked[agent]
        elif len(policies) == 1:
            mapping[agent] = policies[0]
        elif agent in policies:
            mapping[agent] = agent
        else:
            raise ValueError(f"agent {agent!r} has no policy: set --model.agents (policies: {policies})")
    bad = {a: p for a, p in mapping.items() if p not in policies}
    if bad:
        raise ValueError(f"agents mapped to unknown policies: {bad}; policies: {policies}")
    unknown = set(asked) - set(agents)
    if unknown:
        raise ValueError(f"--model.agents names unknown agents {sorted(unknown)}; agents: {list(agents)}")
    return mapping
