"""`StatekeeperSession` on every backend: items verbatim, limits, pop, clear, isolation,
concurrent writers, statekeeper messages and forks seen as items, and typed errors."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from typing import Any

import pytest

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.errors import InvalidIdError, InvalidInputError, InvalidPayloadError
from statekeeper.integrations.openai_agents import StatekeeperSession
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

EVERY_KIND: list[dict[str, Any]] = [
    {"role": "user", "content": "Delete /tmp/report.txt, ünïcödé ✓"},
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Prefer tools."},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
            {"type": "input_file", "file_id": "file_1"},
        ],
    },
    {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "think"}],
        "encrypted_content": "gAAAA==",
    },
    {
        "arguments": '{"path": "/tmp/report.txt"}',
        "call_id": "call_1",
        "name": "delete_file",
        "type": "function_call",
        "id": "fc_1",
        "status": "completed",
    },
    {"call_id": "call_1", "output": "deleted /tmp/report.txt", "type": "function_call_output"},
    {
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "structured"}],
        "type": "function_call_output",
    },
    {
        "id": "msg_1",
        "content": [{"annotations": [], "text": "Done.", "type": "output_text", "logprobs": []}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    },
    {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "x"},
    },
    {"id": "fs_1", "type": "file_search_call", "queries": ["q"], "status": "completed"},
    {
        "id": "cu_1",
        "type": "computer_call",
        "call_id": "cc_1",
        "action": {"type": "click", "button": "left", "x": 1, "y": 2},
        "pending_safety_checks": [],
        "status": "completed",
    },
    {
        "type": "computer_call_output",
        "call_id": "cc_1",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA"},
    },
    {
        "id": "mcpr_1",
        "type": "mcp_approval_request",
        "server_label": "files",
        "name": "rm",
        "arguments": "{}",
    },
    {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False},
    {
        "id": "mcp_1",
        "type": "mcp_call",
        "server_label": "files",
        "name": "ls",
        "arguments": "{}",
        "output": "a b",
    },
    {"id": "ig_1", "type": "image_generation_call", "status": "completed", "result": None},
    {
        "id": "ls_1",
        "type": "local_shell_call",
        "call_id": "lsc_1",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
    },
    {"type": "custom_tool_call", "call_id": "ct_1", "name": "grammar", "input": "x"},
    {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "y"},
    {"type": "item_reference", "id": "msg_0"},
    {"type": "compaction", "encrypted_content": "zzz"},
    {"z": 1, "a": [1.5, None, True, {"nested": {"deep": ["x"]}}], "m": ""},  # key order kept
]
"""One of each item kind the SDK writes to a session (Responses input items)."""


def sdk(store: Store, session_id: str = "conv-1", **options: Any) -> StatekeeperSession:
    return StatekeeperSession(session_id, store, **options)


def dumped(items: list[Any]) -> list[str]:
    """Items as JSON text: equal also means the same key order."""
    return [json.dumps(item) for item in items]


async def test_every_item_kind_round_trips_verbatim(store: Store) -> None:
    session = sdk(store)
    await session.add_items(EVERY_KIND[:5])
    await session.add_items(EVERY_KIND[5:])
    assert dumped(await session.get_items()) == dumped(EVERY_KIND)
    reopened = sdk(store)  # a new handle reads what the store holds
    assert dumped(await reopened.get_items()) == dumped(EVERY_KIND)
    assert dumped([await reopened.pop_item()]) == dumped(EVERY_KIND[-1:])


async def test_stored_items_are_copies_of_what_was_given(store: Store) -> None:
    session = sdk(store)
    given = [{"role": "user", "content": "hi", "meta": {"n": 1}}]
    await session.add_items(given)  # type: ignore[list-item]
    given[0]["meta"]["n"] = 2
    read = await session.get_items()
    read[0]["meta"]["n"] = 3  # type: ignore[typeddict-unknown-key]
    assert await session.get_items() == [{"role": "user", "content": "hi", "meta": {"n": 1}}]


@pytest.mark.parametrize(
    ("limit", "settings", "expected"),
    [
        (None, None, list(range(7))),
        (3, None, [4, 5, 6]),
        (1, None, [6]),
        (100, None, list(range(7))),
        (0, None, []),
        (-1, None, list(range(7))),  # SQLiteSession: a negative LIMIT means no limit
        (None, {"limit": 2}, [5, 6]),
        (4, {"limit": 2}, [3, 4, 5, 6]),  # an explicit limit wins over the settings
        (None, {"limit": None}, list(range(7))),
        (None, {"limit": 0}, []),
    ],
)
async def test_limits(
    store: Store, limit: int | None, settings: dict[str, Any] | None, expected: list[int]
) -> None:
    session = sdk(store, session_settings=settings)
    await session.add_items([{"n": n} for n in range(4)])  # type: ignore[misc]
    await session.add_items([{"n": n} for n in range(4, 7)])  # type: ignore[misc]
    assert [item["n"] for item in await session.get_items(limit)] == expected  # type: ignore[typeddict-item]


async def test_pop_clear_and_add_again(store: Store) -> None:
    session = sdk(store)
    assert await session.pop_item() is None  # absent session
    assert await session.get_items() == []
    await session.clear_session()  # nothing to clear: no error, nothing created
    assert [r.id async for r in SessionManager(store, "default").iter()] == []
    await session.add_items([{"n": 1}, {"n": 2}, {"n": 3}])  # type: ignore[list-item]
    assert await session.pop_item() == {"n": 3}
    await session.add_items([{"n": 4}])  # type: ignore[list-item]
    assert await session.get_items() == [{"n": 1}, {"n": 2}, {"n": 4}]
    assert await session.get_items(2) == [{"n": 2}, {"n": 4}]
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.add_items([{"n": 5}])  # type: ignore[list-item]
    assert await session.get_items() == [{"n": 5}]
    assert await session.pop_item() == {"n": 5}
    assert await session.pop_item() is None
    # Everything stays stored (log-structured): pop and clear only moved the head.
    kept = await (await session.statekeeper_session()).entries()
    assert [e.payload.get("item") for e in kept if e.kind == "item"] == [
        {"n": n} for n in (1, 2, 3, 4, 5)
    ]


async def test_delete_erases_the_session(store: Store) -> None:
    session = sdk(store)
    await session.add_items([{"n": 1}])  # type: ignore[list-item]
    await session.delete()
    await session.delete()  # already gone: no error
    assert await session.get_items() == []
    assert [r.id async for r in SessionManager(store, "default").iter()] == []


async def test_sessions_are_isolated_by_id_and_tenant(store: Store) -> None:
    a, b = sdk(store, "a"), sdk(store, "b")
    other_tenant = sdk(store, "a", tenant="someone-else")
    await a.add_items([{"who": "a"}])  # type: ignore[list-item]
    await b.add_items([{"who": "b"}])  # type: ignore[list-item]
    await other_tenant.add_items([{"who": "a2"}])  # type: ignore[list-item]
    assert await a.get_items() == [{"who": "a"}]
    assert await other_tenant.get_items() == [{"who": "a2"}]
    await a.clear_session()
    assert await b.get_items() == [{"who": "b"}]
    assert await other_tenant.pop_item() == {"who": "a2"}
    assert await a.pop_item() is None
    assert await b.get_items() == [{"who": "b"}]
    listed = await SessionManager(store, "default").list()
    assert sorted(r.id for r in listed.items) == ["a", "b"]
    assert all(r.metadata == {"integration": "openai-agents"} for r in listed.items)


async def test_concurrent_writers_lose_nothing_and_keep_batches_whole(store: Store) -> None:
    writers, batches = 12, 4

    async def write(w: int) -> None:
        session = sdk(store, "busy")  # a handle each, as separate requests would have
        for n in range(batches):
            await session.add_items([{"w": w, "n": n, "i": i} for i in range(3)])  # type: ignore[misc]

    await asyncio.gather(*(write(w) for w in range(writers)))
    items = await sdk(store, "busy").get_items()
    assert len(items) == writers * batches * 3
    assert sorted(json.dumps(i, sort_keys=True) for i in items) == sorted(
        json.dumps({"w": w, "n": n, "i": i}, sort_keys=True)
        for w in range(writers)
        for n in range(batches)
        for i in range(3)
    )
    for start in range(0, len(items), 3):  # each batch contiguous, in order
        batch = items[start : start + 3]
        assert [(x["w"], x["n"], x["i"]) for x in batch] == [  # type: ignore[typeddict-item]
            (batch[0]["w"], batch[0]["n"], i)
            for i in range(3)  # type: ignore[typeddict-item]
        ]
    for w in range(writers):  # each writer's batches in its own order
        mine = [x["n"] for x in items if x["w"] == w]  # type: ignore[typeddict-item]
        assert mine == sorted(mine)


async def test_concurrent_pops_never_return_an_item_twice(store: Store) -> None:
    session = sdk(store, "pops")
    await session.add_items([{"n": n} for n in range(30)])  # type: ignore[misc]
    popped = await asyncio.gather(*(sdk(store, "pops").pop_item() for _ in range(12)))
    numbers = [p["n"] for p in popped if p is not None]  # type: ignore[typeddict-item]
    assert len(numbers) == len(set(numbers)) == 12
    assert sorted(numbers) == list(range(18, 30))  # always the newest ones
    assert [i["n"] for i in await session.get_items()] == list(range(18))  # type: ignore[typeddict-item]


async def test_long_history_with_pops_reads_the_right_window(store: Store) -> None:
    session = sdk(store, "long")
    model: list[int] = []
    for n in range(0, 300, 10):
        await session.add_items([{"n": k} for k in range(n, n + 10)])  # type: ignore[misc]
        model += range(n, n + 10)
        for _ in range(n % 7):  # pops leave dead entries among the live ones
            popped = await session.pop_item()
            assert popped == {"n": model.pop()}
    for limit in (1, 5, 63, 64, 65, 129, len(model), len(model) + 5):
        assert [i["n"] for i in await session.get_items(limit)] == model[-limit:]  # type: ignore[typeddict-item]
    assert [i["n"] for i in await session.get_items()] == model  # type: ignore[typeddict-item]


async def test_statekeeper_messages_and_forks_show_as_items(store: Store) -> None:
    manager = SessionManager(store, "default")
    native = await manager.create(session_id="mixed")
    await native.append(Message(role="user", content="from statekeeper"))
    session = sdk(store, "mixed")
    await session.add_items([{"type": "function_call_output", "call_id": "c", "output": "x"}])
    items = await session.get_items()
    as_item = {  # a statekeeper message, in the Responses input format
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "from statekeeper"}],
    }
    assert items[0] == as_item
    assert items[1] == {"type": "function_call_output", "call_id": "c", "output": "x"}
    assert await session.get_items(1) == items[1:]
    assert await session.pop_item() == items[1]
    assert await session.pop_item() == as_item
    assert await session.pop_item() is None

    tool_use = Message.assistant(
        "Looking.", tool_calls=[ToolCallBlock(id="c1", name="lookup", arguments="{}")]
    )
    await native.refresh()
    await native.append(tool_use)  # two SDK items: the text and the function call
    before = await session.get_items()
    assert len(before) == 2
    with pytest.raises(InvalidInputError, match="2 SDK items"):
        await session.pop_item()
    assert await session.get_items() == before  # the refused pop changed nothing
    await session.clear_session()

    await session.add_items([{"n": 1}, {"n": 2}])  # type: ignore[list-item]
    fork = await (await session.statekeeper_session()).fork(session_id="forked")
    forked = sdk(store, "forked")
    await forked.add_items([{"n": 3}])  # type: ignore[list-item]
    assert await forked.get_items() == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert await forked.get_items(2) == [{"n": 2}, {"n": 3}]
    assert await session.get_items() == [{"n": 1}, {"n": 2}]
    assert fork.id == "forked"
    await forked.clear_session()
    assert await forked.get_items() == []
    assert await session.get_items() == [{"n": 1}, {"n": 2}]


@pytest.mark.parametrize(
    "bad", ["", "../escape", "a/b", "a b", "x" * 200, "..", "-lead", 7, None, "nul\x00"]
)
async def test_hostile_session_ids_are_refused(store: Store, bad: Any) -> None:
    with pytest.raises(InvalidIdError):
        StatekeeperSession(bad, store)


async def test_bad_arguments_raise_typed_errors_and_store_nothing(store: Store) -> None:
    with pytest.raises(InvalidInputError, match="statekeeper store"):
        StatekeeperSession("s", "sqlite:///x.db")  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        StatekeeperSession("s", store, tenant="../t")
    session = sdk(store, "s")
    await session.add_items([{"n": 0}])  # type: ignore[list-item]
    for bad_items in (
        {"role": "user"},
        "text",
        [{"ok": 1}, "not a dict"],
        [{"ok": 1}, {"bad": {1, 2}}],
        [{"nan": float("nan")}],
    ):
        with pytest.raises(
            InvalidPayloadError if isinstance(bad_items, list) else InvalidInputError,
            match="add_items",  # the method the caller used, not an internal one
        ):
            await session.add_items(bad_items)  # type: ignore[arg-type]
    for bad_limit in ("3", 1.5, True):
        with pytest.raises(InvalidInputError, match="limit must be an int"):
            await session.get_items(bad_limit)  # type: ignore[arg-type]
    for bad_settings in ({"limit": "abc"}, {"nope": 1}, 5):
        with pytest.raises(InvalidInputError, match="session_settings must be"):
            sdk(store, "s", session_settings=bad_settings)
    changed = sdk(store, "s")
    changed.session_settings.limit = "2"  # type: ignore[assignment,union-attr]
    with pytest.raises(InvalidInputError, match=r"session_settings\.limit"):
        await changed.get_items()
    assert await session.get_items() == [{"n": 0}]  # the failed calls stored nothing
    await session.add_items([])  # an empty list is no write, as in SQLiteSession
    assert await session.get_items() == [{"n": 0}]


async def test_corrupt_item_is_reported_and_the_rest_served(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    session = sdk(store, "hurt")
    await session.add_items([{"n": 1}])  # type: ignore[list-item]
    native = await session.statekeeper_session()
    from statekeeper.stores.base import EntryDraft

    await store.append_entries(
        "default", "hurt", [EntryDraft(kind="item", payload={"item": "not an object"})]
    )
    await session.add_items([{"n": 2}])  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING, "statekeeper.integrations.openai_agents"):
        assert await session.get_items() == [{"n": 1}, {"n": 2}]
    assert [e.seq for e in session.corrupt] == [2]
    assert "cannot be decoded" in caplog.text
    assert native.id == "hurt"


def python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )


def test_statekeeper_imports_no_sdk_and_a_missing_sdk_names_the_extra() -> None:
    done = python(
        "import sys, statekeeper, statekeeper.integrations\n"
        "assert 'agents' not in sys.modules, 'import statekeeper imported the SDK'\n"
        "sys.modules['agents'] = None  # as if it were not installed\n"
        "from statekeeper.errors import MissingExtraError\n"
        "try:\n"
        "    import statekeeper.integrations.openai_agents\n"
        "except MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'statekeeper[openai-agents]'" in done.stdout


class HeldAppends:
    """A store whose appends wait for ``release`` (everything else goes straight through)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append_entries(self, *args: Any, **kwargs: Any) -> Any:
        self.started.set()
        await self.release.wait()
        return await self._store.append_entries(*args, **kwargs)


async def test_a_cancelled_caller_learns_after_the_write_ended(store: Store) -> None:
    held = HeldAppends(store)
    session = StatekeeperSession("cancel", held)  # type: ignore[arg-type]
    task = asyncio.create_task(session.add_items([{"n": 1}]))  # type: ignore[list-item]
    await held.started.wait()
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done()  # still waiting for the write, not cancelled half-way
    held.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await sdk(store, "cancel").get_items() == [{"n": 1}]  # and the write happened
