"""An AutoGen AgentChat assistant with a tool, trained through drmas: ``AssistantAgent`` with a
calculator, on AutoGen's OpenAI client pointed at the episode's URL (``model_info`` says what the
served model can do, since its name is an agent's, not OpenAI's).

The episode returns 1 when the final answer holds the task's answer, plus 0.1 per tool call that
ran.
"""

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import ToolCallExecutionEvent
from autogen_ext.models.openai import OpenAIChatCompletionClient

MODEL_INFO = {"vision": False, "function_calling": True, "json_output": False, "structured_output": False,
              "family": "unknown"}


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def episode(task: dict, client) -> float:
    model = OpenAIChatCompletionClient(model="solver", base_url=str(client.base_url), api_key=client.api_key,
                                       model_info=MODEL_INFO, max_retries=0)
    try:
        agent = AssistantAgent("solver", model_client=model, tools=[add], reflect_on_tool_use=True,
                               system_message="Use the add tool for sums.")
        result = await agent.run(task=task["question"])
    finally:
        await model.close()
    ran = sum(len([r for r in m.content if not r.is_error]) for m in result.messages
              if isinstance(m, ToolCallExecutionEvent))
    return float(str(task["answer"]) in result.messages[-1].to_text()) + 0.1 * ran
