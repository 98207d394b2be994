"""Each adapter built from a URL in a plain synchronous script (no event loop of its own),
used through its framework's synchronous entry points and ``asyncio.run`` (a new loop
each time), then closed. Run by ``test_from_url.py`` as a subprocess:

    python sync_app.py oai URL         # StatekeeperSession.from_url + Runner.run_sync
    python sync_app.py langgraph URL   # StatekeeperSaver.from_url + graph.invoke
    python sync_app.py adk URL         # StatekeeperSessionService.from_url + runner.run

Each prints one JSON object: what was stored, whether the store the adapter opened was
closed by ``close()``, and what a call after ``close()`` raised.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

from statekeeper.stores import Store


def spy_on_close(store: Store) -> list[str]:
    """Record calls of ``store.close`` (the store still closes)."""
    calls: list[str] = []
    close = store.close

    async def recorded() -> None:
        calls.append("close")
        await close()

    store.close = recorded  # type: ignore[method-assign]
    return calls


def refused(call: Callable[[], Any]) -> list[str]:
    """What a call raised (it must raise): its type, and "RuntimeError" if it is one."""
    try:
        call()
    except Exception as exc:
        return [type(exc).__name__, *(["RuntimeError"] if isinstance(exc, RuntimeError) else [])]
    raise AssertionError("a call after close() was not refused")


def oai(url: str) -> dict[str, Any]:
    from agents import Runner
    from oai_app import RUN_CONFIG, ScriptedModel, make_agent, say

    from statekeeper.integrations.openai_agents import StatekeeperSession

    session = StatekeeperSession.from_url("chat", url, tenant="sync")
    agent = make_agent(ScriptedModel([[say("one")], [say("two", 2)]]))
    first = Runner.run_sync(agent, "hi", session=session, run_config=RUN_CONFIG)
    asyncio.run(session.add_items([{"role": "user", "content": "by asyncio.run"}]))
    second = Runner.run_sync(agent, "again", session=session, run_config=RUN_CONFIG)
    items = asyncio.run(session.get_items())
    closes = spy_on_close(session.store)
    session.close()
    return {
        "outputs": [first.final_output, second.final_output],
        "items": [item.get("content") for item in items if item.get("role") == "user"],
        "closes": closes,
        "after_close": refused(lambda: asyncio.run(session.get_items())),
    }


def langgraph(url: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage
    from lg_graphs import chat

    from statekeeper.integrations.langgraph import StatekeeperSaver

    config: Any = {"configurable": {"thread_id": "t1"}}
    saver = StatekeeperSaver.from_url(url, tenant="sync")
    graph = chat(saver)
    graph.invoke({"messages": [HumanMessage("one", id="h1")]}, config)
    asyncio.run(graph.ainvoke({"messages": [HumanMessage("two", id="h2")]}, config))
    graph.invoke({"messages": [HumanMessage("three", id="h3")]}, config)
    messages = [m.content for m in graph.get_state(config).values["messages"]]
    closes = spy_on_close(saver.store)
    saver.close()
    return {
        "messages": messages,
        "closes": closes,
        "after_close": refused(lambda: graph.get_state(config)),
    }


def adk(url: str) -> dict[str, Any]:
    from adk_app import APP, USER, make_runner
    from google.genai import types

    from statekeeper.integrations.adk import StatekeeperSessionService

    service = StatekeeperSessionService.from_url(url, tenant="sync")
    runner = make_runner(service)
    asyncio.run(service.create_session(app_name=APP, user_id=USER, session_id="s1"))
    replies = []
    for text in ("apples", "pears"):  # each run: a thread and an event loop of its own
        message = types.Content(role="user", parts=[types.Part(text=text)])
        for event in runner.run(user_id=USER, session_id="s1", new_message=message):
            if event.content and event.content.parts:
                replies += [p.text for p in event.content.parts if p.text]
    session = asyncio.run(service.get_session(app_name=APP, user_id=USER, session_id="s1"))
    assert session is not None
    closes = spy_on_close(service.store)
    service.close()
    return {
        "replies": replies,
        "items": session.state["items"],
        "closes": closes,
        "after_close": refused(
            lambda: asyncio.run(service.get_session(app_name=APP, user_id=USER, session_id="s1"))
        ),
    }


if __name__ == "__main__":
    adapter, store_url = sys.argv[1:3]
    print(json.dumps({"oai": oai, "langgraph": langgraph, "adk": adk}[adapter](store_url)))
