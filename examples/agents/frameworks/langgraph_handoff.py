"""Two LangGraph agents with a handoff: a router that hands the question to a solver by calling a
``transfer_to_solver`` tool (the supervisor pattern's handoff is such a tool call), and a solver
with a calculator. Each agent is its own ``model`` on the endpoint, so drmas can train them with
different policies and agent-wise advantages.

The episode returns the team reward (1 when the final answer holds the task's answer) and the
router's own: 0.1 for handing off.
"""

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def transfer_to_solver() -> str:
    """Hand the question to the solver."""
    return "transferred to solver"


def build_graph():
    router = ChatOpenAI(model="router", max_retries=0).bind_tools([transfer_to_solver])
    solver = ChatOpenAI(model="solver", max_retries=0).bind_tools([add])

    def route(state: MessagesState) -> dict:
        return {"messages": [router.invoke(state["messages"])]}

    def handed_off(state: MessagesState) -> str:
        last = state["messages"][-1]
        calls = last.tool_calls if isinstance(last, AIMessage) else []
        return "handoff" if any(c["name"] == "transfer_to_solver" for c in calls) else END

    def solve(state: MessagesState) -> dict:
        return {"messages": [solver.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("router", route)
    graph.add_node("handoff", ToolNode([transfer_to_solver]))
    graph.add_node("solver", solve)
    graph.add_node("tools", ToolNode([add]))
    graph.add_edge(START, "router")
    graph.add_conditional_edges("router", handed_off)
    graph.add_edge("handoff", "solver")
    graph.add_conditional_edges("solver", tools_condition)
    graph.add_edge("tools", "solver")
    return graph.compile()


def episode(task: dict, client) -> dict:
    state = build_graph().invoke({"messages": [("user", task["question"])]}, {"recursion_limit": 10})
    handed = any(isinstance(m, ToolMessage) and m.name == "transfer_to_solver" for m in state["messages"])
    right = str(task["answer"]) in (state["messages"][-1].content or "")
    return {"team": float(right and handed), "router": 0.1 * handed}
