"""group_advantages on 1,000,000 samples in 100,000 groups, against two peers in the same run.

Peers (written here, same semantics on this input):
- ``dict-loop``: the per-group Python loop common in RL frameworks (collect each group's scores
  in a dict of lists, then mean/std per group);
- ``reshape``: a fixed-size, contiguous ``view(-1, G)`` as in single-agent GRPO trainers. It is a
  lower bound: it cannot express uneven groups or agent-wise keys.

    python bench/bench_advantages.py [--n 1000000] [--groups 100000]
"""

import argparse
import random
import time
from collections import defaultdict

import torch

from drmas.algorithms import group_advantages


def dict_loop(scores, keys, eps=1e-6):
    groups = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    out = torch.zeros_like(scores)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        s = scores[idx]
        out[idx] = (s - s.mean()) / (s.std() + eps)
    return out


def reshape(scores, size, eps=1e-6):
    s = scores.view(-1, size)
    return ((s - s.mean(1, keepdim=True)) / (s.std(1, keepdim=True) + eps)).flatten()


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=100_000)
    args = ap.parse_args()
    size = args.n // args.groups
    torch.manual_seed(0)
    scores = torch.randint(0, 5, (args.n,)).double()  # discrete rewards, as in RL
    task = [i // size for i in range(args.n)]
    keys = [(t, "agent") for t in task]  # tuple keys, as the estimators build them
    ids = torch.tensor(task)
    perm = list(range(args.n))
    random.Random(0).shuffle(perm)

    ours_keys, t_keys = timed(lambda: group_advantages(scores, keys))
    ours_ids, t_ids = timed(lambda: group_advantages(scores, ids))
    ref, t_loop = timed(lambda: dict_loop(scores, keys))
    lower, t_view = timed(lambda: reshape(scores, size))
    s_perm, k_perm = scores[perm], [keys[i] for i in perm]
    shuffled, t_shuf = timed(lambda: group_advantages(s_perm, k_perm))
    assert torch.allclose(ours_keys, ref) and torch.allclose(ours_ids, ref)
    assert torch.allclose(shuffled, ref[perm])
    # the reshape peer does not zero constant groups; compare where groups vary
    vary = ref != 0
    assert torch.allclose(ours_keys[vary], lower[vary])

    print(f"{args.n:,} samples, {args.groups:,} groups of {size}")
    print(f"  group_advantages, tuple keys    {t_keys:7.3f} s")
    print(f"  group_advantages, integer ids   {t_ids:7.3f} s")
    print(f"  group_advantages, shuffled keys {t_shuf:7.3f} s")
    print(f"  peer dict-loop                  {t_loop:7.3f} s   "
          f"ours (keys) is {t_loop / t_keys:5.1f}x faster")
    print(f"  peer reshape (fixed G)          {t_view:7.3f} s   "
          f"ours (ids) takes {t_ids / t_view:5.1f}x its time")


if __name__ == "__main__":
    main()
