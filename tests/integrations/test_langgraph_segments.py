"""Long threads read back in bounded work: a delta chain rests on segments (`_spine`), so
a saver that has not seen a thread (another process) reads a bounded number of entries,
whatever the thread's length; every past checkpoint still reads; threads written before
segments existed (layout version 1) still read and carry on."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from statekeeper import open_store
from statekeeper.integrations.langgraph import _spine
from statekeeper.integrations.langgraph._layout import (
    AGENT_ID,
    NS_KEY,
    THREAD_KEY,
    session_id,
)
from statekeeper.integrations.langgraph._reads import _WINDOW
from statekeeper.integrations.langgraph._values import ValueCodec
from statekeeper.integrations.langgraph.checkpoint import StatekeeperSaver
from statekeeper.stores import Store
from statekeeper.stores.types import Entry, EntryDraft, SessionPatch, SessionRecord

OLD_THREAD = Path(__file__).parent / "langgraph_data" / "thread_v1.json"


def message(n: int) -> BaseMessage:
    return AIMessage(content=f"turn {n}", id=f"m-{n}")


class Thread:
    """A thread grown one step at a time, as LangGraph's loop stores a model turn: the
    node's new message as a pending write, then the checkpoint holding the whole list."""

    def __init__(self, saver: StatekeeperSaver, thread_id: str = "") -> None:
        self.saver = saver
        self.messages: list[BaseMessage] = []
        self.config: Any = {
            "configurable": {"thread_id": thread_id or str(uuid.uuid4()), "checkpoint_ns": ""}
        }
        self.version: Any = None

    async def step(self, n: int) -> None:
        if self.version is not None:
            new = message(n)
            await self.saver.aput_writes(self.config, [("messages", [new])], str(uuid.uuid4()))
            self.messages = [*self.messages, new]
        self.version = self.saver.get_next_version(self.version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": self.messages}
        checkpoint["channel_versions"] = {"messages": self.version}
        metadata: Any = {"source": "loop", "step": n, "parents": {}}
        versions = {"messages": self.version}
        self.config = await self.saver.aput(self.config, checkpoint, metadata, versions)

    async def grow(self, steps: int) -> None:
        for _ in range(steps):
            await self.step(len(self.messages))


class Counting:
    """A store that counts the entries its reads return."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def read_entries(self, *args: Any, **kwargs: Any) -> list[Entry]:
        found: list[Entry] = await self._store.read_entries(*args, **kwargs)
        self.read += len(found)
        return found

    async def get_entry(self, *args: Any, **kwargs: Any) -> Entry:
        self.read += 1
        found: Entry = await self._store.get_entry(*args, **kwargs)
        return found


async def cold_read(store: Store, config: Any) -> tuple[list[str], int]:
    """The thread's latest messages as a new saver reads them (as ``get_state`` does, by
    the thread, and by the id of its latest checkpoint), and how many entries the first
    of these two reads read."""
    counting = Counting(store)
    latest: Any = {
        "configurable": {k: v for k, v in config["configurable"].items() if k != "checkpoint_id"}
    }
    found = await StatekeeperSaver(counting).aget_tuple(latest)
    assert found is not None
    by_id = await StatekeeperSaver(store).aget_tuple(found.config)
    assert by_id is not None
    messages = found.checkpoint["channel_values"]["messages"]
    assert by_id.checkpoint["channel_values"]["messages"] == messages
    return [m.content for m in messages], counting.read


def contents(messages: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages]


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments every 3 steps, merged by 3: a few hundred steps reach four levels."""
    monkeypatch.setattr(_spine, "TAIL", 3)
    monkeypatch.setattr(_spine, "FANOUT", 3)


async def test_a_cold_read_reads_a_bounded_number_of_entries() -> None:
    async with open_store("memory://") as store:
        thread = Thread(StatekeeperSaver(store))
        await thread.grow(500)
        short, read_short = await cold_read(store, thread.config)
        assert short == contents(thread.messages)
        await thread.grow(1500)
        long, read_long = await cold_read(store, thread.config)
        assert long == contents(thread.messages)
    # The log's last entries (the checkpoint, its writes, and the chain back to the
    # segments: < TAIL steps of a delta, its write and its checkpoint), then fewer than
    # FANOUT segments per level (at most three levels by 2,000 steps): not the thread's
    # length (3 entries per step before segments).
    bound = _WINDOW + 3 * (_spine.FANOUT - 1) + 4
    assert read_short <= bound
    assert read_long <= bound
    assert read_long - read_short <= 3 * (_spine.FANOUT - 1)
    assert read_long < 3 * 500


@pytest.mark.usefixtures("small")
async def test_every_checkpoint_reads_back_through_levels_of_segments(store: Store) -> None:
    thread = Thread(StatekeeperSaver(store))
    seen: list[list[str]] = []
    for n in range(90):
        await thread.step(n)
        seen.append(contents(thread.messages))
        if n % 7 == 0:  # a new saver, as another process, picks the thread up midway
            thread.saver = StatekeeperSaver(store)
            assert (await cold_read(store, thread.config))[0] == seen[-1]
    whole: Any = {"configurable": {"thread_id": thread.config["configurable"]["thread_id"]}}
    listed = [t async for t in StatekeeperSaver(store).alist(whole)]
    assert [contents(t.checkpoint["channel_values"]["messages"]) for t in listed] == seen[::-1]
    for past in (listed[5], listed[40], listed[-2]):  # a checkpoint by id, cold
        found = await StatekeeperSaver(store).aget_tuple(past.config)
        assert found is not None
        assert contents(found.checkpoint["channel_values"]["messages"]) == contents(
            past.checkpoint["channel_values"]["messages"]
        )


@pytest.mark.usefixtures("small")
async def test_prune_and_copy_keep_the_segments_a_thread_needs(store: Store) -> None:
    thread = Thread(StatekeeperSaver(store))
    await thread.grow(60)
    await thread.saver.acopy_thread(thread.config["configurable"]["thread_id"], "copy")
    await thread.saver.aprune([thread.config["configurable"]["thread_id"]])
    assert (await cold_read(store, thread.config))[0] == contents(thread.messages)
    copied = {"configurable": {"thread_id": "copy", "checkpoint_ns": ""}}
    assert (await cold_read(store, copied))[0] == contents(thread.messages)
    await thread.grow(20)  # the pruned thread goes on growing
    assert (await cold_read(store, thread.config))[0] == contents(thread.messages)


async def test_a_thread_written_before_segments_still_reads_and_carries_on(store: Store) -> None:
    old = json.loads(OLD_THREAD.read_text())
    sid = session_id(old["thread"], "")
    metadata = {THREAD_KEY: old["thread"], NS_KEY: ""}
    record = SessionRecord(id=sid, tenant="default", agent_id=AGENT_ID, metadata=metadata)
    await store.create_session(record)
    drafts = [
        EntryDraft(id=e["id"], kind=e["kind"], payload=e["payload"], parent=None, side=True)
        for e in old["entries"]
    ]
    patch = SessionPatch(set={"state": old["state"]})
    stored = (await store.append_entries("default", sid, drafts, patch=patch)).entries
    assert [e.seq for e in stored] == [e["seq"] for e in old["entries"]]  # deltas name seqs

    config: Any = {"configurable": {"thread_id": old["thread"], "checkpoint_ns": ""}}
    assert (await cold_read(store, config))[0] == old["messages"]
    # A saver that read it goes on writing: deltas on the old chain, then segments.
    saver = StatekeeperSaver(store)
    latest = await saver.aget_tuple(config)
    assert latest is not None
    thread = Thread(saver, old["thread"])
    thread.config = latest.config
    thread.messages = list(latest.checkpoint["channel_values"]["messages"])
    thread.version = latest.checkpoint["channel_versions"]["messages"]
    await thread.grow(_spine.TAIL + 5)
    assert (await cold_read(store, config))[0] == contents(thread.messages)
    entries = await store.read_entries("default", sid)
    assert any(e.id.startswith("s:") for e in entries)


@pytest.mark.usefixtures("small")
async def test_no_segment_outgrows_a_quarter_of_the_stores_largest_entry() -> None:
    async with open_store("memory://?max_payload_bytes=20000") as store:
        thread = Thread(StatekeeperSaver(store))
        await thread.grow(250)  # level 4 would hold 81 steps: about 7 KB of messages
        assert (await cold_read(store, thread.config))[0] == contents(thread.messages)
        sid = session_id(thread.config["configurable"]["thread_id"], "")
        entries = await store.read_entries("default", sid)
    segments = [e for e in entries if e.id.startswith("s:")]
    assert max(len(json.dumps(e.payload)) for e in segments) <= 5000
    assert max(len(e.payload["parts"][0]["msgs"]) for e in segments) == 27  # level 3


@pytest.mark.parametrize(
    "original",
    [
        AIMessage("a reply", id="a-1"),
        AIMessage("named", name="bot"),
        HumanMessage("a question", id="h-1"),
        HumanMessage(""),
        SystemMessage("be brief"),
        ToolMessage("42", tool_call_id="call-1", id="t-1"),
        ChatMessage(content="hello", role="user"),
        FunctionMessage(content="result", name="fn"),
        AIMessage("", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1"}]),
        RemoveMessage(id="gone"),
    ],
)
def test_a_stored_message_reads_back_as_validation_would_build_it(original: Any) -> None:
    codec = ValueCodec(JsonPlusSerializer())
    (name, fields) = codec.encode([original])["msgs"][0]
    (read,) = codec.decode({"msgs": [[name, fields]]})
    validated = type(original)(**fields)
    assert read == original
    assert list(read.__dict__.items()) == list(validated.__dict__.items())
    assert read.model_fields_set == validated.model_fields_set
    assert read.__pydantic_extra__ == validated.__pydantic_extra__
    assert read.__pydantic_private__ == validated.__pydantic_private__
    assert repr(read) == repr(validated)
    assert read.model_dump() == validated.model_dump()
