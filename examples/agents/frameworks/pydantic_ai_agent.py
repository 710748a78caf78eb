"""A pydantic-ai agent with a tool, trained through drmas: ``Agent`` with a plain tool (its
schema from the signature and docstring) on pydantic-ai's OpenAI models, whose provider gets the
episode's URL and key; the model name is the agent's. Two episode functions: ``episode`` on
``OpenAIChatModel`` (chat completions), ``episode_responses`` on ``OpenAIResponsesModel`` (the
Responses API); each trains the same way.

The episode returns 1 when the final answer holds the task's answer, plus 0.1 per tool call that
ran.
"""

from pydantic_ai import Agent
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def play(task: dict, model) -> float:
    agent = Agent(model, name="solver", tools=[add], instructions="Use the add tool for sums.")
    result = await agent.run(task["question"])
    ran = sum(isinstance(p, ToolReturnPart) and p.tool_name == "add" for m in result.all_messages()
              for p in m.parts)
    return float(str(task["answer"]) in result.output) + 0.1 * ran


async def episode(task: dict, client) -> float:
    provider = OpenAIProvider(base_url=str(client.base_url), api_key=client.api_key)
    return await play(task, OpenAIChatModel("solver", provider=provider))


async def episode_responses(task: dict, client) -> float:
    provider = OpenAIProvider(base_url=str(client.base_url), api_key=client.api_key)
    return await play(task, OpenAIResponsesModel("solver", provider=provider))
