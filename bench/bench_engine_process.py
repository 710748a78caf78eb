"""What the engine's process boundary costs: one weight sync and one rollout, in-process vs in an
engine process of its own, the same model and prompts, both measured in this run.

In-process is how drmas ran vLLM before engines had processes of their own: ``vllm.LLM`` in the
trainer, weights handed over by ``collective_rpc("reload_weights")``. Separate-process is
:class:`~drmas.engines.VLLMEngine`: the state dict crosses through vLLM's weight-transfer API
(shared memory on CPU). Each is timed ``--repeats`` times after a warm-up; the medians are
printed with the ratio, and the bytes moved, so the cost can be put at another model size and
another transfer's bandwidth.

    python bench/bench_engine_process.py [--model embedded:smollm2-135m-instruct] [--repeats 3]
                                         [--prompts 8] [--n 4] [--tokens 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from drmas.engines.base import FullState
from drmas.hardware import machine
from drmas.models import load_causal_lm, resolve_model_path
from drmas.records import GenerationSettings


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    from bench_engines import chat_prompts

    from drmas import console

    console.quiet()

    from drmas.engines import VLLMEngine, VLLMSettings

    model, tok = load_causal_lm(args.model)
    path = resolve_model_path(args.model)
    prompts = chat_prompts(tok, args.prompts)
    params = GenerationSettings(temperature=1.0, max_new_tokens=args.tokens)
    nbytes = sum(t.numel() * 4 for t in model.state_dict().values())  # float32 engines below
    print(f"{machine()}; {args.model}: {nbytes / 2**20:.0f} MiB of fp32 weights per sync; "
          f"rollout {args.prompts} prompts x n={args.n} x {args.tokens} tokens; median of {args.repeats}")

    separate = VLLMEngine(path, VLLMSettings(dtype="float32", max_model_len=1024, kv_cache_gib=0.5))
    try:
        sync_sep = median_time(lambda: separate.sync_weights(FullState(model, torch.float32)), args.repeats)
        roll_sep = median_time(lambda: separate.generate(prompts, args.n, params), args.repeats)
    finally:
        separate.close()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the worker in this process
    import vllm

    llm = vllm.LLM(model=path, dtype="float32", max_model_len=1024, enforce_eager=True,
                   kv_cache_memory_bytes=2**29, logprobs_mode="processed_logprobs")
    sampling = vllm.SamplingParams(n=args.n, temperature=1.0, max_tokens=args.tokens, logprobs=0)
    requests = [vllm.TokensPrompt(prompt_token_ids=p) for p in prompts]

    def sync_in() -> None:
        weights = iter(FullState(model, torch.float32))
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        llm.reset_prefix_cache()

    sync_in_s = median_time(sync_in, args.repeats)
    roll_in = median_time(lambda: llm.generate(requests, sampling, use_tqdm=False), args.repeats)

    print(f"{'':22s} {'in-process':>11s} {'own process':>12s} {'ratio':>7s}")
    print(f"{'weight sync (s)':22s} {sync_in_s:11.3f} {sync_sep:12.3f} {sync_sep / sync_in_s:7.2f}")
    print(f"{'rollout (s)':22s} {roll_in:11.3f} {roll_sep:12.3f} {roll_sep / roll_in:7.2f}")
    print(f"the process boundary per sync: {sync_sep - sync_in_s:+.3f} s for {nbytes / 2**30:.2f} GiB "
          f"(negative: within this machine's noise)")

if __name__ == "__main__":
    main()
