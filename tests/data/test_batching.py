import pytest
import torch

from drmas.algorithms import policy_loss
from drmas.data.batching import make_micro_batches, shard_samples
from drmas.records import Experience


def E(prompt, response, adv=0.0, pad=False):
    return Experience("t", "j", "e", "a", 0, "p", list(prompt), list(response), [-0.1 * (i + 1) for i in range(len(response))],
                      advantage=adv, is_pad=pad)


SAMPLES = [E([1, 2, 3], [4, 5], 1.0), E([1], [6], -1.0), E([1, 2, 3, 4, 5], [7, 8, 9], 0.5), E([1], [2], 9.0, pad=True)]


def test_tight_padding_alignment_and_padding_samples_left_out():
    mbs = make_micro_batches(SAMPLES, "p", micro_batch_size=2, pad_id=0)
    assert [mb.sample_index.tolist() for mb in mbs] == [[1, 0], [2]]  # sorted by length, pad dropped
    assert [mb.input_ids.shape[1] for mb in mbs] == [5, 8]  # each only as long as its longest row
    first = mbs[0]
    assert first.input_ids.tolist() == [[1, 6, 0, 0, 0], [1, 2, 3, 4, 5]]
    # the mask marks the positions whose logits predict response tokens
    assert first.response_mask.tolist() == [[True, False, False, False], [False, False, True, True]]
    assert first.engine_logprobs[1, 2:].tolist() == pytest.approx([-0.1, -0.2])
    assert [mb.step_after for mb in mbs] == [False, True]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_scaled_micro_batch_losses_add_up_to_the_whole_batch_loss(agg):
    whole = make_micro_batches(SAMPLES, "p", micro_batch_size=10, pad_id=0, agg=agg)[0]
    parts = make_micro_batches(SAMPLES, "p", micro_batch_size=1, pad_id=0, agg=agg)
    assert abs(whole.loss_scale - 1.0) < 1e-9
    assert sum(mb.loss_scale for mb in parts) == pytest.approx(1.0)
    # with the same per-token values in both layouts, the scaled parts sum to the whole
    def const_loss(mb):
        logp = torch.zeros(mb.response_mask.shape)
        return policy_loss(logp, logp - 0.05, mb.advantages, mb.response_mask, agg=agg, norm_len=8)[0]

    assert sum(const_loss(mb) * mb.loss_scale for mb in parts).item() == pytest.approx(const_loss(whole).item())


def test_shards_balance_tokens_with_counts_one_apart():
    costs = [10, 9, 8, 1, 1]  # prompt + response tokens
    samples = [E([1] * (c - 1), [2]) for c in costs]
    # 10 -> r0, 9 -> r1, 8 -> r1 (9 < 10), 1 -> r0 (10 < 17), 1 -> r0 (11 < 17; 3 per rank at most)
    assert shard_samples(samples, 2) == [[0, 3, 4], [1, 2]]
    assert shard_samples(samples, 1) == [[0, 1, 2, 3, 4]]
    assert shard_samples(samples[:1], 3) == [[0], [], []]


def test_ranks_get_equal_passes_with_zero_weight_padding():
    ranks = [make_micro_batches(SAMPLES, "p", micro_batch_size=1, pad_id=0, rank=r, world_size=2) for r in range(2)]
    # 3 real samples of costs 5, 2, 8: rank 0 trains the 8 and pads, rank 1 trains 2 then 5
    assert [[m.sample_index.tolist() for m in mbs] for mbs in ranks] == [[[2], [-1]], [[1], [0]]]
    pad = ranks[0][1]
    assert pad.padding and pad.loss_scale == 0.0 and pad.step_after and not ranks[0][0].step_after
    # token shares of 6 response tokens, times 2 ranks: the averaged gradient is the whole batch's
    assert [m.loss_scale for m in ranks[0][:1] + ranks[1]] == pytest.approx([6 / 6, 2 / 6, 4 / 6])
