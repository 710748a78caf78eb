"""What the OpenAI-compatible endpoint costs, two ways, each measured against its peer in one run.

``overhead`` (tiny-random, HF engine, seconds): samples per second of episodes played through
the endpoint (worker processes, HTTP, the dispatcher), plain, with a tool offered on every call
(hermes rendering and vLLM's parser) and streamed, against direct ``generate`` calls of the same
prompts in the same batches; the ratios of their rates.

``builtin`` (the embedded model): the math solver/verifier team through the endpoint (the example
program, examples/agents/math_team.py) against the built-in ``math_solver_verifier`` workflow:
same model, engine, tasks and group size. Each round runs the built-in workflow, then the
endpoint, after one warm-up round of each. Sampling makes the two play different conversations (a
rejected solution costs a second attempt), so the generated tokens of each are printed too, and
the time per generated token is compared as well.

    python bench/bench_agents.py overhead [--rounds 3] [--episodes 16] [--turns 3]
    python bench/bench_agents.py builtin [--rounds 3] [--tasks 4] [--group 4] [--engine auto]
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


ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}


def _conversation(task: dict, client, **kwargs) -> float:
    """``turns`` calls to one agent, each answer appended to the history (the direct path builds
    the same prompts)."""
    messages = [{"role": "user", "content": task["q"]}]
    for _ in range(task["turns"]):
        if kwargs.get("stream"):
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="writer", messages=messages, **kwargs) if c.choices)
        else:
            reply = client.chat.completions.create(model="writer", messages=messages, **kwargs)
            text = reply.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    return 1.0


def plain(task: dict, client) -> float:
    return _conversation(task, client)


def tools(task: dict, client) -> float:
    return _conversation(task, client, tools=[ADD])


def streamed(task: dict, client) -> float:
    return _conversation(task, client, stream=True)


def _direct(generate, episodes: int, turns: int, tools: tuple[str, ...]) -> int:
    """The same conversations through ``generate``: one batched call per turn."""
    from drmas.records import ChatPrompt

    histories = [[("user", f"question {i}")] for i in range(episodes)]
    samples = 0
    for _ in range(turns):
        outs = generate("writer", [ChatPrompt(tuple(h), tools=tools) for h in histories], 1)
        for h, (c,) in zip(histories, outs):
            h += [("assistant", c.text), ("user", "go on")]
        samples += len(outs)
    return samples


def overhead(args: argparse.Namespace) -> None:
    import json
    import tempfile

    logging.disable(logging.WARNING)
    from drmas.workflows.agents import AgentsWorkflow
    from drmas.hardware import bf16_is_native
    from drmas.modules import MultiAgentRL, PolicyConfig
    from drmas.modules.policy_config import PolicyGeneration
    from drmas.records import GenerationSettings

    sampling = GenerationSettings(temperature=1.0, max_new_tokens=args.max_new_tokens)
    module = MultiAgentRL(policies={"shared": PolicyConfig(model="tiny-random",
                                                           generation=PolicyGeneration(train=sampling))},
                          engine="hf")
    module.bind_agents(["writer"])
    module.sync_weights()
    generate = module.generate_fn(train=True)
    tmp = tempfile.mkdtemp(prefix="bench-agents-")
    tasks_file = os.path.join(tmp, "tasks.jsonl")
    with open(tasks_file, "w") as f:
        for i in range(args.episodes):
            f.write(json.dumps({"q": f"question {i}", "turns": args.turns}) + "\n")
    here = os.path.abspath(__file__)
    # no window: a round's calls go out as one batch, as the direct path's do
    flows = {name: AgentsWorkflow(f"{here}:{name}", ["writer"], tasks_file, val_share=0.0, window_ms=10**7,
                                  workers=args.episodes) for name in ("plain", "tools", "streamed")}
    tool_json = (json.dumps(ADD),)
    rates: dict[str, list[float]] = {n: [] for n in ("direct", "direct+tools", *flows)}
    try:
        for r in range(args.rounds + 1):
            for name in rates:
                t0 = time.perf_counter()
                if name.startswith("direct"):
                    offered = tool_json if "tools" in name else ()
                    samples = _direct(generate, args.episodes, args.turns, offered)
                else:
                    wf = flows[name]
                    result = wf.rollout(wf.tasks("train"), generate, n=1)
                    failed = [e for e in result.episodes if "failure" in e.info]
                    if failed:
                        raise SystemExit(f"{name}: {len(failed)} failed: {failed[0].info['failure']}")
                    samples = len(result.samples)
                seconds = time.perf_counter() - t0
                print(f"round {r}{' (warm-up)' if r == 0 else ''} {name:13s} {seconds:6.2f} s "
                      f"{samples:4d} samples {samples / seconds:7.1f}/s", flush=True)
                if r:
                    rates[name].append(samples / seconds)
    finally:
        for wf in flows.values():
            wf.close()
        module.teardown("fit")
    mean = {n: sum(v) / len(v) for n, v in rates.items()}
    machine = f"{os.cpu_count()} CPU cores, bf16 {'native' if bf16_is_native() else 'emulated'}"
    print(f"\n{args.rounds} rounds of {args.episodes} episodes x {args.turns} calls, tiny-random, HF engine, "
          f"{args.max_new_tokens} new tokens, {machine}")
    for name, peer in (("plain", "direct"), ("tools", "direct+tools"), ("streamed", "direct")):
        print(f"endpoint {name:8s} {mean[name]:7.1f} samples/s  vs {peer:12s} {mean[peer]:7.1f}/s: "
              f"{mean[name] / mean[peer]:.2f}x")


def builtin(args: argparse.Namespace) -> None:
    logging.disable(logging.WARNING)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    from drmas.workflows.agents import AgentsWorkflow
    from drmas.workflows.math import SolverVerifierWorkflow
    from drmas.hardware import bf16_is_native
    from drmas.modules import MultiAgentRL, PolicyConfig
    from drmas.modules.policy_config import PolicyGeneration
    from drmas.records import GenerationSettings

    sampling = GenerationSettings(temperature=0.7, max_new_tokens=args.max_new_tokens)
    module = MultiAgentRL(policies={"shared": PolicyConfig(model=MODEL,
                                                           generation=PolicyGeneration(train=sampling))},
                          engine=args.engine)
    train = os.path.join(EXAMPLE, "train.jsonl")
    native = SolverVerifierWorkflow(train_file=train, max_turns=2)
    endpoint = AgentsWorkflow(f"{os.path.join(EXAMPLE, 'math_team.py')}:episode", ["solver", "verifier"],
                              train, val_share=0.0)
    module.bind_agents(["solver", "verifier"])
    module.sync_weights()
    generate = module.generate_fn(train=True)
    contenders = {"built-in": (native, native.tasks("train")),
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
          f"{module.engines.name} engine, {machine}")
    print(f"{'':10s} {'rollout s':>10s} {'samples':>8s} {'tokens':>7s} {'ms/token':>9s}")
    for name, (s, n, t) in totals.items():
        print(f"{name:10s} {s:10.1f} {n:8d} {t:7d} {1000 * s / max(t, 1):9.2f}")
    print(f"endpoint / built-in: time {es / bs:.2f}x, "
          f"time per generated token {(es / max(et, 1)) / (bs / max(bt, 1)):.2f}x (target <= 1.3x)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead", help="endpoint vs direct generate on tiny-random")
    o.add_argument("--rounds", type=int, default=3)
    o.add_argument("--episodes", type=int, default=16)
    o.add_argument("--turns", type=int, default=3, help="calls per episode")
    o.add_argument("--max-new-tokens", type=int, default=16)
    b = sub.add_parser("builtin", help="the math team: endpoint vs the built-in workflow")
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--tasks", type=int, default=4)
    b.add_argument("--group", type=int, default=4, help="episodes per task")
    b.add_argument("--engine", default="auto", help="hf, vllm or auto")
    b.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args()
    if args.what == "overhead":
        overhead(args)
    else:
        builtin(args)


if __name__ == "__main__":
    main()
