"""StatekeeperSaver through LangGraph's own runtime: a compiled MessagesState graph with a
scripted model, interrupts and resume (also from another process), time travel, and the
delta layout; pickle refused. Every test that takes ``store`` runs on each backend."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command
from lg_graphs import chat, with_approval
from pydantic import BaseModel

import statekeeper
from statekeeper import open_store
from statekeeper.errors import InvalidInputError, StatekeeperError, StoreCorruptError
from statekeeper.integrations.langgraph._layout import (
    BLOB,
    WRITE,
    checkpoint_entry_id,
    session_id,
)
from statekeeper.integrations.langgraph._values import ValueCodec
from statekeeper.integrations.langgraph.checkpoint import PickleRefusedError, StatekeeperSaver
from statekeeper.stores import Store

HERE = Path(__file__).parent


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def contents(state: Any) -> list[str]:
    return [m.content for m in state.values["messages"]]


async def stored_message_items(store: Store, thread_id: str) -> list[int]:
    """How many messages each stored value of the messages channel holds."""
    codec = ValueCodec(JsonPlusSerializer())
    entries = await store.read_entries("default", session_id(thread_id, ""))
    by_seq = {e.seq: e for e in entries}
    sizes = []
    for entry in entries:
        if entry.kind == BLOB and entry.payload["ch"] == "messages":
            if "from" in entry.payload:  # the delta is a pending write's value, named
                doc = by_seq[entry.payload["from"]].payload["value"]
            else:
                doc = entry.payload.get("add", entry.payload.get("value"))
            sizes.append(len(codec.decode(doc)))
    return sizes


async def test_a_conversation_stores_each_message_once(store: Store) -> None:
    graph = chat(StatekeeperSaver(store))
    for text in ("hi", "how are you", "bye"):
        await graph.ainvoke({"messages": [HumanMessage(text, id=f"h-{text}")]}, config("t1"))

    reopened = chat(StatekeeperSaver(store))
    state = await reopened.aget_state(config("t1"))
    assert contents(state) == [
        "hi",
        "reply to hi",
        "how are you",
        "reply to how are you",
        "bye",
        "reply to bye",
    ]
    # One value per step, each holding only what the step added: 6 messages, 6 items.
    assert await stored_message_items(store, "t1") == [1, 1, 1, 1, 1, 1]
    # Each message is stored once: after the first, a delta names the pending write
    # that holds its message instead of storing it again.
    entries = await store.read_entries("default", session_id("t1", ""))
    deltas = [e.payload for e in entries if e.kind == BLOB and e.payload["ch"] == "messages"]
    assert ["from" in d for d in deltas] == [False, True, True, True, True, True]


async def test_a_resumed_saver_keeps_writing_deltas(store: Store) -> None:
    await chat(StatekeeperSaver(store)).ainvoke({"messages": [("user", "one")]}, config("t2"))
    # A new saver (as after a restart) learns the stored list when it reads the thread.
    await chat(StatekeeperSaver(store)).ainvoke({"messages": [("user", "two")]}, config("t2"))
    assert await stored_message_items(store, "t2") == [1, 1, 1, 1]


async def test_an_interrupt_is_resumed_by_another_saver(store: Store) -> None:
    first = await with_approval(StatekeeperSaver(store)).ainvoke(
        {"messages": [("user", "draft")]}, config("h1")
    )
    assert first["__interrupt__"][0].value == {"question": "send this reply?"}

    graph = with_approval(StatekeeperSaver(store))
    paused = await graph.aget_state(config("h1"))
    assert paused.next == ("approve",)
    assert paused.tasks[0].interrupts[0].value == {"question": "send this reply?"}

    done = await graph.ainvoke(Command(resume="yes"), config("h1"))
    assert [m.content for m in done["messages"]] == ["draft", "reply to draft", "approved: yes"]
    assert (await graph.aget_state(config("h1"))).next == ()


def test_an_interrupt_is_resumed_in_another_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lg.db'}"
    with StatekeeperSaver.from_url(url) as saver:
        first = with_approval(saver).invoke({"messages": [("user", "draft")]}, config("p1"))
    assert "__interrupt__" in first

    env = {**os.environ, "PYTHONPATH": str(Path(statekeeper.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, str(HERE / "lg_graphs.py"), url, "p1", "ship it"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "approved: ship it"

    with StatekeeperSaver.from_url(url) as saver:
        state = with_approval(saver).get_state(config("p1"))
    assert [m.content for m in state.values["messages"]][-1] == "approved: ship it"
    assert state.next == ()


async def test_time_travel_replays_and_forks_from_a_past_checkpoint(store: Store) -> None:
    graph = chat(StatekeeperSaver(store))
    await graph.ainvoke({"messages": [("user", "first")]}, config("tt"))
    await graph.ainvoke({"messages": [("user", "second")]}, config("tt"))

    history = [s async for s in graph.aget_state_history(config("tt"))]
    assert [len(s.values.get("messages", [])) for s in history] == [4, 3, 2, 2, 1, 0]
    after_first = next(s for s in history if len(s.values.get("messages", [])) == 2 and not s.next)

    forked = await graph.ainvoke({"messages": [("user", "other")]}, after_first.config)
    assert [m.content for m in forked["messages"]] == [
        "first",
        "reply to first",
        "other",
        "reply to other",
    ]
    # The old branch is still there, whole, under its own checkpoint.
    old_tip = await graph.aget_state({"configurable": {**history[0].config["configurable"]}})
    assert contents(old_tip) == ["first", "reply to first", "second", "reply to second"]
    # Replay: run again from before the model answered the second message.
    before_reply = next(
        s for s in history if s.next == ("model",) and len(s.values["messages"]) == 3
    )
    replayed = await graph.ainvoke(None, before_reply.config)
    assert [m.content for m in replayed["messages"]][-1] == "reply to second"


async def test_update_state_that_rewrites_a_message_is_stored_whole(store: Store) -> None:
    graph = chat(StatekeeperSaver(store))
    await graph.ainvoke({"messages": [HumanMessage("hello", id="h1")]}, config("u1"))
    state = await graph.aget_state(config("u1"))
    # add_messages replaces a message with the same id: the list no longer extends the last.
    await graph.aupdate_state(state.config, {"messages": [AIMessage("edited", id="ai-1")]})

    again = await chat(StatekeeperSaver(store)).aget_state(config("u1"))
    assert contents(again) == ["hello", "edited"]
    assert (await stored_message_items(store, "u1"))[-1] == 2  # written whole


async def test_messages_are_stored_as_json_and_other_values_as_msgpack_in_base64(
    store: Store,
) -> None:
    saver = StatekeeperSaver(store)
    when = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    values = {
        "messages": [HumanMessage("hello", id="h1"), AIMessageChunk("part", id="a1")],
        "plain": {"n": 1, "tags": ["x"]},
        "when": when,
    }
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = {k: saver.get_next_version(None, None) for k in values}
    stored = await saver.aput(
        config("j1"), checkpoint, {"source": "input", "step": -1}, checkpoint["channel_versions"]
    )

    entries = await store.read_entries("default", session_id("j1", ""))
    docs = {e.payload["ch"]: e.payload["value"] for e in entries if e.kind == BLOB}
    assert docs["plain"] == {"json": {"n": 1, "tags": ["x"]}}
    assert docs["when"]["type"] == "msgpack"
    assert isinstance(docs["when"]["b64"], str)
    # A list with a message type outside the built-in set goes whole through msgpack.
    assert docs["messages"]["type"] == "msgpack"

    again = await StatekeeperSaver(store).aget_tuple(stored)
    assert again is not None
    assert again.checkpoint["channel_values"] == values


async def test_built_in_messages_are_stored_as_readable_json(store: Store) -> None:
    await chat(StatekeeperSaver(store)).ainvoke(
        {"messages": [HumanMessage("hi", id="h1")]}, config("j2")
    )
    entries = await store.read_entries("default", session_id("j2", ""))
    stored = [
        e.payload["value"] for e in entries if e.kind == WRITE and e.payload["ch"] == "messages"
    ]
    # The input's write and the model's, in either order (separate checkpoints).
    expected = [
        {"msgs": [["HumanMessage", {"content": "hi", "type": "human", "id": "h1"}]]},
        {"msgs": [["AIMessage", {"content": "reply to hi", "type": "ai", "id": "ai-1"}]]},
    ]
    assert sorted(stored, key=str) == sorted(expected, key=str)


async def test_a_pickle_fallback_serializer_is_refused(store: Store) -> None:
    with pytest.raises(PickleRefusedError, match="pickle_fallback"):
        StatekeeperSaver(store, serde=JsonPlusSerializer(pickle_fallback=True))


class PicklingSerde(JsonPlusSerializer):
    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return "pickle", b"\x80\x04N."


async def test_a_value_the_serializer_would_pickle_is_refused_and_nothing_is_written(
    store: Store,
) -> None:
    graph = chat(StatekeeperSaver(store, serde=PicklingSerde()))
    with pytest.raises(PickleRefusedError, match="JSON only"):
        await graph.ainvoke({"messages": [("user", "x")]}, config("pk"))
    assert await StatekeeperSaver(store).aget_tuple(config("pk")) is None


async def test_sync_methods_refuse_to_block_their_own_loop(store: Store) -> None:
    saver = StatekeeperSaver(store)
    with pytest.raises(StatekeeperError, match="use the async method"):
        saver.get_tuple(config("s1"))


async def test_tenants_do_not_see_each_others_threads(store: Store) -> None:
    await chat(StatekeeperSaver(store, tenant="alice")).ainvoke(
        {"messages": [("user", "secret")]}, config("shared")
    )
    bob = StatekeeperSaver(store, tenant="bob")
    assert await bob.aget_tuple(config("shared")) is None
    assert [t async for t in bob.alist(None)] == []


def test_a_saver_needs_a_store(tmp_path: Path) -> None:
    # Made outside a running loop is fine (test_from_url.py); an unopened store is not.
    with pytest.raises(InvalidInputError, match="from_url"):
        StatekeeperSaver(open_store(f"sqlite:///{tmp_path / 'x.db'}"))  # type: ignore[arg-type]


async def test_prune_keeps_the_latest_state_whole_and_the_thread_usable(store: Store) -> None:
    saver = StatekeeperSaver(store)
    graph = chat(saver)
    for text in ("a", "b", "c"):
        await graph.ainvoke({"messages": [HumanMessage(text, id=f"h-{text}")]}, config("pr"))
    before = contents(await graph.aget_state(config("pr")))

    await saver.aprune(["pr"], strategy="keep_latest")

    fresh = chat(StatekeeperSaver(store))
    assert len([s async for s in fresh.aget_state_history(config("pr"))]) == 1
    assert contents(await fresh.aget_state(config("pr"))) == before
    await fresh.ainvoke({"messages": [HumanMessage("d", id="h-d")]}, config("pr"))
    assert contents(await fresh.aget_state(config("pr"))) == [*before, "d", "reply to d"]


def test_an_unknown_prune_strategy_is_refused_sync_and_async(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lg.db'}"
    with StatekeeperSaver.from_url(url) as saver:
        with pytest.raises(InvalidInputError, match="keep_latest or delete"):
            saver.prune(["t"], strategy="everything")

        async def refused() -> None:
            await saver.aprune(["t"], strategy="everything")

        with pytest.raises(InvalidInputError, match="keep_latest or delete"):
            asyncio.run(refused())


async def test_deleting_an_earlier_run_keeps_what_later_checkpoints_need(store: Store) -> None:
    saver = StatekeeperSaver(store)
    graph = chat(saver)
    # As LangGraph's server does: the run id in the config's metadata goes into each
    # checkpoint's metadata.
    first: Any = {"configurable": {"thread_id": "dr"}, "metadata": {"run_id": "run-1"}}
    second: Any = {"configurable": {"thread_id": "dr"}, "metadata": {"run_id": "run-2"}}
    await graph.ainvoke({"messages": [HumanMessage("one", id="h1")]}, first)
    await graph.ainvoke({"messages": [HumanMessage("two", id="h2")]}, second)

    await saver.adelete_for_runs(["run-1"])

    fresh = chat(StatekeeperSaver(store))
    history = [s async for s in fresh.aget_state_history(config("dr"))]
    assert {s.metadata["run_id"] for s in history} == {"run-2"}
    assert contents(await fresh.aget_state(config("dr"))) == [
        "one",
        "reply to one",
        "two",
        "reply to two",
    ]


async def test_a_copied_thread_continues_on_its_own(store: Store) -> None:
    saver = StatekeeperSaver(store)
    graph = chat(saver)
    await graph.ainvoke({"messages": [HumanMessage("x", id="hx")]}, config("src"))
    await saver.acopy_thread("src", "dst")

    fresh = chat(StatekeeperSaver(store))
    await fresh.ainvoke({"messages": [HumanMessage("y", id="hy")]}, config("dst"))
    assert contents(await fresh.aget_state(config("dst"))) == ["x", "reply to x", "y", "reply to y"]
    assert contents(await fresh.aget_state(config("src"))) == ["x", "reply to x"]


def test_the_sync_api_runs_a_graph_and_lists_its_history(tmp_path: Path) -> None:
    with StatekeeperSaver.from_url(f"sqlite:///{tmp_path / 's.db'}") as saver:
        graph = chat(saver)
        graph.invoke({"messages": [HumanMessage("sync", id="hs")]}, config("sy"))
        history = list(graph.get_state_history(config("sy")))
        assert [len(s.values.get("messages", [])) for s in history] == [2, 1, 0]
        assert [t.checkpoint["id"] for t in saver.list(config("sy"), limit=1)] == [
            history[0].config["configurable"]["checkpoint_id"]
        ]
        saver.delete_thread("sy")
        assert saver.get_tuple(config("sy")) is None


async def test_a_damaged_checkpoint_row_is_reported_and_the_rest_still_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "damaged.db"
    async with open_store(f"sqlite:///{db}") as store:
        graph = chat(StatekeeperSaver(store))
        await graph.ainvoke({"messages": [HumanMessage("hi", id="h1")]}, config("bad"))
        history = [s async for s in graph.aget_state_history(config("bad"))]
    damaged = history[-1].config["configurable"]["checkpoint_id"]
    with sqlite3.connect(db) as conn:
        changed = conn.execute(
            "UPDATE entries SET payload = '{broken' WHERE id = ?", (checkpoint_entry_id(damaged),)
        )
        assert changed.rowcount == 1
    async with open_store(f"sqlite:///{db}") as store:
        saver = StatekeeperSaver(store)
        listed = [t.checkpoint["id"] async for t in saver.alist(config("bad"))]
        assert damaged not in listed
        assert len(listed) == len(history) - 1
        assert "cannot be read" in caplog.text
        with pytest.raises(StoreCorruptError, match="cannot be read"):
            await saver.aget_tuple({"configurable": {"thread_id": "bad", "checkpoint_id": damaged}})


async def test_threads_whose_ids_differ_after_a_nul_stay_apart(store: Store) -> None:
    saver = StatekeeperSaver(store)
    graph = chat(saver)
    for thread_id in ("a", "a\x00b"):
        await graph.ainvoke({"messages": [HumanMessage(thread_id, id="h")]}, config(thread_id))

    await saver.adelete_thread("a")

    assert await saver.aget_tuple(config("a")) is None
    kept = await saver.aget_tuple(config("a\x00b"))
    assert kept is not None
    assert kept.checkpoint["channel_values"]["messages"][0].content == "a\x00b"
    assert [t.config["configurable"]["thread_id"] async for t in saver.alist(None, limit=1)] == [
        "a\x00b"
    ]


class Note(BaseModel):
    text: str


async def test_a_strict_msgpack_clone_revives_the_types_it_allows(store: Store) -> None:
    strict = StatekeeperSaver(store, serde=JsonPlusSerializer(allowed_msgpack_modules=None))
    allowing = strict.with_allowlist({(Note.__module__, "Note")})
    assert allowing is not strict

    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"note": Note(text="kept")}
    checkpoint["channel_versions"] = {"note": strict.get_next_version(None, None)}
    stored = await allowing.aput(config("al"), checkpoint, {}, checkpoint["channel_versions"])

    found = await allowing.aget_tuple(stored)
    assert found is not None
    assert found.checkpoint["channel_values"]["note"] == Note(text="kept")
    refused = await strict.aget_tuple(stored)
    assert refused is not None
    assert not isinstance(refused.checkpoint["channel_values"]["note"], Note)
