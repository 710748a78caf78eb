import pytest
import torch

from drmas.algorithms import LossConfig, policy_loss
from drmas.data.batching import make_micro_batches, shard_samples
from drmas.records import BatchSpec, Sample


def E(prompt, response, adv=0.0):
    return Sample("t", "j", "a", 0, "p", list(prompt), list(response),
                  [-0.1 * (i + 1) for i in range(len(response))], advantage=adv)


SAMPLES = [E([1, 2, 3], [4, 5], 1.0), E([1], [6], -1.0), E([1, 2, 3, 4, 5], [7, 8, 9], 0.5), E([1], [], 9.0)]


def test_tight_padding_alignment_and_samples_without_response_left_out():
    mbs = make_micro_batches(SAMPLES, "p", BatchSpec(pad_id=0, micro_batch_size=2))
    # sorted by length, the empty one dropped
    assert [mb.sample_index.tolist() for mb in mbs] == [[1, 0], [2]]
    assert [mb.input_ids.shape[1] for mb in mbs] == [5, 8]  # each only as long as its longest row
    first = mbs[0]
    assert first.input_ids.tolist() == [[1, 6, 0, 0, 0], [1, 2, 3, 4, 5]]
    # the mask marks the positions whose logits predict response tokens
    assert first.response_mask.tolist() == [[True, False, False, False], [False, False, True, True]]
    assert first.engine_logprobs[1, 2:].tolist() == pytest.approx([-0.1, -0.2])
    assert [mb.step_after for mb in mbs] == [False, True]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_scaled_micro_batch_losses_add_up_to_the_whole_batch_loss(agg):
    whole = make_micro_batches(SAMPLES, "p", BatchSpec(pad_id=0, micro_batch_size=10, agg=agg))[0]
    parts = make_micro_batches(SAMPLES, "p", BatchSpec(pad_id=0, micro_batch_size=1, agg=agg))
    assert abs(whole.loss_scale - 1.0) < 1e-9
    assert sum(mb.loss_scale for mb in parts) == pytest.approx(1.0)
    # with the same per-token values in both layouts, the scaled parts sum to the whole
    def const_loss(mb):
        logp = torch.zeros(mb.response_mask.shape)
        return policy_loss(logp, logp - 0.05, mb.advantages, mb.response_mask, LossConfig(agg=agg),
                           norm_len=8)[0]

    assert (sum(const_loss(mb) * mb.loss_scale for mb in parts).item()
            == pytest.approx(const_loss(whole).item()))


def test_shards_balance_tokens_with_counts_one_apart():
    costs = [10, 9, 8, 1, 1]  # prompt + response tokens
    samples = [E([1] * (c - 1), [2]) for c in costs]
    # 10 -> r0, 9 -> r1, 8 -> r1 (9 < 10), 1 -> r0 (10 < 17), 1 -> r0 (11 < 17; 3 per rank at most)
    assert shard_samples(samples, 2) == [[0, 3, 4], [1, 2]]
    assert shard_samples(samples, 1) == [[0, 1, 2, 3, 4]]
    assert shard_samples(samples[:1], 3) == [[0], [], []]


def test_ranks_get_equal_passes_with_zero_weight_padding():
    ranks = [make_micro_batches(SAMPLES, "p", BatchSpec(pad_id=0, micro_batch_size=1), rank=r, world_size=2)
             for r in range(2)]
    # 3 real samples of costs 5, 2, 8: rank 0 trains the 8 and pads, rank 1 trains 2 then 5
    assert [[m.sample_index.tolist() for m in mbs] for mbs in ranks] == [[[2], [-1]], [[1], [0]]]
    pad = ranks[0][1]
    assert pad.stand_in and pad.loss_scale == 0.0 and pad.step_after and not ranks[0][0].step_after
    # token shares of 6 response tokens, times 2 ranks: the averaged gradient is the whole batch's
    assert [m.loss_scale for m in ranks[0][:1] + ranks[1]] == pytest.approx([6 / 6, 2 / 6, 4 / 6])


def prefix_plan():
    """One iteration's samples as the workflows make them: 3 tree tasks of 4 candidates sharing a
    long prompt, 5 parallel tasks of 4 trajectories whose first turns share a prompt and whose
    second turns extend it, and 6 samples that share nothing."""
    g = torch.Generator().manual_seed(1)
    tok = lambda n: torch.randint(100, 30000, (n,), generator=g).tolist()  # noqa: E731
    length = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))  # noqa: E731
    out = []
    for t in range(3):
        prompt = tok(300 + 40 * t)
        out += [Sample(f"tree{t}", f"c{k}", "a", 0, "p", prompt, tok(length(10, 40)), [0.0] * 40)
                for k in range(4)]
    for t in range(5):
        first = tok(200 + 30 * t)
        for j in range(4):
            r1 = tok(length(8, 30))
            out.append(Sample(f"par{t}", f"j{j}", "a", 0, "p", first, r1, [0.0] * 40))
            out.append(Sample(f"par{t}", f"j{j}", "a", 1, "p", first + r1 + tok(60), tok(length(8, 30)),
                                  [0.0] * 40))
    out += [Sample(f"x{i}", "x", "a", 0, "p", tok(length(50, 150)), tok(20), [0.0] * 40) for i in range(6)]
    for s in out:
        s.engine_logprobs = s.engine_logprobs[: len(s.response_ids)]
    return out


def tokens_run(batches):
    return sum(b.packed.tokens if b.packed is not None else int(b.attention_mask.sum())
               for b in batches if not b.stand_in)


@pytest.mark.parametrize("micro_batch_size", [4, 8])
def test_ranks_get_whole_prefix_groups_balanced_by_the_tokens_run(micro_batch_size):
    samples = prefix_plan()
    spec = BatchSpec(pad_id=0, micro_batch_size=micro_batch_size, prefix_sharing=True)
    build = lambda rank, world: make_micro_batches(samples, "p", spec, rank=rank, world_size=world)  # noqa: E731
    one = tokens_run(build(0, 1))
    ranks = [tokens_run(build(r, 2)) for r in range(2)]
    assert one < 0.6 * sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)  # sharing is real here
    assert sum(ranks) <= 1.10 * one and max(ranks) <= 0.55 * one, (ranks, one)
    # every task's samples on one rank, but for at most the one task the cut goes through
    shares = shard_samples(samples, 2, prefix_sharing=True, micro_batch_size=micro_batch_size)
    assert sorted(i for share in shares for i in share) == list(range(len(samples)))
    split = {samples[i].task_uid for i in shares[0]} & {samples[i].task_uid for i in shares[1]}
    assert len(split) <= 1, split


def test_a_prefix_group_is_cut_only_where_that_shortens_the_busiest_rank():
    shared = list(range(100, 140))  # a 40-token prefix
    group = [E(shared, [1] * 5) for _ in range(4)]  # packed: 40 + 4 * 5 = 60 tokens
    alone = [E([7] * 59, [2]), E([8] * 59, [2])]  # 60 tokens each, sharing nothing
    # at the boundary each rank runs 60; a cut inside the group runs the prefix twice: the
    # busier rank would run 105 or more
    assert [len(s) for s in shard_samples(group + alone[:1], 2, True, 8)] in ([4, 1], [1, 4])
    # one group alone: cut in half, each rank runs 40 + 2 * 5 = 50 tokens, not one rank all 60
    assert [len(s) for s in shard_samples(group, 2, True, 8)] == [2, 2]
