"""Graphs for the LangGraph tests: MessagesState with a scripted "model" (no network).

Run as a script to resume an interrupted thread in a fresh process:
``python lg_graphs.py <sqlite url> <thread id> <answer>`` prints the last message.
"""

from __future__ import annotations

import sys
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt


def model(state: MessagesState) -> dict[str, Any]:
    """A scripted model: answers the last message, with a stable id."""
    n = len(state["messages"])
    return {
        "messages": [AIMessage(content=f"reply to {state['messages'][-1].content}", id=f"ai-{n}")]
    }


def approve(state: MessagesState) -> dict[str, Any]:
    """Human in the loop: stops until a person answers."""
    answer = interrupt({"question": "send this reply?"})
    n = len(state["messages"])
    return {"messages": [AIMessage(content=f"approved: {answer}", id=f"ok-{n}")]}


def chat(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_edge(START, "model")
    builder.add_edge("model", END)
    return builder.compile(checkpointer=checkpointer)


def with_approval(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("approve", approve)
    builder.add_edge(START, "model")
    builder.add_edge("model", "approve")
    builder.add_edge("approve", END)
    return builder.compile(checkpointer=checkpointer)


def main(argv: list[str]) -> None:
    from statekeeper.integrations.langgraph.checkpoint import StatekeeperSaver

    url, thread_id, answer = argv
    with StatekeeperSaver.from_url(url) as saver:
        graph = with_approval(saver)
        result = graph.invoke(Command(resume=answer), {"configurable": {"thread_id": thread_id}})
        print(result["messages"][-1].content)


if __name__ == "__main__":
    main(sys.argv[1:])
