"""The OpenAI Agents SDK trained through drmas: a triage agent that hands off to a solver, which
has a function tool. Two episode functions: ``episode`` on the SDK's default model (the Responses
API), ``episode_streamed`` on the same model streamed (``Runner.run_streamed``, the Responses
API's events) and ``episode_chat`` on its chat-completions model; each trains the same way.

Each agent's ``model`` is its name on the endpoint. The SDK's tracing is switched off (it would
export traces to OpenAI). The episode returns the team reward (1 when the final answer holds the
task's answer) and the triage agent's own (0.1 for handing off).
"""

from agents import (Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)

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


async def play(task: dict, model, stream: bool = False) -> dict:
    if stream:
        result = Runner.run_streamed(team(model), task["question"], max_turns=6)
        async for _ in result.stream_events():  # a program would show these as they come
            pass
    else:
        result = await Runner.run(team(model), task["question"], max_turns=6)
    handed = result.last_agent.name == "solver"
    return {"team": float(str(task["answer"]) in str(result.final_output)), "triage": 0.1 * handed}


async def episode(task: dict, client) -> dict:
    return await play(task, lambda name: OpenAIResponsesModel(model=name, openai_client=client))


async def episode_streamed(task: dict, client) -> dict:
    return await play(task, lambda name: OpenAIResponsesModel(model=name, openai_client=client), stream=True)


async def episode_chat(task: dict, client) -> dict:
    return await play(task, lambda name: OpenAIChatCompletionsModel(model=name, openai_client=client))
