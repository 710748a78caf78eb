"""Rollout throughput: HFEngine against VLLMEngine (fp32 and bf16), same prompts, same run.

Each model gets the same chat prompts, ``n`` samples each at T=1, ``--tokens`` new tokens;
every engine is warmed up once before the timed call. Reported: generated tokens per second
and the vLLM/HF ratio, plus the vLLM engine's creation time.

    python bench/bench_engines.py [--models tiny-random embedded:smollm2-135m-instruct]
                                  [--prompts 8] [--n 4] [--tokens 48] [--kv-cache-gib 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from drmas.engines import Engine, HFEngine, vllm_available
from drmas.models import load_causal_lm, resolve_model_path
from drmas.records import GenerationSettings

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 7?",
    "Who wrote Romeo and Juliet?",
    "Why is the sky blue?",
    "Give a synonym for happy.",
]


def chat_prompts(tok, count: int) -> list[list[int]]:
    prompts = []
    for i in range(count):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    return prompts


def tokens_per_second(engine: Engine, prompts: list[list[int]], n: int, params: GenerationSettings) -> float:
    engine.generate(prompts[:2], 1, GenerationSettings(temperature=1.0, max_new_tokens=4))  # warm-up
    torch.manual_seed(0)
    start = time.perf_counter()
    out = engine.generate(prompts, n, params)
    seconds = time.perf_counter() - start
    return sum(len(g.response_ids) for gens in out for g in gens) / seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["tiny-random", "embedded:smollm2-135m-instruct"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--kv-cache-gib", type=float, default=1.0)
    args = ap.parse_args()
    params = GenerationSettings(temperature=1.0, max_new_tokens=args.tokens)
    threads = torch.get_num_threads()
    print(f"{args.prompts} prompts x n={args.n} x {args.tokens} new tokens, T=1, torch threads={threads}")
    for name in args.models:
        model, tok = load_causal_lm(name)
        prompts = chat_prompts(tok, args.prompts)
        hf = tokens_per_second(HFEngine(model, tok), prompts, args.n, params)
        print(f"{name:34s} HF fp32            {hf:8.1f} tok/s")
        if not vllm_available():
            print(f"{name:34s} vLLM               skipped: vllm is not installed")
            continue
        from drmas.engines import VLLMEngine, VLLMSettings

        for dtype in ("float32", "bfloat16"):
            start = time.perf_counter()
            engine = VLLMEngine(resolve_model_path(name),
                                VLLMSettings(dtype=dtype, max_model_len=1024, kv_cache_gib=args.kv_cache_gib))
            created = time.perf_counter() - start
            try:
                rate = tokens_per_second(engine, prompts, args.n, params)
            finally:
                engine.close()
            print(
                f"{name:34s} vLLM {dtype:9s}    {rate:8.1f} tok/s   x{rate / hf:.2f} vs HF"
                f"   (engine created in {created:.1f} s)"
            )


if __name__ == "__main__":  # vLLM's engine may spawn workers: keep creation behind the guard
    main()
