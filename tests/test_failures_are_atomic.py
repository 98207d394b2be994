"""The rule of issue 11, as a property over the public API: a call either succeeds or
raises a `StatekeeperError` subclass, and a call that raised changed nothing.

Hypothesis draws calls with bad inputs (hostile ids, non-JSON values, NaN, payloads past
the store's size limit, wrong types, stale versions) against a store holding a session,
a fork, records and an event log. Each call is checked against a `snapshot` of the
tenant (and of the app-wide state tenant) taken just before it.

Inputs another part of the issue turns into typed errors are left out of the generators
here (deep nesting, bytes, integer dict keys, non-`Message` appends, bad ``limit`` values
and bad ``Message`` fields); their own tests cover them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.core.messages import Message
from statekeeper.errors import StatekeeperError
from statekeeper.runs import Finish, Runner
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runtime import EventBus
from statekeeper.sessions import SessionManager
from statekeeper.sessions.state import APP_TENANT
from statekeeper.stores import Store, open_store
from statekeeper.testing.snapshot import snapshot

LIMIT = 4096  # the stores' max_payload_bytes: "huge" is cheap to make
TENANT = "alice"
NAMESPACES = ("runs", "state.user", "state.app", "ns")
LOGS = ("run_1", "run_x")

# -- generators --------------------------------------------------------------------------

hostile_ids = st.one_of(
    st.sampled_from(["s1", "s2", "fork1", "../x", "", ".", "a/b", "a..b", "x" * 129, " s1"]),
    st.text(max_size=12),
    st.none(),
    st.integers(-3, 3),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.just("h" * (LIMIT + 1)),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=6), inner, max_size=3),
    ),
    max_leaves=6,
)
texts = st.one_of(st.text(max_size=20), st.just("t" * (LIMIT + 1)))
versions = st.one_of(st.none(), st.integers(-2, 12))
state_keys = st.one_of(
    st.sampled_from(["draft", "user:x", "app:y", "temp:z", "user:", "app:"]), st.text(max_size=6)
)


def messages() -> st.SearchStrategy[Message]:
    return st.builds(
        lambda text, meta, mid: Message.user(text, metadata=meta, id=mid),
        texts,
        st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=2),
        st.sampled_from(["m1", "m2", "m9", "msg_new"]),
    )


@dataclass(frozen=True)
class Call:
    """One drawn call: ``run(store, *args)``, shown by name and arguments on failure."""

    name: str
    run: Callable[..., Awaitable[object]]
    args: tuple[Any, ...]

    def __repr__(self) -> str:
        shown = ", ".join(repr(a)[:60] for a in self.args)
        return f"{self.name}({shown})"


def call(name: str, run: Callable[..., Awaitable[object]]) -> Callable[..., Call]:
    return lambda *args: Call(name, run, args)


def _sessions(store: Store) -> SessionManager:
    return SessionManager(store, TENANT)


def session_calls() -> st.SearchStrategy[Call]:
    async def create(store: Store, sid: Any, title: Any, meta: Any, msgs: list[Message]) -> Any:
        return await _sessions(store).create(
            session_id=sid, title=title, metadata=meta, messages=msgs
        )

    async def append(store: Store, sid: Any, msgs: list[Message]) -> Any:
        return await (await _sessions(store).get(sid)).append(*msgs)

    async def fork(store: Store, sid: Any, at: Any, new_id: Any) -> Any:
        return await (await _sessions(store).get(sid)).fork(at, session_id=new_id)

    async def update(store: Store, sid: Any, fields: dict[str, Any]) -> Any:
        return await (await _sessions(store).get(sid)).update(**fields)

    async def state(store: Store, sid: Any, delta: dict[str, Any], stale: bool) -> Any:
        session = await _sessions(store).get(sid)
        if stale:
            await (await _sessions(store).get(sid)).append(Message.user("meanwhile"))
            # That append changed the store, so this call checks its stale update itself.
            before = await _picture(store)
            try:
                await session.state.update(delta)
            except StatekeeperError:
                assert await _picture(store) == before, "a stale state update changed the store"
            return None
        return await session.state.update(delta)

    async def import_(store: Store, sid: Any, damage: str, new_id: Any) -> Any:
        document = await _sessions(store).export("s1")
        entries = document["entries"]
        if damage == "parent" and entries:
            entries[-1]["parent_seq"] = len(entries) + 3
        elif damage == "duplicate" and len(entries) > 1:
            entries[-1]["id"] = entries[0]["id"]
        elif damage == "huge" and entries:
            entries[-1]["payload"] = {"blob": "b" * LIMIT}
        elif damage == "nan" and entries:
            entries[-1]["payload"] = {"v": math.nan}
        return await _sessions(store).import_(document, session_id=new_id)

    async def listing(store: Store, agent: Any, meta: Any, cursor: Any) -> Any:
        return await _sessions(store).list(agent_id=agent, metadata=meta, cursor=cursor)

    fields = st.dictionaries(
        st.sampled_from(["title", "metadata", "model_override", "thinking_level"]),
        st.one_of(texts, st.dictionaries(st.text(min_size=1, max_size=4), json_values)),
        max_size=2,
    )
    sids = st.one_of(st.sampled_from(["s1", "s2", "fork1"]), hostile_ids)
    meta = st.dictionaries(st.text(max_size=6), json_values, max_size=2)
    return st.one_of(
        st.builds(
            call("create", create),
            hostile_ids,
            st.one_of(st.none(), texts),
            meta,
            st.lists(messages(), max_size=2),
        ),
        st.builds(call("append", append), sids, st.lists(messages(), max_size=3)),
        st.builds(
            call("fork", fork),
            sids,
            st.one_of(st.none(), st.integers(-2, 9), st.text(max_size=5)),
            hostile_ids,
        ),
        st.builds(call("update", update), sids, fields),
        st.builds(
            call("state", state),
            sids,
            st.dictionaries(state_keys, json_values, max_size=3),
            st.booleans(),
        ),
        st.builds(
            call("import", import_),
            sids,
            st.sampled_from(["none", "parent", "duplicate", "huge", "nan"]),
            hostile_ids,
        ),
        st.builds(
            call("list", listing),
            st.one_of(st.none(), st.text(max_size=6)),
            st.dictionaries(
                st.text(max_size=5),
                st.one_of(scalars, st.lists(scalars, max_size=1)),
                max_size=1,
            ),
            st.one_of(st.none(), st.text(max_size=10)),
        ),
    )


def store_calls() -> st.SearchStrategy[Call]:
    async def put(store: Store, ns: Any, key: Any, value: Any, version: Any) -> Any:
        return await store.put_record(TENANT, ns, key, value, expected_version=version)

    async def delete(store: Store, ns: Any, key: Any, version: Any) -> Any:
        return await store.delete_record(TENANT, ns, key, expected_version=version)

    async def publish(store: Store, run_id: Any, kind: Any, payload: Any) -> Any:
        return await EventBus(store, TENANT).publish(run_id, "assistant", kind, payload)

    async def start(store: Store, run_id: Any, sid: Any) -> Any:
        runner = Runner(store, TENANT, [ScriptedAgent("a", [Finish("done")])])
        return await runner.start("a", "hi", run_id=run_id, session_id=sid)

    namespaces = st.one_of(st.sampled_from(["ns", "runs"]), hostile_ids)
    return st.one_of(
        st.builds(
            call("put_record", put),
            namespaces,
            hostile_ids,
            json_values,
            versions,
        ),
        st.builds(call("delete_record", delete), namespaces, hostile_ids, versions),
        st.builds(
            call("publish", publish),
            st.one_of(st.sampled_from(LOGS), hostile_ids),
            st.sampled_from(["partial", "complete", "bogus", ""]),
            st.one_of(st.none(), st.dictionaries(st.text(max_size=5), json_values, max_size=2)),
        ),
        st.builds(
            call("start", start),
            st.one_of(st.none(), hostile_ids),
            st.one_of(st.none(), st.sampled_from(["s1", "s2", "nope"])),
        ),
    )


# -- the property ------------------------------------------------------------------------


async def _seed(store: Store) -> None:
    sessions = _sessions(store)
    first = await sessions.create(session_id="s1", agent_id="bot", metadata={"k": "v"})
    await first.append(Message.user("one", id="m1"), Message.assistant("two", id="m2"))
    await first.fork(1, session_id="fork1")
    await first.state.update({"user:x": 1, "app:y": 2, "draft": 3})
    await sessions.create(session_id="s2")
    await store.put_record(TENANT, "ns", "k1", {"v": 1})
    await EventBus(store, TENANT).publish("run_1", "assistant", "partial", {"text": "hi"})


async def _picture(store: Store) -> tuple[Any, Any]:
    mine = await snapshot(store, TENANT, namespaces=NAMESPACES, event_logs=LOGS)
    app = await snapshot(store, APP_TENANT, namespaces=("state.app",))
    return mine, app


async def _check(store: Store, call: Call) -> None:
    name = call.name
    before = await _picture(store)
    try:
        await call.run(store, *call.args)
    except StatekeeperError:
        after = await _picture(store)
        assert after == before, f"{name} failed but changed the store"
    except Exception as exc:  # the property: nothing untyped escapes
        pytest.fail(f"{name} raised untyped {type(exc).__name__}: {exc}")


URLS = {
    "memory": lambda tmp: f"memory://?max_payload_bytes={LIMIT}",
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'atomic.db'}?max_payload_bytes={LIMIT}",
}


@pytest.fixture(params=sorted(URLS))
def event_loop_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A seeded store, and a loop to drive it from hypothesis' synchronous examples."""
    runner = asyncio.Runner()
    store = runner.run(open_store(URLS[request.param](tmp_path)))
    runner.run(_seed(store))
    yield runner, store
    runner.run(store.close())
    runner.close()


@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(calls=st.lists(st.one_of(session_calls(), store_calls()), min_size=1, max_size=4))
def test_a_call_succeeds_or_fails_typed_and_changes_nothing(
    event_loop_store: Any, calls: list[Call]
) -> None:
    runner, store = event_loop_store
    for call in calls:
        runner.run(_check(store, call))
