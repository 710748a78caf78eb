"""A LlamaIndex ``FunctionAgent`` with a tool, trained through drmas: the agent workflow streams
the model's answer, runs the tool calls it parsed and sends their results back, on LlamaIndex's
``OpenAILike`` LLM (which takes any model name: the agent's, on the episode's URL and key).
``is_function_calling_model=True`` says the served model takes OpenAI's tools.

The episode returns 1 when the final answer holds the task's answer, plus 0.1 per tool call that
ran.
"""

from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def episode(task: dict, client) -> float:
    llm = OpenAILike(model="solver", api_base=str(client.base_url), api_key=client.api_key,
                     is_chat_model=True, is_function_calling_model=True, context_window=4096, max_retries=0)
    agent = FunctionAgent(name="solver", tools=[FunctionTool.from_defaults(add)], llm=llm,
                          system_prompt="Use the add tool for sums.")
    handler = agent.run(user_msg=task["question"], max_iterations=6)
    ran = 0
    async for event in handler.stream_events():
        ran += isinstance(event, ToolCallResult) and not event.tool_output.is_error
    response = await handler
    return float(str(task["answer"]) in str(response)) + 0.1 * ran
