"""Update time with and without shared-prefix packing, on the same samples, in the same run.

The samples are one real iteration of the search workflow (its prompts: system prompt, worked
example, question, retrieved passages), played by a tiny random model with the same tokenizer
(fast; its responses are random tokens, as short as the search agents' actions; advantages are
set to +-1 so the gradients are real). The update is
then timed with the trained model (default SmolLM2-135M, fp32 on CPU) over the same micro-batches:
forward and backward of the policy-gradient surrogate, every micro-batch, per-sample (today's
way) against packed prefixes. Reported: tokens through the decoder, seconds, ratios, and the
gradient norms of both (they must agree).

    python bench/bench_prefix.py [--sampling tree|parallel] [--group-size 4] [--tasks 8]
                                 [--model embedded:smollm2-135m-instruct] [--micro-batch 8] [--repeats 2]
                                 [--devices 2]

``--devices N`` also deals the same samples to N data-parallel ranks as a sharded run does
(whole prefix groups, balanced by the tokens run) and reports each rank's tokens and update time,
run one after another in this process: the ranks' total against the one-rank total (what
splitting costs in duplicated prefixes) and the busiest rank against it (the speed-up bound).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rollout(args: argparse.Namespace) -> list:
    from drmas.data.rollouts import RolloutConfig, Rollouts, ValidationConfig
    from drmas.workflows.search import SearchWorkflow
    from drmas.modules import MultiAgentRL, PolicyConfig

    from drmas.modules.policy_config import PolicyGeneration
    from drmas.records import GenerationSettings
    sampling = PolicyGeneration(train=GenerationSettings(temperature=1.0, max_new_tokens=16))
    player = MultiAgentRL(policies={"shared": PolicyConfig(model="tiny-random", generation=sampling)},
                          engine="hf")
    estimator = "at_grpo" if args.sampling == "tree" else "drmas"
    config = RolloutConfig(sampling=args.sampling, estimator=estimator, group_size=args.group_size,
                           tasks_per_iteration=args.tasks)
    rollouts = Rollouts(SearchWorkflow(max_turns=4), config, ValidationConfig(tasks=0))
    return rollouts.prepare(player, 1).samples


def update(model, batches) -> tuple[float, float]:
    import torch

    from drmas.modules.logprobs import response_logprobs

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    for b in batches:
        logp, _ = response_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, 1.0,
                                    packed=b.packed)
        adv = b.advantages[:, None].expand_as(logp)
        loss = -(logp * adv * b.response_mask).sum() / b.response_mask.sum().clamp(min=1) * b.loss_scale
        loss.backward()
    seconds = time.perf_counter() - t0
    norm = float(torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None)))
    return seconds, norm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sampling", choices=("tree", "parallel"), default="tree")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--model", default="embedded:smollm2-135m-instruct")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--devices", type=int, default=1, help="also split the packed layout over this many ranks")
    args = p.parse_args()

    import torch

    from drmas.data.batching import make_micro_batches
    from drmas.records import BatchSpec
    from drmas.models import load_causal_lm

    torch.manual_seed(0)
    samples = [s for s in rollout(args) if s.response_ids]
    for i, s in enumerate(samples):  # the random player's rewards are all alike: set real advantages
        s.advantage = 1.0 if i % 2 else -1.0
    model, tok = load_causal_lm(args.model)
    model.train()
    spec = BatchSpec(pad_id=tok.pad_token_id, micro_batch_size=args.micro_batch)
    layouts = {name: make_micro_batches(samples, "shared", replace(spec, prefix_sharing=share))
               for name, share in (("per-sample", False), ("packed", True))}
    update(model, layouts["packed"][:1])  # warm-up
    results = {}
    for name, batches in layouts.items():
        runs = [update(model, batches) for _ in range(args.repeats)]
        tokens = sum(b.packed.tokens if b.packed is not None else int(b.attention_mask.sum())
                     for b in batches)
        results[name] = (tokens, statistics.median(s for s, _ in runs), runs[-1][1])
    print(f"{len(samples)} samples of one {args.sampling} iteration of the search workflow "
          f"({args.tasks} tasks, group size {args.group_size}); update of {args.model}, "
          f"micro-batch {args.micro_batch}")
    print(f"{'layout':12s} {'tokens':>8s} {'seconds':>9s} {'grad norm':>11s}")
    for name, (tokens, seconds, norm) in results.items():
        print(f"{name:12s} {tokens:8d} {seconds:9.2f} {norm:11.5f}")
    (t0, s0, n0), (t1, s1, n1) = results["per-sample"], results["packed"]
    print(f"packed / per-sample: tokens {t1 / t0:.2f}x, time {s1 / s0:.2f}x, "
          f"grad norms differ by {abs(n1 - n0) / n0:.1e} (relative)")
    if args.devices > 1:
        ranks = []
        for r in range(args.devices):
            batches = make_micro_batches(samples, "shared", replace(spec, prefix_sharing=True), rank=r,
                                         world_size=args.devices)
            real = [b for b in batches if not b.padding]
            seconds = statistics.median(update(model, batches)[0] for _ in range(args.repeats))
            ranks.append((sum(b.packed.tokens if b.packed is not None else int(b.attention_mask.sum())
                              for b in real),
                          len(batches), seconds))
        print(f"\npacked, dealt to {args.devices} ranks (whole prefix groups, balanced by tokens run):")
        print(f"{'rank':6s} {'tokens':>8s} {'passes':>7s} {'seconds':>9s}")
        for r, (tokens, passes, seconds) in enumerate(ranks):
            print(f"{r:<6d} {tokens:8d} {passes:7d} {seconds:9.2f}")
        total, busiest = sum(t for t, _, _ in ranks), max(t for t, _, _ in ranks)
        print(f"ranks / one rank: tokens {total / t1:.2f}x in all, busiest rank {busiest / t1:.2f}x; "
              f"busiest rank's time {max(s for _, _, s in ranks) / s1:.2f}x")


if __name__ == "__main__":
    main()
