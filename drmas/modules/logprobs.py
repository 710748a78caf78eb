"""Log-probs (and entropy) of the response tokens, without a ``[batch, length, vocab]`` tensor.

The trainer needs ``log softmax(logits / T)`` at the sampled token of every response position,
nothing at prompt positions. The plain way (``model(...).logits``) projects every position of
every sequence onto the vocabulary in fp32: 4 sequences of 2,064 tokens with SmolLM2's 49,152
tokens are 1.6 GB, with Qwen3's 151,936 tokens and 8 x 4,500 tokens 22 GB, before the softmax
and its gradient. Here the decoder's hidden states are sliced to the response positions first,
then the vocabulary projection, log-softmax and gather run over chunks of ``chunk_tokens``
tokens, under activation checkpointing where there are several: forward and backward hold one
chunk's logits at a time.
The same code serves FSDP2-sharded models (see :func:`_decoder_states`).

The chunked path needs ``logits == lm_head(decoder(x))``. Models that post-process their logits
(soft-capping, scaling) fail :func:`chunked_logprobs_match` and use the full-logits path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from drmas.packing import MIN_SHARED_TOKENS, pack_shared_prefixes, pad_samples
from drmas.records import Sample, PackedRows

__all__ = ["block_mask", "chunked_logprobs_match", "full_logprobs", "packed_logprobs_match",
           "response_logprobs"]


BLOCK_BYTES = 2 * 2**20
"""On a CPU, the fp32 logits of one block of rows (the vocabulary's width, a few rows): small
enough to stay in a core's cache while it is exponentiated, scaled and written back."""


def _rows_per_block(logits: Tensor) -> int:
    """Rows a block takes: on a GPU every row at once (its kernels stream from memory anyway, and a
    few rows a launch would be thousands of launches; not exercised by the CPU test suite)."""
    if logits.device.type != "cpu":
        return max(1, logits.shape[0])
    return max(1, BLOCK_BYTES // (4 * logits.shape[-1]))


def _scaled(logits: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """A block of logits in ``dtype``, a copy of its own (the caller works on it in place), over T."""
    z = logits.to(dtype, copy=True)
    return z.div_(temperature) if temperature > 0 and temperature != 1 else z


class TokenLogprobs(torch.autograd.Function):
    """``log softmax(logits / T)`` at the targets of ``[N, V]`` logits (and the entropy), in fp32.

    Autograd over the plain formula (cast, divide, logsumexp, gather) keeps several ``[N, V]``
    fp32 tensors and walks them a dozen times; the backward of the gather alone fills a zero
    tensor of that size to scatter into. Here forward and backward go a block of rows at a time
    (:data:`BLOCK_BYTES`) and backward writes the logits' gradient once, in their own dtype:
    ``dz = -g p + g onehot`` and, for the entropy ``H = lse - sum p z``, ``dz = -g_H p (z - sum p z)``.
    With the single chunk's recomputation dropped, W1's update went from 6.71 s to 6.07 s
    (docs/performance.md, "Per-phase limits")."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, temperature: float,
                with_entropy: bool) -> tuple[Tensor, Tensor]:
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        rows = logits.shape[0]
        lse = torch.empty(rows, dtype=dtype, device=logits.device)
        mean = torch.empty(rows if with_entropy else 0, dtype=dtype, device=logits.device)  # sum p z
        step = _rows_per_block(logits)
        for start in range(0, rows, step):
            end = start + step
            z = _scaled(logits[start:end], dtype, temperature)
            lse[start:end] = torch.logsumexp(z, -1)
            if with_entropy:
                mean[start:end] = (torch.exp(z - lse[start:end, None]) * z).sum(-1)
        picked = _scaled(logits.gather(-1, targets[:, None]).squeeze(-1), dtype, temperature)
        ctx.save_for_backward(logits, targets, lse, mean)
        ctx.temperature, ctx.with_entropy, ctx.step = temperature, with_entropy, step
        entropy = lse - mean if with_entropy else lse.new_zeros(())
        ctx.mark_non_differentiable(*(() if with_entropy else (entropy,)))
        return picked - lse, entropy

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor, g_entropy: Tensor) -> tuple[Tensor, None, None, None]:
        logits, targets, lse, mean = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.step):
            end = start + ctx.step
            z = _scaled(logits[start:end], lse.dtype, ctx.temperature)
            g = g_logp[start:end, None].to(lse.dtype)
            if ctx.with_entropy:
                p = torch.exp(z - lse[start:end, None])
                dz = p.mul_(z.sub_(mean[start:end, None]).mul_(g_entropy[start:end, None]).add_(g)).neg_()
            else:
                dz = torch.exp_(z.sub_(lse[start:end, None])).mul_(g).neg_()
            dz.scatter_add_(-1, targets[start:end, None], g)
            if ctx.temperature > 0 and ctx.temperature != 1:
                dz.div_(ctx.temperature)
            grad[start:end] = dz
        return grad, None, None, None


def _from_logits(logits: Tensor, targets: Tensor, temperature: float,
                 with_entropy: bool) -> tuple[Tensor, Tensor]:
    logp, entropy = TokenLogprobs.apply(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                        temperature, with_entropy)
    return logp.view(targets.shape), entropy.view(targets.shape) if with_entropy else entropy


def full_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float,
                  with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """``[B, L-1]`` log-probs of each next token (and entropies) from the full logits."""
    # no KV cache: nothing is decoded here, and with gradient checkpointing it is refused anyway
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    logp, entropy = _from_logits(logits, input_ids[:, 1:], temperature, with_entropy)
    return logp, entropy if with_entropy else None


def block_mask(segments: Tensor, boolean: bool) -> Tensor:
    """``[R, 1, L, L]`` attention mask of packed rows (:class:`~drmas.records.PackedRows`): a token
    sees the earlier tokens of the shared prefix and of its own segment (padding sees padding).
    Boolean (True = attend) for SDPA, additive float for eager attention."""
    idx = torch.arange(segments.shape[1], device=segments.device)
    causal = idx[None, :] <= idx[:, None]
    q, k = segments[:, :, None], segments[:, None, :]
    allow = causal & (((k == 0) & (q >= 0)) | (k == q))
    if boolean:
        return allow[:, None]
    return (torch.zeros(allow.shape, device=segments.device)
            .masked_fill(~allow, torch.finfo(torch.float32).min)[:, None])


def _decoder_states(model: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                    position_ids: Tensor | None = None) -> Tensor:
    """The decoder's last hidden states, taken during the model's own forward pass.

    Going through the root ``forward`` (not calling the decoder directly) matters for sharded
    models: FSDP gathers the root's parameters (embeddings, final norm, head) in the root's forward
    and keeps them gathered until the backward, so the head can be applied to the chunks after it.
    ``logits_to_keep=1`` makes the model's own head project one position per sequence.
    """
    captured: list[Tensor] = []
    handle = model.get_decoder().register_forward_hook(
        lambda mod, args, out: captured.append(out.last_hidden_state))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
              logits_to_keep=1)
    finally:
        handle.remove()
    return captured[-1]


def response_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor,
                      temperature: float, with_entropy: bool = False, chunk_tokens: int = 1024,
                      packed: PackedRows | None = None) -> tuple[Tensor, Tensor | None]:
    """``[B, L-1]`` log-probs (and entropies) at the positions of ``response_mask``, 0 elsewhere;
    the vocabulary projection runs ``chunk_tokens`` positions at a time. With ``packed`` the
    decoder runs the packed rows instead (shared prefixes once); the result is the same."""
    if packed is None:
        hidden = _decoder_states(model, input_ids, attention_mask)
        h = hidden[:, :-1][response_mask]  # [T, H]: response positions only
    else:
        mask = block_mask(packed.segments, model.config._attn_implementation == "sdpa")
        h = _decoder_states(model, packed.input_ids, mask, packed.position_ids)[packed.rows, packed.cols]
    targets = input_ids[:, 1:][response_mask]
    head = model.get_output_embeddings()

    def chunk(hc: Tensor, tc: Tensor) -> tuple[Tensor, Tensor]:
        return _from_logits(head(hc), tc, temperature, with_entropy)

    logps, ents = [], []
    starts = range(0, h.shape[0], chunk_tokens)
    # recomputed in backward, so only one chunk's logits are ever alive; a single chunk is not: its
    # logits, kept until its own backward, are no more than the recomputation would make there
    recompute = torch.is_grad_enabled() and len(starts) > 1
    for start in starts:
        hc, tc = h[start:start + chunk_tokens], targets[start:start + chunk_tokens]
        lp, ent = checkpoint(chunk, hc, tc, use_reentrant=False) if recompute else chunk(hc, tc)
        logps.append(lp)
        ents.append(ent)
    shape = (input_ids.shape[0], input_ids.shape[1] - 1)
    zeros = torch.zeros(shape, dtype=logps[0].dtype if logps else torch.float32, device=input_ids.device)
    flat = torch.cat(logps) if logps else zeros[response_mask]
    logp = zeros.masked_scatter(response_mask, flat)
    if not with_entropy:
        return logp, None
    return logp, zeros.masked_scatter(response_mask, torch.cat(ents) if ents else zeros[response_mask])


@torch.no_grad()
def chunked_logprobs_match(model: nn.Module, atol: float = 1e-4) -> bool:
    """Whether :func:`response_logprobs` reproduces the log-probs of the model's own logits
    (checked on a few tokens): the model takes ``logits_to_keep`` and its logits are
    ``lm_head(decoder(x))``, with no post-processing."""
    decoder, head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if decoder is None or head is None or decoder() is None or head() is None:
        return False
    training = model.training
    model.eval()  # dropout off for the comparison
    try:
        device = next(model.parameters()).device
        ids = torch.arange(3, 11, device=device).unsqueeze(0) % model.config.vocab_size
        mask = torch.ones_like(ids)
        reference, _ = full_logprobs(model, ids, mask, 1.0)
        ours, _ = response_logprobs(model, ids, mask, torch.ones_like(reference, dtype=torch.bool), 1.0)
        return bool(torch.allclose(ours, reference, atol=atol, rtol=1e-4))
    except TypeError:  # no logits_to_keep argument
        return False
    finally:
        model.train(training)


def attention_window(config) -> int | None:
    """The sliding window some of the model's layers attend within (Mistral-style
    ``sliding_window``; Qwen2's only with ``use_sliding_window``; Gemma's local layers), else None."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


@torch.no_grad()
def packed_logprobs_match(model: nn.Module, atol: float = 1e-4) -> bool:
    """Whether packed rows (:class:`~drmas.records.PackedRows`) give the model's unpacked
    log-probs: its attention takes a 4-D mask (SDPA or eager) and position ids (checked on two
    short samples sharing a prefix)."""
    if model.config._attn_implementation not in ("sdpa", "eager"):
        return False
    training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        vocab = model.config.vocab_size
        prompt = [(7 * i + 3) % vocab for i in range(MIN_SHARED_TOKENS + 4)]
        samples = [Sample("t", str(k), "a", 0, "p", prompt, [(11 * i + k) % vocab for i in range(1, 4 + k)],
                              [0.0] * (3 + k)) for k in range(2)]
        ids, attn, resp, _ = (t.to(device) for t in pad_samples(samples, 0))
        plain, _ = response_logprobs(model, ids, attn, resp, 1.0)
        ours, _ = response_logprobs(model, ids, attn, resp, 1.0,
                                    packed=pack_shared_prefixes(samples, 0).to(device))
        return bool(torch.allclose(ours, plain, atol=atol, rtol=1e-4))
    except (TypeError, ValueError, RuntimeError):
        return False
    finally:
        model.train(training)
