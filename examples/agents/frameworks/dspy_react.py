"""A DSPy ReAct agent trained through drmas: ``dspy.ReAct`` with a calculator. DSPy's own loop
asks the model, in its adapter's text fields (``next_thought``, ``next_tool_name``,
``next_tool_args``), for the next tool, runs it, shows the observation, and ends with ``finish``
and an extraction of the answer, each step a chat request of the agent.

The agent is LiteLLM's ``openai/<agent>`` model with the episode's URL and key. DSPy's caches are
off: a cached answer would replay a completion without asking the endpoint, so nothing would be
trained. The episode returns 1 when the answer holds the task's answer, plus 0.1 per call of
``add`` that ran. LiteLLM reads its model prices from the copy it ships, not from GitHub (which a
training machine may not reach).
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def episode(task: dict, client) -> float:
    lm = dspy.LM("openai/solver", api_base=str(client.base_url), api_key=client.api_key, cache=False,
                 num_retries=0)
    agent = dspy.ReAct("question -> answer", tools=[add], max_iters=4)
    with dspy.context(lm=lm):
        result = agent(question=task["question"])
    steps = result.trajectory
    ran = sum(steps[k] == "add" and not str(steps[f"observation_{k[10:]}"]).startswith("Execution error")
              for k in steps if k.startswith("tool_name_"))
    return float(str(task["answer"]) in str(result.answer)) + 0.1 * ran
