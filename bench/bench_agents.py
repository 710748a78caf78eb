"""Rollout time of the math solver/verifier team through the OpenAI-compatible endpoint (the
example program, examples/agents/math_team.py) against the built-in ``math_solver_verifier``
workflow: same model, engine, tasks and group size, in one process; the ratio of their times.

Both play the same problems (examples/agents/train.jsonl) with the same policy; each round runs
the built-in workflow, then the endpoint, after one warm-up round of each (engine start, the
HTTP server, the client imports). Sampling makes the two play different conversations (a
rejected solution costs a second attempt), so the generated tokens of each are printed too,
and the time per generated token is compared as well.

    python bench/bench_agents.py [--rounds 3] [--tasks 4] [--group 4] [--engine auto]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODEL = "embedded:smollm2-135m-instruct"
EXAMPLE = os.path.join(ROOT, "examples", "agents")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group", type=int, default=4, help="episodes per task")
    p.add_argument("--engine", default="auto", help="hf, vllm or auto")
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args()
    logging.disable(logging.WARNING)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    from drmas.engines import GenerationParams
    from drmas.envs.agents import AgentsWorkflow
    from drmas.envs.math import SolverVerifierWorkflow
    from drmas.hardware import bf16_is_native
    from drmas.modules import MultiAgentRL, PolicyConfig

    sampling = GenerationParams(temperature=0.7, max_new_tokens=args.max_new_tokens)
    module = MultiAgentRL(policies={"shared": PolicyConfig(model=MODEL, train_generation=sampling)},
                          engine=args.engine)
    train = os.path.join(EXAMPLE, "train.jsonl")
    builtin = SolverVerifierWorkflow(train_file=train, max_turns=2)
    endpoint = AgentsWorkflow(f"{os.path.join(EXAMPLE, 'math_team.py')}:episode", ["solver", "verifier"],
                              train, val_share=0.0)
    module.bind_agents(["solver", "verifier"])
    module.sync_weights()
    generate = module.generate_fn(train=True)
    contenders = {"built-in": (builtin, builtin.tasks("train")),
                  "endpoint": (endpoint, endpoint.tasks("train"))}
    totals = {name: [0.0, 0, 0] for name in contenders}  # seconds, samples, response tokens
    try:
        for r in range(args.rounds + 1):
            tasks = slice(r * args.tasks, (r + 1) * args.tasks)  # each round new problems, the same for both
            for name, (wf, all_tasks) in contenders.items():
                t0 = time.perf_counter()
                result = wf.rollout(all_tasks[tasks], generate, n=args.group)
                seconds = time.perf_counter() - t0
                tokens = sum(len(s.response_ids) for s in result.samples)
                failed = [e for e in result.episodes if "failure" in e.info]
                if failed:
                    raise SystemExit(f"{name}: {len(failed)} episodes failed: {failed[0].info['failure']}")
                print(f"round {r}{' (warm-up)' if r == 0 else ''} {name:9s} {seconds:6.1f} s  "
                      f"{len(result.samples):3d} samples  {tokens:5d} tokens", flush=True)
                if r:
                    for i, v in enumerate((seconds, len(result.samples), tokens)):
                        totals[name][i] += v
    finally:
        endpoint.close()
        module.teardown("fit")
    (bs, _, bt), (es, _, et) = totals["built-in"], totals["endpoint"]
    machine = f"{os.cpu_count()} CPU cores, bf16 {'native' if bf16_is_native() else 'emulated'}"
    print(f"\n{args.rounds} rounds of {args.tasks} tasks x {args.group} episodes, {MODEL}, "
          f"{module.engine_name} engine, {machine}")
    print(f"{'':10s} {'rollout s':>10s} {'samples':>8s} {'tokens':>7s} {'ms/token':>9s}")
    for name, (s, n, t) in totals.items():
        print(f"{name:10s} {s:10.1f} {n:8d} {t:7d} {1000 * s / max(t, 1):9.2f}")
    print(f"endpoint / built-in: time {es / bs:.2f}x, "
          f"time per generated token {(es / max(et, 1)) / (bs / max(bt, 1)):.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
