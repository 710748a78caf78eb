"""Memory and time of the trainer's log-probs: full logits (the usual way) against the chunked
response-only path (``drmas.modules.logprobs``), on the same micro-batch, in the same run.

One micro-batch of ``--seqs`` sequences, each ``--prompt`` prompt + ``--response`` response
tokens, through forward + backward of the policy-gradient surrogate (the entropy term too with
``--entropy``), with gradient checkpointing (as large models train; ``--no-gradient-checkpointing``
to keep every activation). Each path runs in a fresh subprocess so that its peak RSS is its own; reported:
the peak RSS above the process's RSS before the step (with ``--device cuda``: the peak of
allocated GPU memory above the model, under bf16 autocast as ``bf16-mixed`` trains), the step's
wall time, and the ratios.

    python bench/bench_logprobs.py [--model embedded:smollm2-135m-instruct] [--seqs 4]
                                   [--prompt 2000] [--response 64] [--chunk 1024] [--entropy]
                                   [--no-gradient-checkpointing] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def one(args: argparse.Namespace) -> dict:
    import torch

    from drmas.data.batching import make_micro_batches
    from drmas.models import load_causal_lm
    from drmas.modules.logprobs import full_logprobs, response_logprobs
    from drmas.records import BatchSpec, Sample

    torch.manual_seed(0)
    model, tok = load_causal_lm(args.model)
    model.train()
    if not args.no_gradient_checkpointing:  # as large-model configs run; leaves the logits as the peak
        model.gradient_checkpointing_enable()
    vocab = model.config.vocab_size
    samples = [Sample("t", str(i), "a", 0, "p", torch.randint(100, vocab, (args.prompt,)).tolist(),
                      torch.randint(100, vocab, (args.response,)).tolist(), [0.0] * args.response,
                      advantage=1.0)
               for i in range(args.seqs)]
    b = make_micro_batches(samples, "p", BatchSpec(pad_id=tok.pad_token_id or 0,
                                                   micro_batch_size=args.seqs))[0]
    cuda = args.device == "cuda"
    if cuda:
        model.cuda()
        b.input_ids, b.attention_mask, b.response_mask = (
            t.cuda() for t in (b.input_ids, b.attention_mask, b.response_mask))
        torch.cuda.reset_peak_memory_stats()
    mask = b.response_mask
    before = torch.cuda.memory_allocated() / 2**20 if cuda else rss_mib()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
        if args.variant == "full":
            logp, ent = full_logprobs(model, b.input_ids, b.attention_mask, 1.0, args.entropy)
        else:
            logp, ent = response_logprobs(model, b.input_ids, b.attention_mask, mask, 1.0, args.entropy,
                                          args.chunk)
        loss = (-(logp * mask).sum() / mask.sum()
                - (0.0 if ent is None else 0.01 * (ent * mask).sum() / mask.sum()))
    loss.backward()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"variant": args.variant, "peak_above_mib": peak - before, "seconds": seconds,
            "grad_norm": float(torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()
                                              if p.grad is not None)))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded:smollm2-135m-instruct")
    p.add_argument("--seqs", type=int, default=4)
    p.add_argument("--prompt", type=int, default=2000)
    p.add_argument("--response", type=int, default=64)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--entropy", action="store_true")
    p.add_argument("--no-gradient-checkpointing", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--variant", choices=("full", "chunked"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        print(json.dumps(one(args)))
        return
    results = {}
    for variant in ("full", "chunked"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--variant", variant]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    f, c = results["full"], results["chunked"]
    print(f"{args.model}: {args.seqs} x ({args.prompt} prompt + {args.response} response) tokens, "
          f"forward + backward{' with entropy' if args.entropy else ''}, chunk {args.chunk}, "
          f"gradient checkpointing {'off' if args.no_gradient_checkpointing else 'on'}")
    print(f"{'path':10s} {'peak MiB above start':>22s} {'seconds':>9s} {'grad norm':>11s}")
    for r in (f, c):
        print(f"{r['variant']:10s} {r['peak_above_mib']:22.0f} {r['seconds']:9.2f} {r['grad_norm']:11.5f}")
    print(f"chunked / full: memory {c['peak_above_mib'] / f['peak_above_mib']:.2f}x, "
          f"time {c['seconds'] / f['seconds']:.2f}x, grad norms differ by "
          f"{abs(c['grad_norm'] - f['grad_norm']) / f['grad_norm']:.1e} (relative)")


if __name__ == "__main__":
    main()
