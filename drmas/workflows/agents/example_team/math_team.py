"""A math solver / verifier team written against the OpenAI chat API only (no drmas import).

The solver writes a step-by-step solution ending in \\boxed{answer}; the verifier approves it or
rejects it with a reason, and a rejected solver tries again (``MAX_LOOPS`` attempts, the last one
unchecked). The episode returns the team reward: 1 when the final answer is right, else 0.

Trained by drmas as it is: it is the agents recipe's default program, with its tasks
``train.jsonl`` and ``val.jsonl`` beside it (``python recipes/own_agents.py fit``, from any folder).
Written out, that is:

    python recipes/own_agents.py fit \\
        --data.workflow.init_args.episode examples/agents/math_team.py:episode \\
        --data.workflow.init_args.agents '[solver, verifier]' \\
        --data.workflow.init_args.train_file examples/agents/train.jsonl \\
        --data.workflow.init_args.val_file examples/agents/val.jsonl

Any program that talks to an OpenAI-compatible server works the same way: drmas gives it a
client whose ``base_url`` and ``api_key`` are its episode's own, and the request's ``model``
names the agent. Rows of the task files are handed to ``episode`` as dicts (here: ``problem``,
``answer``).
"""

import logging
import re

from math_verify import parse, verify

for name in ("math_verify.parser", "math_verify.grader"):  # "timeout disabled" on every call
    logging.getLogger(name).setLevel(logging.ERROR)

MAX_LOOPS = 2
EXAMPLE_PROBLEM = ("Mia has 3 boxes with 4 pencils in each box. She gives away 5 pencils. How many pencils "
                   "does she have left?")
EXAMPLE_SOLUTION = "Mia has 3 x 4 = 12 pencils. After giving away 5 she has 12 - 5 = 7.\n\\boxed{7}"
SOLVE = ("Problem: {problem}\n{feedback}Solve it step by step, then write the final answer as "
         "\\boxed{{answer}}.")
CHECK = ("Problem: {problem}\nProposed solution:\n{solution}\n\nIs the final answer correct? Reply "
         "<verify>approve</verify> or <verify>reject</verify>, then one sentence why.")
VERDICT = re.compile(r"\s*<verify>\s*(approve|reject)\s*</verify>(.*)", re.DOTALL | re.IGNORECASE)


def ask(client, agent: str, system: str, example_user: str, example_answer: str, user: str) -> str:
    """One call: a system message and a worked example before the question (a small model needs
    the example to follow the format)."""
    reply = client.chat.completions.create(model=agent, messages=[
        {"role": "system", "content": system},
        {"role": "user", "content": example_user},
        {"role": "assistant", "content": example_answer},
        {"role": "user", "content": user},
    ])
    return reply.choices[0].message.content or ""


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, nested braces included."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None  # never closed: a truncated answer


def is_correct(solution: str, answer: str) -> bool:
    boxed = last_boxed(solution)
    if boxed is None:
        return False
    # an episode runs in the main thread of a worker process, so math-verify's signal-based
    # timeouts (its defaults) work as in any script
    return verify(parse(f"${answer}$"), parse(f"${boxed}$"))


def episode(task: dict, client) -> float:
    feedback, solution = "", ""
    for attempt in range(MAX_LOOPS):
        solution = ask(client, "solver", "You solve math word problems.",
                       SOLVE.format(problem=EXAMPLE_PROBLEM, feedback=""), EXAMPLE_SOLUTION,
                       SOLVE.format(problem=task["problem"], feedback=feedback))
        if attempt == MAX_LOOPS - 1:
            break  # the last attempt is not checked
        verdict = ask(client, "verifier", "You check solutions of math word problems.",
                      CHECK.format(problem=EXAMPLE_PROBLEM, solution=EXAMPLE_SOLUTION),
                      "<verify>approve</verify> 3 x 4 - 5 = 7 is right.",
                      CHECK.format(problem=task["problem"], solution=solution))
        m = VERDICT.match(verdict)
        if m and m.group(1).lower() == "approve":
            break
        reason = " ".join(m.group(2).split())[:300] if m else "no clear verdict"
        feedback = f"Your previous solution was rejected ({reason}):\n{solution}\n"
    return float(is_correct(solution, task["answer"]))
