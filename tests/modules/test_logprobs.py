"""Chunked response log-probs equal the full-logits ones, values and gradients."""

import copy

import pytest
import torch

from drmas.data.batching import make_micro_batches
from drmas.models import load_causal_lm
from drmas.modules import PolicyConfig
from drmas.modules.logprobs import chunked_logprobs_match, full_logprobs, response_logprobs
from drmas.records import BatchSpec, Sample
from drmas.modules.policy_config import UpdateSettings


@pytest.fixture(scope="module")
def model():
    m, tok = load_causal_lm("tiny-random")
    return m


def batch():
    # prompts of different lengths, right padding: response positions differ per row
    rows = [([1, 2, 3, 4, 5, 6], [40, 41, 42]), ([7, 8], [50, 51, 52, 53, 54]), ([9, 10, 11, 12], [60])]
    samples = [Sample("t", str(i), "a", 0, "p", p, r, [0.0] * len(r)) for i, (p, r) in enumerate(rows)]
    return make_micro_batches(samples, "p", BatchSpec(pad_id=0, micro_batch_size=8))[0]


@pytest.mark.parametrize("chunk", [1, 3, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_full_logits_in_values_and_gradients(model, chunk, temperature):
    b = batch()
    mask = b.response_mask
    weights = torch.linspace(-1, 1, mask.numel()).reshape(mask.shape)

    model.zero_grad()
    full, full_ent = full_logprobs(model, b.input_ids, b.attention_mask, temperature, with_entropy=True)
    ((full * weights)[mask].sum() + full_ent[mask].sum()).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    ours, ours_ent = response_logprobs(model, b.input_ids, b.attention_mask, mask, temperature, True, chunk)
    ((ours * weights)[mask].sum() + ours_ent[mask].sum()).backward()

    torch.testing.assert_close(ours[mask], full[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours_ent[mask], full_ent[mask], atol=1e-5, rtol=0)
    assert (ours[~mask] == 0).all() and (ours_ent[~mask] == 0).all()
    assert int(mask.sum()) == 9
    # fp32 rounding differs between the paths (one row per chunk is a matrix-vector product that
    # sums the 49,152-token vocabulary in another order), so the tolerance is relative to each
    # gradient's scale; the float64 test below shows the two are the same computation
    for n, p in model.named_parameters():
        scale = float(ref[n].abs().max())
        torch.testing.assert_close(p.grad, ref[n], atol=2e-5 * scale, rtol=0, msg=n)


@pytest.mark.parametrize("chunk", [1, 3])
def test_chunked_is_the_same_computation_as_full_logits_in_float64(model, chunk):
    b = batch()
    mask = b.response_mask
    weights = torch.linspace(-1, 1, mask.numel(), dtype=torch.float64).reshape(mask.shape)
    model64 = copy.deepcopy(model).double()
    grads = []
    for path in ("full", "chunked"):
        model64.zero_grad()
        if path == "full":
            lp, ent = full_logprobs(model64, b.input_ids, b.attention_mask, 0.7, with_entropy=True)
        else:
            lp, ent = response_logprobs(model64, b.input_ids, b.attention_mask, mask, 0.7, True, chunk)
        ((lp.double() * weights)[mask].sum() + ent.double()[mask].sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model64.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=1e-12, rtol=1e-10, msg=n)


def test_without_entropy_no_entropy_is_made(model):
    b = batch()
    with torch.no_grad():
        logp, ent = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, 1.0)
    assert ent is None and logp.shape == b.response_mask.shape


def test_models_that_post_process_logits_keep_the_full_path(model):
    assert chunked_logprobs_match(model)
    scaled, _ = load_causal_lm("tiny-random")

    class Scaled(type(scaled)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2.0  # as logit soft-capping or scaling would
            return out

    scaled.__class__ = Scaled
    scaled.train()
    assert not chunked_logprobs_match(scaled)
    assert scaled.training  # the check leaves the mode as it found it


def test_chunk_size_is_checked():
    with pytest.raises(ValueError, match="logprob_chunk_tokens must be >= 0"):
        PolicyConfig(update=UpdateSettings(logprob_chunk_tokens=-1))


def plain(logits, targets, temperature, with_entropy):
    """The formula written out for autograd (what TokenLogprobs computes by blocks)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    z = z / temperature if temperature > 0 else z
    lse = torch.logsumexp(z, -1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    return logp, lse - (torch.softmax(z, -1) * z).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_token_logprobs_by_blocks_equal_the_formula_in_values_and_gradients(monkeypatch, dtype, temperature,
                                                                           with_entropy):
    from drmas.modules import logprobs

    monkeypatch.setattr(logprobs, "BLOCK_BYTES", 4 * 1000 * 5)  # 5 rows a block: 37 rows end mid-block
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(37, 1000, generator=gen, dtype=torch.float64)).to(dtype)
    targets = torch.randint(0, 1000, (37,), generator=gen)
    g_logp, g_ent = torch.randn(37, generator=gen, dtype=torch.float64), torch.randn(37, generator=gen,
                                                                                   dtype=torch.float64)
    results = []
    for fn in (plain, logprobs._from_logits):
        x = logits.clone().requires_grad_()
        lp, ent = fn(x, targets, temperature, with_entropy)
        loss = (lp.double() * g_logp).sum() + ((ent.double() * g_ent).sum() if with_entropy else 0)
        loss.backward()
        results.append((lp, ent, x.grad))
    (lp0, ent0, grad0), (lp1, ent1, grad1) = results
    assert grad1.dtype == dtype and lp1.dtype == lp0.dtype
    exact = dtype == torch.float64
    torch.testing.assert_close(lp1, lp0, atol=1e-12 if exact else 5e-5, rtol=0)
    if with_entropy:
        torch.testing.assert_close(ent1, ent0, atol=1e-12 if exact else 5e-5, rtol=0)
    else:
        assert ent1.shape == ()
    # bf16 gradients: the same fp32 values rounded once, so at most one bf16 step apart
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2 ** -8}[dtype]
    torch.testing.assert_close(grad1.double(), grad0.double(), atol=tol * float(grad0.abs().max()), rtol=0)
