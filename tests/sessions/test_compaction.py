"""Compaction: atomic, originals kept, concurrent appends kept, counters recorded."""

from __future__ import annotations

import asyncio

import pytest

from statekeeper.core.messages import Message, MessageCategory, ToolCallBlock
from statekeeper.sessions import SessionManager
from statekeeper.sessions.view import SUMMARY_KEY


async def summarize(messages: list[Message]) -> str:
    return "summary of " + ",".join(m.text for m in messages)


async def test_summary_replaces_older_messages_and_originals_stay(manager: SessionManager) -> None:
    chat = await manager.create(
        messages=[Message.system("sys"), Message.context("doc")]
        + [Message.user(f"m{i}") for i in range(6)]
    )
    before = chat.record.fresh_tokens
    result = await chat.compact(summarize, keep_last=2)

    assert result.replaced == 4
    texts = [m.text for m in await chat.messages()]
    assert texts == ["sys", "doc", "summary of m0,m1,m2,m3", "m4", "m5"]
    view = await chat.view()
    assert view.messages[2].category is MessageCategory.CONTEXT
    assert view.messages[2].metadata[SUMMARY_KEY] is True
    assert len(await chat.entries()) == 9  # 8 messages + the compaction entry
    assert chat.record.compaction_count == 1
    assert result.tokens_before == before
    assert chat.record.fresh_tokens == result.tokens_after == view.tokens
    assert result.tokens_freed == result.tokens_before - result.tokens_after


async def test_failing_summariser_writes_nothing(manager: SessionManager) -> None:
    chat = await manager.create(messages=[Message.user(f"m{i}") for i in range(5)])
    version = chat.version

    async def broken(messages: list[Message]) -> str:
        raise RuntimeError("model unavailable")

    with pytest.raises(RuntimeError):
        await chat.compact(broken, keep_last=1)
    again = await manager.get(chat.id)
    assert again.version == version
    assert [m.text for m in await again.messages()] == [f"m{i}" for i in range(5)]
    assert again.record.compaction_count == 0


async def test_entries_appended_while_summarising_are_kept(manager: SessionManager) -> None:
    chat = await manager.create(messages=[Message.user(f"m{i}") for i in range(5)])
    writer = await manager.get(chat.id)
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(messages: list[Message]) -> str:
        started.set()
        await release.wait()
        return "S"

    task = asyncio.create_task(chat.compact(slow, keep_last=1))
    await started.wait()
    await writer.append(Message.user("late-1"))
    await writer.append(Message.user("late-2"))
    release.set()
    result = await task

    assert result.replaced == 4
    assert [m.text for m in await chat.messages()] == ["S", "m4", "late-1", "late-2"]


async def test_second_compaction_summarises_the_first_summary(manager: SessionManager) -> None:
    chat = await manager.create(messages=[Message.user(f"m{i}") for i in range(4)])
    await chat.compact(summarize, keep_last=1)
    await chat.append(Message.user("m4"), Message.user("m5"))
    await chat.compact(summarize, keep_last=1)
    texts = [m.text for m in await chat.messages()]
    assert texts == ["summary of summary of m0,m1,m2,m3,m4", "m5"]
    assert chat.record.compaction_count == 2


async def test_a_message_kept_by_one_compaction_survives_the_next(
    manager: SessionManager,
) -> None:
    # The first summary's entry lies after m3 (kept): compacting the summary alone must
    # not drop m3 from the view unsummarised (a run compacting before each step does this).
    chat = await manager.create(messages=[Message.user(f"m{i}") for i in range(4)])
    await chat.compact(summarize, keep_last=1)
    second = await chat.compact(summarize, keep_last=1)
    assert second.replaced == 1
    texts = [m.text for m in await chat.messages()]
    assert texts == ["summary of summary of m0,m1,m2", "m3"]
    await chat.append(Message.user("m4"))
    await chat.compact(summarize, keep_last=1)
    texts = [m.text for m in await chat.messages()]
    assert texts == ["summary of summary of summary of m0,m1,m2,m3", "m4"]


async def test_compaction_never_splits_a_tool_call_from_its_result(
    manager: SessionManager,
) -> None:
    call = ToolCallBlock(id="c1", name="lookup")
    chat = await manager.create(
        messages=[
            Message.user("q1"),
            Message.assistant("a1"),
            Message.assistant("", tool_calls=[call]),
            Message.tool_result("c1", "result"),
        ]
    )
    await chat.compact(summarize, keep_last=1)
    view = await chat.messages()
    calls = {c.id for m in view for c in m.tool_calls}
    results = {r.tool_call_id for m in view for r in m.tool_results}
    assert calls == results == {"c1"}
    assert view[0].text == "summary of q1,a1"


async def test_nothing_to_compact_changes_nothing(manager: SessionManager) -> None:
    chat = await manager.create(messages=[Message.system("s"), Message.user("u")])
    result = await chat.compact(summarize, keep_last=4)
    assert result.entry is None
    assert result.replaced == 0
    assert chat.record.compaction_count == 0


# -- compactions in forks: a fork's branch holds its origin's seqs and its own -------------


@pytest.mark.parametrize("own", [3, 4, 5, 6])
async def test_a_fork_keeps_its_origins_compaction_after_appending_past_its_seqs(
    manager: SessionManager, own: int
) -> None:
    chat = await manager.create(messages=[Message.user(f"m{i}") for i in range(6)])
    await chat.compact(summarize, keep_last=2)  # through the origin's entry 4
    fork = await chat.fork()
    assert [m.text for m in await fork.messages()] == ["summary of m0,m1,m2,m3", "m4", "m5"]
    for i in range(own):  # the fork's own entries 1..own share seqs with the origin's
        await fork.append(Message.user(f"f{i}"))
    texts = [m.text for m in await fork.messages()]
    assert texts == ["summary of m0,m1,m2,m3", "m4", "m5", *[f"f{i}" for i in range(own)]]
    reopened = await manager.get(fork.id)
    assert [m.text for m in await reopened.messages()] == texts


async def test_a_forks_own_compaction_of_inherited_messages_stays_put(
    manager: SessionManager,
) -> None:
    chat = await manager.create(messages=[Message.user(f"m{i}") for i in range(6)])
    fork = await chat.fork()
    for i in range(5):  # the fork's own entries 1..5
        await fork.append(Message.user(f"f{i}"))
    # Summarises m0..m3 (inherited: the origin's 1..4), keeps m4, m5 and f0..f4.
    result = await fork.compact(summarize, keep_last=7)
    assert result.replaced == 4
    expected = ["summary of m0,m1,m2,m3", "m4", "m5", *[f"f{i}" for i in range(5)]]
    assert [m.text for m in await fork.messages()] == expected
    await fork.append(Message.user("after"))
    assert [m.text for m in await fork.messages()] == [*expected, "after"]
    # Compacting again summarises the summary and what follows it, in order.
    await fork.compact(summarize, keep_last=2)
    again = [m.text for m in await fork.messages()]
    assert again[1:] == ["f4", "after"]
    assert again[0].startswith("summary of summary of m0,m1,m2,m3,m4,m5,f0")
