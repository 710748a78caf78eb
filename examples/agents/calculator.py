"""One agent with a calculator tool, rewarded for the right answer and for calls that ran: the
tool-use learning check of docs/agents.md.

    python recipes/own_agents.py fit \\
        --data.workflow.init_args.episode examples/agents/calculator.py:episode \\
        --data.workflow.init_args.agents '[solver]' \\
        --data.workflow.init_args.train_file examples/agents/arithmetic.jsonl

The solver is offered ``calculator`` (an arithmetic expression in, its value out). A call that
parses and evaluates earns 0.5 (once), the right final answer 1. The conversation starts with a
two worked examples (a question, a call, its result, the answer): a 135M model copies that format,
and rarely finds it from the tool's description alone. Tasks are rows with ``question`` and
``answer`` (examples/agents/arithmetic.jsonl).
"""

import ast
import json
import operator
import re

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}
SYSTEM = "You answer arithmetic questions. You may call the calculator."


def _worked(i: int, question: str, expression: str, value: int) -> list[dict]:
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return [{"role": "user", "content": question}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": str(value)},
            {"role": "assistant", "content": f"The answer is {value}."}]


# a small sum answered directly, a larger one through the calculator: the reward says which pays
EXAMPLE = [*_worked(0, "What is 12 * 7?", "12 * 7", 84),
           {"role": "user", "content": "What is 3 + 4?"}, {"role": "assistant", "content": "The answer is 7."},
           *_worked(1, "What is 65 - 38?", "65 - 38", 27)]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg}


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression (numbers, + - * /, parentheses); ValueError otherwise."""
    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    try:
        return walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ZeroDivisionError, TypeError, RecursionError) as err:
        raise ValueError(str(err)) from err


def run(call) -> tuple[str, bool]:
    """The tool's answer to one call, and whether it ran."""
    try:
        value = evaluate(str(json.loads(call.function.arguments).get("expression", "")))
    except (ValueError, AttributeError, json.JSONDecodeError) as err:
        return f"error: {err}", False
    return f"{value:g}", True


def episode(task: dict, client) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": task["question"]}]
    reply = client.chat.completions.create(model="solver", messages=messages, tools=[CALCULATOR])
    message = reply.choices[0].message
    ran = False
    if message.tool_calls:
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result, ok = run(call)
            ran = ran or ok
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        message = client.chat.completions.create(model="solver", messages=messages,
                                                 tools=[CALCULATOR]).choices[0].message
    numbers = re.findall(r"-?\d+(?:\.\d+)?", message.content or "")
    right = bool(numbers) and float(numbers[-1]) == float(task["answer"])
    return {"team": float(right), "solver": 0.5 * ran, "success": right}
