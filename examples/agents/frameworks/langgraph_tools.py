"""A LangGraph tool-calling agent trained through drmas: a StateGraph whose model node may call a
calculator, a ToolNode that runs the calls, and the loop between them (LangGraph's own pattern).

The episode returns 1 when the final answer holds the task's answer, plus 0.1 per tool call that
ran. drmas serves the model: ``ChatOpenAI`` reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``,
which are the episode's own while it runs, and ``model`` names the agent.

    python recipes/own_agents.py fit \\
        --data.workflow.init_args.episode examples/agents/frameworks/langgraph_tools.py:episode \\
        --data.workflow.init_args.agents '[solver]' --data.workflow.init_args.train_file tasks.jsonl

Tasks are rows with ``question`` and ``answer``.
"""

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = [add, multiply]


def build_graph():
    model = ChatOpenAI(model="solver", max_retries=0).bind_tools(TOOLS)

    def solver(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("solver", solver)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", tools_condition)  # a tool call goes to "tools", else END
    graph.add_edge("tools", "solver")
    return graph.compile()


def episode(task: dict, client) -> float:
    graph = build_graph()  # inside the episode: its model talks to this episode's URL
    state = graph.invoke({"messages": [("system", "Use the tools for arithmetic."), ("user", task["question"])]},
                         {"recursion_limit": 8})
    ran = sum(isinstance(m, ToolMessage) and m.status == "success" for m in state["messages"])
    return float(str(task["answer"]) in (state["messages"][-1].content or "")) + 0.1 * ran
