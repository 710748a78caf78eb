"""PPO-clip policy loss with the aggregation modes, KL and entropy terms used by GRPO variants.

All tensors are token-level ``[B, T]`` (B sequences, T response positions) except
``advantages``, which may be ``[B]`` (one per sequence, broadcast over tokens) or ``[B, T]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["AGGREGATIONS", "LossConfig", "aggregate", "policy_loss", "truncated_importance_weights"]

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(values: Tensor, mask: Tensor, agg: str = "token-mean", norm_len: int | None = None) -> Tensor:
    """Reduce per-token ``values`` ``[B, T]`` to a scalar over the tokens where ``mask`` is set.

    - ``token-mean``: sum over all valid tokens / number of valid tokens (long sequences weigh more).
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): mean over sequences of each sequence's token
      *sum* divided by a constant ``norm_len`` (default ``T``, the padded length of the batch;
      pass the generation budget to make it independent of batch padding), so the loss of a
      sequence does not shrink with its length.

    Sequences without a valid token are left out of the sequence means.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    m = mask.to(values.dtype)
    # where, not a product with the mask: inf or NaN at a masked position must not leak (inf * 0 is NaN)
    values = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    if agg == "token-mean":
        return values.sum() / m.sum().clamp(min=1)
    tokens = m.sum(-1)
    seq_sum = values.sum(-1)
    has_tokens = tokens > 0
    n_seq = has_tokens.sum().clamp(min=1)
    if agg == "seq-mean-token-mean":
        per_seq = seq_sum / tokens.clamp(min=1)
    else:
        per_seq = seq_sum / float(norm_len if norm_len is not None else values.shape[-1])
    return (per_seq * has_tokens).sum() / n_seq


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

    clip_low: float = 0.2
    """PPO lower clip: the ratio is kept >= 1 - clip_low for negative advantages."""
    clip_high: float = 0.2
    """PPO upper clip: the ratio is kept <= 1 + clip_high for positive advantages (DAPO: 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative advantages (None = off)."""
    agg: str = "token-mean"
    """Aggregation (:func:`aggregate`): ``token-mean``, ``seq-mean-token-mean`` or
    ``seq-mean-token-sum-norm`` (the trainer normalises by each policy's length budget,
    ``train_generation.max_new_tokens``)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to a reference (0 = off; > 0: the trainer keeps a frozen copy of
    each policy's initial weights, bf16 where native, and logs ``train/<policy>/kl``)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = off; computing the entropy costs a full softmax)."""

    def __post_init__(self) -> None:
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError(f"clip bounds must be non-negative, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")
        if self.agg not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS}, got {self.agg!r}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")


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
    """PPO-clip policy loss (to minimise) and detached metrics.

    Per token, with ``r = exp(logprobs - old_logprobs)``:
    ``pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``; with ``dual_clip = c > 1``,
    ``pg = min(pg, -A c)`` where ``A < 0`` (bounds the loss of very large ratios);
    ``pg *= importance_weights`` when given; then
    ``loss_t = pg + kl_coef * k3(ref, logprobs) - entropy_coef * entropy``,
    reduced with :func:`aggregate` (``agg``, ``norm_len``).
    ``k3 = exp(ref - logp) - (ref - logp) - 1`` is the low-variance KL estimator.

    Metrics: ``pg_loss``, ``clip_frac_low`` (A < 0 and r < 1 - clip_low), ``clip_frac_high``
    (A > 0 and r > 1 + clip_high), ``clip_frac`` (their sum), ``approx_kl`` (k3 of the old
    policy against the current one), ``ratio_mean``, ``ratio_max``, and ``dual_clip_frac``,
    ``kl``, ``entropy`` when those terms are active. Fractions are over valid tokens.
    """
    clip_low, clip_high, dual_clip, agg = config.clip_low, config.clip_high, config.dual_clip, config.agg
    kl_coef, entropy_coef = config.kl_coef, config.entropy_coef
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
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg1, pg2)
    if dual_clip is not None:
        pg3 = -adv * dual_clip
        dual_bound = (adv < 0) & (pg > pg3)
        pg = torch.where(adv < 0, torch.minimum(pg, pg3), pg)
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

        def frac(cond: Tensor) -> Tensor:
            return (cond & valid).sum() / n

        def mean(x: Tensor) -> Tensor:
            return torch.where(valid, x, torch.zeros_like(x)).sum() / n

        low = frac((adv < 0) & (ratio < 1.0 - clip_low))
        high = frac((adv > 0) & (ratio > 1.0 + clip_high))
        metrics = {
            "pg_loss": aggregate(pg, mask, agg, norm_len).detach(),
            "clip_frac_low": low,
            "clip_frac_high": high,
            "clip_frac": low + high,
            "approx_kl": mean(ratio - 1.0 - log_ratio),
            "ratio_mean": mean(ratio),
            "ratio_max": torch.where(valid, ratio, torch.full_like(ratio, -torch.inf)).max()
            if valid.any()
            else torch.zeros((), dtype=ratio.dtype),
        }
        if dual_clip is not None:
            metrics["dual_clip_frac"] = frac(dual_bound)
        if kl is not None:
            metrics["kl"] = mean(kl)
        if entropy is not None:
            metrics["entropy"] = mean(entropy.detach())
    return loss, {k: v.detach() for k, v in metrics.items()}
