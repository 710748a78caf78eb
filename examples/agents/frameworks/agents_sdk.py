"""The OpenAI Agents SDK trained through drmas: a triage agent that hands off to a solver, which
has a function tool. Four episode functions: ``episode`` on the SDK's default model (the Responses
API), ``episode_streamed`` on the same model streamed (``Runner.run_streamed``, the Responses
API's events), ``episode_chat`` on its chat-completions model, and ``episode_default_client``
with the models given by name and a client installed once per process
(``set_default_openai_client``); each trains the same way.

Each agent's ``model`` is its name on the endpoint. The SDK's tracing is switched off (it would
export traces to OpenAI). The episode returns the team reward (1 when the final answer holds the
task's answer) and the triage agent's own (0.1 for handing off).
"""

from agents import (Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                    set_default_openai_client, set_tracing_disabled)
from openai import AsyncOpenAI

set_tracing_disabled(True)


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def team(model):
    solver = Agent(name="solver", instructions="Solve the question; use add for sums.", tools=[add],
                   model=model("solver"))
    triage = Agent(name="triage", instructions="Hand arithmetic questions to the solver.", handoffs=[solver],
                   model=model("triage"))
    return triage


async def run(task: dict, model, stream: bool = False):
    if stream:
        result = Runner.run_streamed(team(model), task["question"], max_turns=6)
        async for _ in result.stream_events():  # a program would show these as they come
            pass
        return result
    return await Runner.run(team(model), task["question"], max_turns=6)


def rewards(task: dict, result) -> dict:
    handed = result.last_agent.name == "solver"
    return {"team": float(str(task["answer"]) in str(result.final_output)), "triage": 0.1 * handed}


async def play(task: dict, model, stream: bool = False) -> dict:
    return rewards(task, await run(task, model, stream))


async def episode(task: dict, client) -> dict:
    return await play(task, lambda name: OpenAIResponsesModel(model=name, openai_client=client))


async def episode_streamed(task: dict, client) -> dict:
    return await play(task, lambda name: OpenAIResponsesModel(model=name, openai_client=client), stream=True)


async def episode_chat(task: dict, client) -> dict:
    return await play(task, lambda name: OpenAIChatCompletionsModel(model=name, openai_client=client))


_default_client: AsyncOpenAI | None = None


async def episode_default_client(task: dict, client) -> dict:
    """The models given by name, served by a client installed once per process, as the SDK's docs
    show: built from the environment (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), it reaches the
    worker's address, so each episode's calls land in that episode. Each call's id is handed back
    (``calls``, no extra reward): an id that was not this episode's answer would fail it."""
    global _default_client
    if _default_client is None:
        _default_client = AsyncOpenAI()
        set_default_openai_client(_default_client)
    result = await run(task, lambda name: name)
    return {**rewards(task, result), "calls": {r.response_id: 0.0 for r in result.raw_responses}}
