import pytest
import torch

from drmas.algorithms import policy_loss
from drmas.data.batching import make_micro_batches
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
