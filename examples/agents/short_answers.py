"""One agent, rewarded for answering in few tokens: the learning check of docs/agents.md.

    python recipes/own_agents.py fit \\
        --data.workflow.init_args.episode examples/agents/short_answers.py:episode \\
        --data.workflow.init_args.agents '[writer]' --model.policies.shared.optim.lr 1.0e-5

The reward is minus the answer's length in tokens over its budget, so a policy that learns
gets shorter answers; with ``lr 0`` nothing changes (the control).
"""

BUDGET = 96


def episode(task: dict, client) -> dict:
    reply = client.chat.completions.create(
        model="writer", messages=[{"role": "user", "content": f"In one sentence, what does this problem ask for? {task['problem']}"}])
    return {"writer": -reply.usage.completion_tokens / BUDGET}
