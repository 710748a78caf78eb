"""The policy loss: a registered policy-gradient term (PPO-clip, GSPO, or one of your own), the KL
and entropy terms, and a registered aggregation, as the GRPO variants combine them.

All tensors are token-level ``[B, T]`` (B sequences, T response positions) except
``advantages``, which may be ``[B]`` (one per sequence, broadcast over tokens) or ``[B, T]``.

A variant is a decorated function, selected by name (``--model.loss.name``)::

    @register_loss("my-pg")
    def my_pg(log_ratio, adv, mask, config):
        return -adv * log_ratio.exp(), {}

and an aggregation says how micro-batches' losses add up to the batch's (``weight``), which sets
each micro-batch's loss scale: a new mode declares it, none is inherited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from drmas.registry import Registry

__all__ = ["AGGREGATIONS", "LOSSES", "Aggregation", "LossConfig", "aggregate", "policy_loss",
           "register_aggregation", "register_loss", "truncated_importance_weights"]


@dataclass(frozen=True)
class Aggregation:
    """A reduction of per-token values ``[B, T]`` (zero where masked) to a scalar, and how the
    losses of micro-batches add up to the batch's: ``weight`` ``"tokens"`` (a micro-batch's share
    of the batch is its share of the response tokens) or ``"sequences"`` (of the samples)."""

    reduce: Callable[[Tensor, Tensor, "int | None"], Tensor]
    weight: str


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")

PolicyGradient = Callable[..., "tuple[Tensor, dict[str, Tensor]]"]
"""``fn(log_ratio, adv, mask, config) -> (per-token loss [B, T], metrics)``: the policy-gradient
term of the loss from ``log_ratio = logprobs - old_logprobs`` (with its gradient), the advantages
per token, the mask of valid tokens and the :class:`LossConfig`; masked positions are zero."""

LOSSES: Registry[PolicyGradient] = Registry("policy loss")


def register_aggregation(name: str, weight: str) -> Callable:
    """Register ``reduce(values, mask, norm_len) -> scalar`` as aggregation ``name``."""
    if weight not in ("tokens", "sequences"):
        raise ValueError(f"weight must be 'tokens' or 'sequences', got {weight!r}")

    def deco(fn: Callable) -> Callable:
        AGGREGATIONS.register(name)(Aggregation(fn, weight))
        return fn

    return deco


def register_loss(name: str) -> Callable[[PolicyGradient], PolicyGradient]:
    """Register a policy-gradient term (:data:`PolicyGradient`) as loss ``name``."""
    return LOSSES.register(name)


def _per_sequence(values: Tensor, mask: Tensor, per_seq: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """The mean over sequences with a valid token of ``per_seq(token sums, token counts)``."""
    tokens = mask.to(values.dtype).sum(-1)
    has_tokens = tokens > 0
    return (per_seq(values.sum(-1), tokens) * has_tokens).sum() / has_tokens.sum().clamp(min=1)


@register_aggregation("token-mean", weight="tokens")
def token_mean(values: Tensor, mask: Tensor, norm_len: int | None) -> Tensor:
    """Sum over all valid tokens / their number (long sequences weigh more)."""
    return values.sum() / mask.to(values.dtype).sum().clamp(min=1)


@register_aggregation("seq-mean-token-mean", weight="sequences")
def seq_mean_token_mean(values: Tensor, mask: Tensor, norm_len: int | None) -> Tensor:
    """Mean over sequences of each sequence's token mean."""
    return _per_sequence(values, mask, lambda total, tokens: total / tokens.clamp(min=1))


@register_aggregation("seq-mean-token-sum-norm", weight="sequences")
def seq_mean_token_sum_norm(values: Tensor, mask: Tensor, norm_len: int | None) -> Tensor:
    """Dr. GRPO: mean over sequences of each sequence's token *sum* divided by a constant
    ``norm_len`` (default ``T``, the padded length; the trainer passes the generation budget, so
    it does not depend on padding), so a sequence's loss does not shrink with its length."""
    norm = float(norm_len if norm_len is not None else values.shape[-1])
    return _per_sequence(values, mask, lambda total, tokens: total / norm)


def aggregate(values: Tensor, mask: Tensor, agg: str = "token-mean", norm_len: int | None = None) -> Tensor:
    """Reduce per-token ``values`` ``[B, T]`` to a scalar over the tokens where ``mask`` is set, by the
    registered aggregation ``agg``; sequences without a valid token are left out of sequence means."""
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS.names()}, got {agg!r}")
    # where, not a product with the mask: inf or NaN at a masked position must not leak (inf * 0 is NaN)
    values = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return AGGREGATIONS.get(agg).reduce(values, mask, norm_len)


def truncated_importance_weights(trainer_logprobs: Tensor, engine_logprobs: Tensor,
                                 cap: float = 2.0) -> Tensor:
    """Truncated importance weights ``min(exp(trainer - engine), cap)`` (no gradient).

    Corrects for the rollout engine sampling from slightly different numerics than the trainer
    (e.g. a bf16 vLLM engine vs the training model).
    """
    if cap <= 0:
        raise ValueError(f"cap must be positive, got {cap}")
    return torch.exp(trainer_logprobs.detach() - engine_logprobs.detach()).clamp(max=cap)


@dataclass(frozen=True)
class LossConfig:
    """The terms of the PPO-clip policy loss (``--model.loss.<key>`` for the trainer)."""

    name: str = "ppo-clip"
    """The policy-gradient term, by its registered name (:data:`LOSSES`): ``ppo-clip`` (each token's
    ratio clipped) or ``gspo`` (one length-normalised ratio per sequence, clipped per sequence)."""
    clip_low: float = 0.2
    """PPO lower clip: the ratio is kept >= 1 - clip_low for negative advantages."""
    clip_high: float = 0.2
    """PPO upper clip: the ratio is kept <= 1 + clip_high for positive advantages (DAPO: 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative advantages (None = off)."""
    agg: str = "token-mean"
    """Aggregation (:func:`aggregate`): ``token-mean``, ``seq-mean-token-mean`` or
    ``seq-mean-token-sum-norm`` (the trainer normalises by each policy's length budget,
    ``generation.train.max_new_tokens``)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to a reference (0 = off; > 0: the trainer keeps a frozen copy of
    each policy's initial weights, bf16 where native, and logs ``train/<policy>/kl``)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = off; computing the entropy costs a full softmax)."""
    importance_cap: float | None = 2.0
    """Cap of the truncated importance weights between the trainer's and the engine's log-probs of
    the sampled tokens (:func:`truncated_importance_weights`; None = no correction)."""

    def __post_init__(self) -> None:
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError(f"clip bounds must be non-negative, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")
        if self.agg not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS.names()}, got {self.agg!r}")
        if self.name not in LOSSES:
            raise ValueError(f"loss name must be one of {LOSSES.names()}, got {self.name!r}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.importance_cap is not None and self.importance_cap <= 0:
            raise ValueError(f"importance_cap must be > 0 (or null: no correction), got "
                             f"{self.importance_cap}")


def _clipped(ratio: Tensor, adv: Tensor, mask: Tensor, config: LossConfig) -> tuple[Tensor, dict]:
    """PPO's clipped surrogate of ``ratio`` (and the dual clip), with its clip fractions."""
    valid = mask.bool()
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high))
    n = valid.sum().clamp(min=1)
    low = ((adv < 0) & (ratio < 1.0 - config.clip_low) & valid).sum() / n
    high = ((adv > 0) & (ratio > 1.0 + config.clip_high) & valid).sum() / n
    metrics = {"clip_frac_low": low, "clip_frac_high": high, "clip_frac": low + high}
    if config.dual_clip is not None:
        bound = -adv * config.dual_clip
        metrics["dual_clip_frac"] = (((adv < 0) & (pg > bound)) & valid).sum() / n
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
    return pg, metrics


@register_loss("ppo-clip")
def ppo_clip(log_ratio: Tensor, adv: Tensor, mask: Tensor, config: LossConfig) -> tuple[Tensor, dict]:
    """Per token, ``r = exp(log_ratio)``: ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``;
    with ``dual_clip = c > 1``, ``min(., -A c)`` where ``A < 0``."""
    return _clipped(torch.exp(log_ratio), adv, mask, config)


@register_loss("gspo")
def gspo(log_ratio: Tensor, adv: Tensor, mask: Tensor, config: LossConfig) -> tuple[Tensor, dict]:
    """GSPO (Zheng et al., 2025): one ratio per sequence, ``s = exp(mean over its tokens of
    log_ratio)``, clipped as PPO clips a token's (GSPO uses far smaller clip ranges than PPO's, e.g.
    3e-4 / 4e-4). Each token carries ``s`` with the gradient of its own log-prob (GSPO-token, equal
    to GSPO for a sequence-level advantage); with ``agg: seq-mean-token-mean`` the loss is the
    paper's objective, with ``token-mean`` longer sequences weigh more."""
    m = mask.to(log_ratio.dtype)
    seq = (log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(seq.detach() + log_ratio - log_ratio.detach())  # s, and d log pi per token
    return _clipped(ratio, adv, mask, config)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig = LossConfig(),  # noqa: B008 (frozen)
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    importance_weights: Tensor | None = None,
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss (to minimise) and detached metrics.

    ``pg`` is the registered policy-gradient term ``config.name`` (PPO-clip by default: per token,
    with ``r = exp(logprobs - old_logprobs)``, ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``,
    and ``min(., -A c)`` where ``A < 0`` with ``dual_clip = c > 1``);
    ``pg *= importance_weights`` when given; then
    ``loss_t = pg + kl_coef * k3(ref, logprobs) - entropy_coef * entropy``,
    reduced with :func:`aggregate` (``agg``, ``norm_len``).
    ``k3 = exp(ref - logp) - (ref - logp) - 1`` is the low-variance KL estimator.

    Metrics: ``pg_loss``, the term's own (PPO-clip and GSPO: ``clip_frac_low`` (A < 0 and the
    ratio below 1 - clip_low), ``clip_frac_high`` (A > 0, above 1 + clip_high), ``clip_frac`` (their
    sum), ``dual_clip_frac`` with a dual clip), ``approx_kl`` (k3 of the old policy against the
    current one), ``ratio_mean``, ``ratio_max`` (token ratios), and ``kl``, ``entropy`` when those
    terms are active. Fractions are over valid tokens.
    """
    agg, kl_coef, entropy_coef = config.agg, config.kl_coef, config.entropy_coef
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must have the same shape"
        )
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == logprobs.dim() - 1:
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(logprobs)
    valid = mask.bool()
    # Masked positions are set to 0 before any arithmetic, so that inf or NaN there (a padded
    # position's log-prob) poisons neither the loss nor, through the backward pass, the gradient.
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logprobs, old_logprobs, adv = (torch.where(valid, t, zero) for t in (logprobs, old_logprobs, adv))
    if entropy is not None:
        entropy = torch.where(valid, entropy, zero)
    if ref_logprobs is not None:
        ref_logprobs = torch.where(valid, ref_logprobs, zero)
    if importance_weights is not None:
        importance_weights = torch.where(valid, importance_weights, zero)

    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    pg, pg_metrics = LOSSES.get(config.name)(log_ratio, adv, mask, config)
    if importance_weights is not None:
        pg = pg * importance_weights.detach()
    per_token = pg
    kl = None
    if ref_logprobs is not None:
        d = ref_logprobs.detach() - logprobs
        kl = torch.exp(d) - d - 1.0
        if kl_coef != 0.0:
            per_token = per_token + kl_coef * kl
    if entropy is not None and entropy_coef != 0.0:
        per_token = per_token - entropy_coef * entropy
    loss = aggregate(per_token, mask, agg, norm_len)

    with torch.no_grad():
        n = valid.sum().clamp(min=1)

        def mean(x: Tensor) -> Tensor:
            return torch.where(valid, x, torch.zeros_like(x)).sum() / n

        metrics = {
            "pg_loss": aggregate(pg, mask, agg, norm_len).detach(),
            **pg_metrics,
            "approx_kl": mean(ratio - 1.0 - log_ratio),
            "ratio_mean": mean(ratio),
            "ratio_max": torch.where(valid, ratio, torch.full_like(ratio, -torch.inf)).max()
            if valid.any()
            else torch.zeros((), dtype=ratio.dtype),
        }
        if kl is not None:
            metrics["kl"] = mean(kl)
        if entropy is not None:
            metrics["entropy"] = mean(entropy.detach())
    return loss, {k: v.detach() for k, v in metrics.items()}
