"""Shared-prefix packing laid out by hand: groups, rows, positions, segments, and where each
response token's logits come from."""

from drmas.data.batching import make_micro_batches
from drmas.packing import group_by_prefix, pack_shared_prefixes
from drmas.records import BatchSpec, Sample

P = list(range(100, 116))  # a 16-token prompt


def E(prompt, response):
    return Sample("t", "j", "a", 0, "p", list(prompt), list(response), [0.0] * len(response))


def test_two_samples_of_one_prompt_share_it():
    packed = pack_shared_prefixes([E(P, [1, 2]), E(P, [3, 4, 5])], pad_id=0)
    assert packed.input_ids.tolist() == [P + [1, 2, 3, 4, 5]]
    assert packed.position_ids.tolist() == [list(range(16)) + [16, 17] + [16, 17, 18]]
    assert packed.segments.tolist() == [[0] * 16 + [1, 1] + [2, 2, 2]]
    # sample 0's tokens 1, 2 come from positions 15 (the prefix's end) and 16; sample 1's 3, 4, 5
    # from 15, then from its own segment at columns 18 and 19
    assert packed.rows.tolist() == [0] * 5 and packed.cols.tolist() == [15, 16, 15, 18, 19]
    assert packed.tokens == 21  # instead of 18 + 19


def test_groups_keep_their_savings_and_rows_are_padded():
    other = list(range(500, 520))
    samples = [E(P + [7, 8], [1]), E(P + [7, 9], [2]), E(P[:10] + [0] * 6, [3]),
               E(other, [4]), E(other, [5, 6])]
    # the first two share 17 tokens; the third shares only 10 (< 16); the last two share 20
    assert group_by_prefix(samples) == [(17, [0, 1]), (16, [2]), (20, [3, 4])]
    # a third member sharing 16 of a 17-token prefix: 2 x 16 >= 1 x 17, it joins
    assert group_by_prefix([E(P + [7, 8], [1]), E(P + [7, 9], [2]), E(P + [0], [3])]) == [(16, [0, 1, 2])]
    packed = pack_shared_prefixes(samples, pad_id=0)
    assert packed.input_ids.shape == (3, 23) and packed.segments[1].tolist() == [0] * 16 + [1] + [-1] * 6
    assert packed.rows.tolist() == [0, 0, 1, 2, 2, 2]
    assert pack_shared_prefixes([E(P, [1]), E(other, [2])], pad_id=0) is None  # nothing shared


def test_micro_batches_keep_sharing_samples_together():
    other = list(range(500, 520))
    samples = [E(P, [1]), E(other, [2]), E(P, [3]), E(other, [4])]
    batches = make_micro_batches(samples, "p", BatchSpec(pad_id=0, micro_batch_size=2, prefix_sharing=True))
    assert [b.sample_index.tolist() for b in batches] == [[0, 2], [1, 3]]
    assert all(b.packed is not None and b.packed.input_ids.shape[0] == 1 for b in batches)
    # without sharing: sorted by length as before, nothing packed
    assert all(b.packed is None for b in make_micro_batches(samples, "p", BatchSpec(pad_id=0,
                                                                                    micro_batch_size=2)))
