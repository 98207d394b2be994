"""Compaction inside runs: automatic past a token threshold, published on the
``compaction`` stream, and by hand with `Runner.compact`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError
from statekeeper.runs import Finish, Respond, Runner, StepInput
from statekeeper.runs.compaction import AutoCompaction
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store

LONG = "word " * 100  # about a hundred tokens


async def summarize(messages: list[Message]) -> str:
    return f"summary of {len(messages)} messages"


@pytest.fixture
async def mem() -> AsyncIterator[Store]:
    store = await open_store("memory://")
    yield store
    await store.close()


def chatty(seen: list[list[str]], steps: int = 4) -> ScriptedAgent:
    """Says something long for ``steps`` steps, then finishes with what it saw."""

    def finish(run: StepInput) -> Finish:
        seen.append([m.text[:20] for m in run.messages])
        return Finish("ok")

    def say(run: StepInput) -> Respond:
        seen.append([m.text[:20] for m in run.messages])
        return Respond([Message.assistant(f"{run.state.turn}: {LONG}")])

    return ScriptedAgent("a", [*([say] * steps), finish])


async def kinds(store: Store, run_id: str) -> list[tuple[str, str]]:
    return [(e.stream, e.kind) for e in await store.read_events("alice", run_id)]


async def test_a_run_compacts_past_its_threshold_and_publishes_it(store: Store) -> None:
    seen: list[list[str]] = []
    auto = AutoCompaction(summarize, threshold_tokens=250, keep_last=1)
    runner = Runner(store, "alice", [chatty(seen)], compaction=auto)
    result = await runner.start("a", "hi")
    assert result.status == "completed"

    events = await store.read_events("alice", result.run_id)
    done = [e.payload for e in events if (e.stream, e.kind) == ("compaction", "complete")]
    starts = [e for e in events if (e.stream, e.kind) == ("compaction", "start")]
    assert len(starts) == len(done) >= 1
    assert done[0]["trigger"] == "auto"
    assert done[0]["replaced"] >= 2
    assert done[0]["tokens_freed"] > 0
    assert done[0]["tokens_after"] < done[0]["tokens_before"]
    record = (await SessionManager(store, "alice").get(result.state.session_id)).record
    assert record.compaction_count == len(done)
    # From the compaction on, the agent sees the summary instead of the old messages.
    assert any(text.startswith("summary of") for text in seen[-1])
    assert len(seen[-1]) < len(seen[-2]) + 1
    # Each compaction comes after the step before it and before the next step's reply.
    order = [(e.stream, e.kind) for e in events]
    first = order.index(("compaction", "start"))
    assert order[first + 1] == ("compaction", "complete")
    assert order[first + 2] == ("assistant", "complete")


async def test_below_the_threshold_nothing_is_compacted(mem: Store) -> None:
    auto = AutoCompaction(summarize, threshold_tokens=100_000)
    runner = Runner(mem, "alice", [chatty([])], compaction=auto)
    result = await runner.start("a", "hi")
    assert ("compaction", "start") not in await kinds(mem, result.run_id)


async def test_without_auto_compaction_a_run_never_compacts(mem: Store) -> None:
    runner = Runner(mem, "alice", [chatty([], steps=6)])
    result = await runner.start("a", "hi")
    assert ("compaction", "start") not in await kinds(mem, result.run_id)


async def test_a_failing_summariser_is_published_and_the_run_goes_on(mem: Store) -> None:
    async def broken(messages: list[Message]) -> str:
        raise RuntimeError("summariser down")

    auto = AutoCompaction(broken, threshold_tokens=150, keep_last=1)
    runner = Runner(mem, "alice", [chatty([])], compaction=auto)
    result = await runner.start("a", "hi")
    assert result.status == "completed"
    events = await mem.read_events("alice", result.run_id)
    failed = [e.payload for e in events if (e.stream, e.kind) == ("compaction", "complete")]
    assert failed
    assert all("summariser down" in p["error"] for p in failed)
    record = (await SessionManager(mem, "alice").get(result.state.session_id)).record
    assert record.compaction_count == 0


async def test_messages_appended_while_summarising_reach_the_agent_once(mem: Store) -> None:
    sessions = SessionManager(mem, "alice")
    session_ids: list[str] = []

    async def slow(messages: list[Message]) -> str:
        if len(session_ids) == 1:  # someone writes to the session while it summarises
            other = await sessions.get(session_ids[0])
            await other.append(Message.user("steer: be brief"), strict=False)
            session_ids.append("steered")
        return "short summary"

    seen_input: list[list[str]] = []
    seen: list[list[str]] = []

    def say(run: StepInput) -> Respond:
        seen_input.append([m.text for m in run.new_input])
        seen.append([m.text for m in run.messages])
        return Respond([Message.assistant(LONG)])

    agent = ScriptedAgent("a", [*[say] * 6, Finish("ok")])
    runner = Runner(mem, "alice", [agent], compaction=AutoCompaction(slow, 250, keep_last=1))
    session = await sessions.create(title="t")
    session_ids.append(session.id)
    await runner.start("a", "hi", session_id=session.id)
    assert session_ids[-1] == "steered"
    steered = [i for i, texts in enumerate(seen_input) if "steer: be brief" in texts]
    assert len(steered) == 1  # as new input, once
    # Never twice in the conversation, and not before it came as input (a compaction at
    # that step may summarise it away: keep_last=1).
    assert all(texts.count("steer: be brief") <= 1 for texts in seen)
    assert all("steer: be brief" not in texts for texts in seen[: steered[0]])


async def test_runner_compact_publishes_on_the_compaction_stream(mem: Store) -> None:
    runner = Runner(mem, "alice", [chatty([], steps=3)])
    result = await runner.start("a", "hi")
    compacted = await runner.compact(result.run_id, summarize, keep_last=1)
    assert compacted.replaced >= 2
    events = await mem.read_events("alice", result.run_id)
    payloads: dict[str, dict[str, Any]] = {
        e.kind: e.payload for e in events if e.stream == "compaction"
    }
    assert payloads["start"]["trigger"] == "manual"
    assert payloads["complete"]["replaced"] == compacted.replaced
    assert payloads["complete"]["seq"] == compacted.entry.seq if compacted.entry else False


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"threshold_tokens": 0}, "threshold_tokens must be an int >= 1"),
        ({"threshold_tokens": 10, "keep_last": -1}, "keep_last must be an int >= 0"),
        ({"threshold_tokens": True}, "threshold_tokens"),
    ],
)
def test_auto_compaction_options_are_checked(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidInputError, match=needle):
        AutoCompaction(summarize, **kwargs)
    with pytest.raises(InvalidInputError, match="needs summarize"):
        AutoCompaction("not callable", threshold_tokens=10)  # type: ignore[arg-type]
