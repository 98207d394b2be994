"""Each adapter built from a URL where users build them: a plain synchronous script (a
real subprocess) and inside a running event loop; and who closes the store. A store the
adapter opened is the adapter's (``close()``, ``aclose()``, ``with`` and ``async with``
close it); a store passed in stays the caller's (closing the adapter leaves it open)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from adk_app import APP, USER, make_runner, send
from agents import Runner
from langchain_core.messages import HumanMessage
from lg_graphs import chat
from oai_app import RUN_CONFIG, ScriptedModel, make_agent, say
from sync_app import spy_on_close
from test_oai_parity import store_with_url

from statekeeper.errors import InvalidInputError, StoreUnavailableError
from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.integrations.langgraph import AdapterClosedError, StatekeeperSaver
from statekeeper.integrations.openai_agents import StatekeeperSession
from statekeeper.loops import run_blocking
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import SessionQuery

HERE = Path(__file__).parent
URL_BACKENDS = ["memory", "sqlite", "postgres", "redis"]
SECONDS = 60.0


async def run_script(*argv: str) -> Any:
    """Run a helper script of this folder in a new process; its last line, as JSON.
    A process that does not finish in time is killed and fails the test."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE / argv[0]),
        *argv[1:],
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 240)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"{' '.join(argv)} did not finish in 240 s (a call hangs)")
    assert proc.returncode == 0, (out.decode()[-2000:], err.decode()[-4000:])
    return json.loads(out.decode().strip().splitlines()[-1])


# -- one table of the three adapters -----------------------------------------------------


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


async def use_session(session: Any) -> None:
    await session.add_items([{"role": "user", "content": "hello"}])
    assert (await session.get_items())[-1] == {"role": "user", "content": "hello"}


async def use_saver(saver: Any) -> None:
    thread = config(uuid.uuid4().hex)
    done = await chat(saver).ainvoke({"messages": [HumanMessage("hello", id="h")]}, thread)
    assert done["messages"][-1].content == "reply to hello"


async def use_service(service: Any) -> None:
    sid = uuid.uuid4().hex
    await service.create_session(app_name=APP, user_id=USER, session_id=sid)
    assert await service.get_session(app_name=APP, user_id=USER, session_id=sid) is not None


@dataclass(frozen=True)
class Adapter:
    from_url: Callable[[str], Any]
    over: Callable[[Store], Any]
    use: Callable[[Any], Awaitable[None]]


ADAPTERS = {
    "oai": Adapter(
        lambda url: StatekeeperSession.from_url("c", url),
        lambda store: StatekeeperSession("c", store),
        use_session,
    ),
    "langgraph": Adapter(StatekeeperSaver.from_url, StatekeeperSaver, use_saver),
    "adk": Adapter(StatekeeperSessionService.from_url, StatekeeperSessionService, use_service),
}


@pytest.fixture(params=list(ADAPTERS))
def adapter(request: pytest.FixtureRequest) -> Adapter:
    return ADAPTERS[request.param]


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


# -- a plain synchronous script ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", URL_BACKENDS)
@pytest.mark.parametrize("name", ["oai", "langgraph", "adk"])
async def test_built_from_a_url_in_a_plain_sync_script(
    name: str, backend: str, tmp_path: Path
) -> None:
    async with store_with_url(backend, tmp_path) as (store, url):
        out = await run_script("sync_app.py", name, url)
        assert out["closes"] == ["close"]  # close() closed the store it opened
        assert out["after_close"] == ["AdapterClosedError", "RuntimeError"]
        if name == "oai":
            assert out["outputs"] == ["one", "two"]
            assert out["items"] == ["hi", "by asyncio.run", "again"]
        elif name == "langgraph":
            assert out["messages"] == [
                *("one", "reply to one", "two", "reply to two", "three", "reply to three")
            ]
        else:
            assert out["replies"] == [
                "noted apples; user turns so far: 1",
                "noted pears; user turns so far: 2",
            ]
            assert out["items"] == ["apples", "pears"]
        if backend != "memory":  # and it is all in the store, for anyone to read
            assert await stored(name, store) == stored_as[name]


async def stored(name: str, store: Store) -> Any:
    """What a sync script of `sync_app.py` stored, read through another handle."""
    if name == "oai":
        items = await StatekeeperSession("chat", store, tenant="sync").get_items()
        return [i.get("content") for i in items if i.get("role") == "user"]
    if name == "langgraph":
        graph = chat(StatekeeperSaver(store, tenant="sync"))
        return len((await graph.aget_state(config("t1"))).values["messages"])
    service = StatekeeperSessionService(store, tenant="sync")
    session = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
    return session.state["items"] if session else None


stored_as = {"oai": ["hi", "by asyncio.run", "again"], "langgraph": 6, "adk": ["apples", "pears"]}


# -- inside a running event loop ---------------------------------------------------------


@pytest.mark.parametrize("backend", URL_BACKENDS)
async def test_a_session_from_a_url_inside_a_running_loop(backend: str, tmp_path: Path) -> None:
    async with store_with_url(backend, tmp_path) as (_, url):
        session = StatekeeperSession.from_url("c", url, tenant="loop")
        assert session.owns_store
        agent = make_agent(ScriptedModel([[say("hello")]]))
        result = await Runner.run(agent, "hi", session=session, run_config=RUN_CONFIG)
        assert result.final_output == "hello"
        assert [i.get("role") for i in await session.get_items()] == ["user", "assistant"]
        # the same session from another thread and its own event loop
        await asyncio.to_thread(asyncio.run, session.add_items([{"role": "user", "content": "x"}]))
        assert len(await session.get_items()) == 3

        closes = spy_on_close(session.store)
        await session.aclose()
        assert closes == ["close"]
        with pytest.raises(AdapterClosedError):
            await session.get_items()
        with pytest.raises(RuntimeError, match="closed"):  # before the empty-list shortcut
            await session.add_items([])


@pytest.mark.parametrize("backend", URL_BACKENDS)
async def test_a_saver_from_a_url_inside_a_running_loop(backend: str, tmp_path: Path) -> None:
    async with store_with_url(backend, tmp_path) as (_, url):
        saver = StatekeeperSaver.from_url(url, tenant="loop")
        graph = chat(saver)
        await graph.ainvoke({"messages": [HumanMessage("one", id="h1")]}, config("t"))
        # the sync API from a thread while this loop runs, and another loop
        await asyncio.to_thread(
            graph.invoke, {"messages": [HumanMessage("two", id="h2")]}, config("t")
        )
        await asyncio.to_thread(
            asyncio.run, graph.ainvoke({"messages": [HumanMessage("three", id="h3")]}, config("t"))
        )
        state = await graph.aget_state(config("t"))
        assert [m.content for m in state.values["messages"]][::2] == ["one", "two", "three"]

        closes = spy_on_close(saver.store)
        await saver.close()  # does not block here; awaiting it waits
        assert closes == ["close"]
        with pytest.raises(AdapterClosedError):
            await graph.aget_state(config("t"))


@pytest.mark.parametrize("backend", URL_BACKENDS)
async def test_a_session_service_from_a_url_inside_a_running_loop(
    backend: str, tmp_path: Path
) -> None:
    async with store_with_url(backend, tmp_path) as (_, url):
        service = StatekeeperSessionService.from_url(url, tenant="loop")  # not a context
        runner = make_runner(service)
        await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        assert await send(runner, "s1", "apples") == ["noted apples; user turns so far: 1"]
        # ADK's sync runner (a thread and a loop of its own), from another thread
        replies = await asyncio.to_thread(run_adk_sync, runner, "s1", "pears")
        assert replies == ["noted pears; user turns so far: 2"]

        closes = spy_on_close(service.store)
        await service.close()  # ADK's style: await service.close()
        assert closes == ["close"]
        with pytest.raises(AdapterClosedError):
            await service.get_session(app_name=APP, user_id=USER, session_id="s1")


def run_adk_sync(runner: Any, session_id: str, text: str) -> list[str]:
    from google.genai import types

    message = types.Content(role="user", parts=[types.Part(text=text)])
    replies: list[str] = []
    for event in runner.run(user_id=USER, session_id=session_id, new_message=message):
        if event.content and event.content.parts:
            replies += [p.text for p in event.content.parts if p.text]
    return replies


# -- who closes the store ----------------------------------------------------------------


async def test_async_with_closes_a_store_it_opened(adapter: Adapter, tmp_path: Path) -> None:
    async with adapter.from_url(sqlite_url(tmp_path)) as made:
        await adapter.use(made)
        closes = spy_on_close(made.store)
    assert closes == ["close"]
    with pytest.raises(AdapterClosedError):
        await adapter.use(made)


def test_with_closes_a_store_it_opened_in_sync_code(adapter: Adapter, tmp_path: Path) -> None:
    with adapter.from_url(sqlite_url(tmp_path)) as made:
        asyncio.run(adapter.use(made))
        asyncio.run(adapter.use(made))  # another loop, the same adapter
        closes = spy_on_close(made.store)
    assert closes == ["close"]
    made.close()  # idempotent


async def test_close_inside_a_running_loop_can_be_awaited_or_left(
    adapter: Adapter, tmp_path: Path
) -> None:
    made = adapter.from_url(sqlite_url(tmp_path))
    await adapter.use(made)
    closes = spy_on_close(made.store)
    closing = made.close()  # not awaited: the close goes on by itself
    for _ in range(int(SECONDS / 0.01)):
        if closing.done():
            break
        await asyncio.sleep(0.01)
    assert closing.done()
    assert closes == ["close"]
    await made.aclose()  # idempotent
    assert closes == ["close"]


async def test_a_store_passed_in_stays_open(adapter: Adapter, tmp_path: Path) -> None:
    async with open_store(sqlite_url(tmp_path)) as store:
        closes = spy_on_close(store)
        first = adapter.over(store)
        assert not first.owns_store
        await adapter.use(first)
        await first.close()
        second = adapter.over(store)
        await second.aclose()
        async with adapter.over(store) as third:
            await adapter.use(third)
        with adapter.over(store):
            pass
        assert closes == []
        await adapter.use(adapter.over(store))  # still open
        with pytest.raises(AdapterClosedError):  # the adapter itself is closed
            await adapter.use(first)


@contextmanager
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a hung server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


async def test_from_url_inside_a_loop_does_not_wait_for_the_store(adapter: Adapter) -> None:
    with silent_server() as port:
        made = adapter.from_url(f"redis://127.0.0.1:{port}/0")  # its open never ends
        call = asyncio.ensure_future(adapter.use(made))
        await asyncio.sleep(0.3)  # this loop runs on while the store opens elsewhere
        assert not call.done()
        await asyncio.wait_for(made.aclose(), SECONDS)  # closing gives up the open
        with pytest.raises(AdapterClosedError):  # the call fails, it does not hang
            await asyncio.wait_for(call, SECONDS)


async def test_a_store_that_cannot_open_fails_the_first_call(adapter: Adapter) -> None:
    made = adapter.from_url("redis://127.0.0.1:1/0")  # nothing listens on port 1
    with pytest.raises(StoreUnavailableError):
        await asyncio.wait_for(adapter.use(made), SECONDS)
    await made.aclose()
    with pytest.raises(StoreUnavailableError):
        async with adapter.from_url("redis://127.0.0.1:1/0"):
            pass


def test_a_store_that_cannot_open_fails_entering_with_in_sync_code(adapter: Adapter) -> None:
    made = adapter.from_url("redis://127.0.0.1:1/0")  # the adapter itself, not a context
    with pytest.raises(StoreUnavailableError), made:
        pass
    made.close()  # nothing to close, and no error


def test_an_unknown_url_scheme_is_refused_at_once(adapter: Adapter) -> None:
    with pytest.raises(InvalidInputError, match="unknown store URL scheme"):
        adapter.from_url("nosuchdb://x")


def test_a_saver_is_built_outside_a_running_loop_over_a_callers_store(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    for store in (run_blocking(open_store(url)), asyncio.run(open_store(url))):
        # opened on statekeeper's background loop, then on a loop that has closed since
        closes = spy_on_close(store)
        saver = StatekeeperSaver(store)
        graph = chat(saver)
        graph.invoke({"messages": [HumanMessage("sync", id="hs")]}, config("outside"))
        assert len(graph.get_state(config("outside")).values["messages"]) >= 2
        saver.close()
        assert closes == []
        assert run_blocking(store.list_sessions("default", SessionQuery())).items  # open
        run_blocking(store.close())
