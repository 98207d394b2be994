"""The follow-up queue: steer and queue modes, dedup, drop policies, rate limit and drain."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.core.messages import Message
from statekeeper.errors import InvalidIdError, InvalidInputError, StatekeeperError
from statekeeper.runtime import (
    DropPolicy,
    DropReason,
    FollowupMode,
    FollowupQueue,
    FollowupQueueClosedError,
    FollowupQueueFullError,
    SubmitStatus,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Runner:
    """A fake agent runner: records each run, optionally holds it open or fails it."""

    def __init__(self, *, hold: bool = False, fail: frozenset[str] = frozenset()) -> None:
        self.hold = hold
        self.fail = fail
        self.runs: list[tuple[str, str]] = []
        self.ids: list[str] = []
        self.started = asyncio.Queue[str]()
        self.gates: dict[str, asyncio.Event] = {}
        self.running = 0
        self.peak = 0

    async def __call__(self, session_id: str, message: Message) -> None:
        self.runs.append((session_id, message.text))
        self.ids.append(message.id)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            self.started.put_nowait(message.text)
            if self.hold:
                await self.gates.setdefault(message.text, asyncio.Event()).wait()
            if message.text in self.fail:
                raise RuntimeError(f"run for {message.text} failed")
        finally:
            self.running -= 1

    def release(self, text: str) -> None:
        self.gates.setdefault(text, asyncio.Event()).set()

    def texts(self) -> list[str]:
        return [text for _, text in self.runs]


def msg(text: str) -> Message:
    return Message.user(text)


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


async def test_idle_session_starts_a_run_at_once() -> None:
    runner = Runner()
    queue = FollowupQueue(runner)
    outcome = await queue.submit("s1", msg("hello"))
    assert outcome.status is SubmitStatus.STARTED
    assert outcome.accepted
    assert outcome.reason is None
    assert queue.is_busy("s1")
    await queue.wait_drained("s1")
    assert runner.runs == [("s1", "hello")]
    assert queue.sessions() == []


async def test_steer_goes_to_the_active_run_and_queue_waits_for_its_end() -> None:
    runner = Runner()
    queue = FollowupQueue(runner)
    queue.mark_active("s1", "run-1")
    assert queue.active_run("s1") == "run-1"
    steered = await queue.submit("s1", msg("look at file b"), mode="steer")
    queued = await queue.submit("s1", msg("then summarise"), mode=FollowupMode.QUEUE)
    assert (steered.status, steered.mode) == (SubmitStatus.STEERED, FollowupMode.STEER)
    assert (queued.status, queued.pending) == (SubmitStatus.QUEUED, 2)
    assert texts(queue.take_steering("s1")) == ["look at file b"]
    assert queue.take_steering("s1") == []
    assert texts(queue.pending("s1")) == ["then summarise"]
    assert runner.runs == []
    queue.mark_idle("s1")
    await queue.wait_drained("s1")
    assert runner.texts() == ["then summarise"]
    assert not queue.is_busy("s1")


async def test_steering_for_an_idle_session_starts_a_run() -> None:
    runner = Runner()
    queue = FollowupQueue(runner, mode="steer")
    outcome = await queue.submit("s1", msg("nothing to steer"))
    assert (outcome.status, outcome.mode) == (SubmitStatus.STARTED, FollowupMode.STEER)
    await queue.wait_drained()
    assert runner.texts() == ["nothing to steer"]


async def test_untaken_steering_becomes_runs_after_the_active_run() -> None:
    runner = Runner()
    queue = FollowupQueue(runner)
    with queue.active("s1", "run-1"):
        await queue.submit("s1", msg("queued first"))
        await queue.submit("s1", msg("steer never taken"), mode="steer")
    await queue.wait_drained("s1")
    assert runner.texts() == ["queued first", "steer never taken"]


async def test_mode_per_session_and_per_message_override() -> None:
    queue = FollowupQueue(Runner())
    queue.set_mode("s1", FollowupMode.STEER)
    assert queue.mode("s1") is FollowupMode.STEER
    assert queue.mode("s2") is FollowupMode.QUEUE
    queue.mark_active("s1", "r")
    queue.mark_active("s2", "r")
    assert (await queue.submit("s1", msg("a"))).status is SubmitStatus.STEERED
    assert (await queue.submit("s1", msg("b"), mode="queue")).status is SubmitStatus.QUEUED
    assert (await queue.submit("s2", msg("c"))).status is SubmitStatus.QUEUED
    assert (await queue.submit("s2", msg("d"), mode="steer")).status is SubmitStatus.STEERED
    assert texts(queue.take_steering("s1")) == ["a"]
    assert texts(queue.take_steering("s2")) == ["d"]
    queue.set_mode("s1", None)
    assert queue.mode("s1") is FollowupMode.QUEUE
    await queue.close(cancel=True)


async def test_duplicates_of_a_pending_message_are_dropped() -> None:
    runner = Runner()
    queue = FollowupQueue(runner)
    queue.mark_active("s1", "r")
    assert (await queue.submit("s1", msg("same"))).status is SubmitStatus.QUEUED
    again = await queue.submit("s1", msg("same"), mode="steer")
    assert (again.status, again.reason) == (SubmitStatus.DEDUPLICATED, DropReason.DUPLICATE)
    assert not again.accepted
    assert (await queue.submit("s2", msg("same"))).status is SubmitStatus.STARTED
    assert texts(queue.pending("s1")) == ["same"]
    queue.mark_idle("s1")
    await queue.wait_drained()
    assert sorted(runner.runs) == [("s1", "same"), ("s2", "same")]
    # No longer pending: accepted again.
    assert (await queue.submit("s1", msg("same"))).status is SubmitStatus.STARTED
    await queue.wait_drained()


async def test_custom_dedup_key_and_dedup_off() -> None:
    keyed = FollowupQueue(Runner(), dedup=lambda m: m.text.strip().lower())
    keyed.mark_active("s", "r")
    await keyed.submit("s", msg("Stop"))
    assert (await keyed.submit("s", msg("  stop "))).status is SubmitStatus.DEDUPLICATED
    plain = FollowupQueue(Runner(), dedup=False)
    plain.mark_active("s", "r")
    await plain.submit("s", msg("x"))
    assert (await plain.submit("s", msg("x"))).status is SubmitStatus.QUEUED
    assert texts(plain.pending("s")) == ["x", "x"]
    # Block content (no text) is compared by its blocks, not as an empty string.
    blocks = FollowupQueue(Runner())
    blocks.mark_active("s", "r")
    image = Message.user([{"type": "image", "url": "https://example.com/a.png"}])
    other = Message.user([{"type": "image", "url": "https://example.com/b.png"}])
    assert (await blocks.submit("s", image)).status is SubmitStatus.QUEUED
    assert (await blocks.submit("s", other)).status is SubmitStatus.QUEUED
    assert (await blocks.submit("s", image)).status is SubmitStatus.DEDUPLICATED


async def test_drop_policy_oldest_evicts_the_oldest_pending() -> None:
    queue = FollowupQueue(Runner(), max_pending=2, drop_policy="oldest")
    queue.mark_active("s", "r")
    await queue.submit("s", msg("1"))
    await queue.submit("s", msg("2"))
    outcome = await queue.submit("s", msg("3"))
    assert outcome.status is SubmitStatus.QUEUED
    assert outcome.evicted is not None
    assert outcome.evicted.text == "1"
    assert outcome.pending == 2
    assert texts(queue.pending("s")) == ["2", "3"]
    # The evicted text is no longer pending, so it is not a duplicate.
    again = await queue.submit("s", msg("1"))
    assert again.evicted is not None
    assert again.evicted.text == "2"
    assert texts(queue.pending("s")) == ["3", "1"]


async def test_drop_policy_newest_drops_the_incoming_message() -> None:
    queue = FollowupQueue(Runner(), max_pending=2, drop_policy=DropPolicy.NEWEST)
    queue.mark_active("s", "r")
    await queue.submit("s", msg("1"))
    await queue.submit("s", msg("2"))
    outcome = await queue.submit("s", msg("3"))
    assert (outcome.status, outcome.reason) == (SubmitStatus.DROPPED, DropReason.QUEUE_FULL)
    assert outcome.pending == 2
    assert texts(queue.pending("s")) == ["1", "2"]


async def test_drop_policy_reject_raises_a_typed_error() -> None:
    queue = FollowupQueue(Runner(), max_pending=1, drop_policy="reject")
    queue.mark_active("s", "r")
    await queue.submit("s", msg("1"))
    with pytest.raises(FollowupQueueFullError) as info:
        await queue.submit("s", msg("2"))
    assert (info.value.session_id, info.value.max_pending) == ("s", 1)
    assert isinstance(info.value, StatekeeperError)
    assert texts(queue.pending("s")) == ["1"]


async def test_messages_arriving_too_fast_are_dropped() -> None:
    clock = FakeClock()
    queue = FollowupQueue(Runner(), min_interval=1.0, clock=clock, dedup=False)
    queue.mark_active("s", "r")
    assert (await queue.submit("s", msg("a"))).status is SubmitStatus.QUEUED
    clock.now += 0.5
    fast = await queue.submit("s", msg("b"))
    assert (fast.status, fast.reason) == (SubmitStatus.DROPPED, DropReason.TOO_FAST)
    assert (await queue.submit("other", msg("b"))).accepted  # per session
    clock.now += 0.5  # 1.0 after the last accepted one
    assert (await queue.submit("s", msg("c"))).status is SubmitStatus.QUEUED
    assert texts(queue.pending("s")) == ["a", "c"]
    clock.now += 10
    assert (await queue.submit("s", msg("d"))).accepted
    assert list(queue._last_accepted) == ["s"]  # old timestamps are pruned
    await queue.close(cancel=True)


async def test_drain_is_sequential_in_order_and_survives_a_failing_run() -> None:
    runner = Runner(hold=True, fail=frozenset({"m2"}))
    errors: list[tuple[str, str, str]] = []
    queue = FollowupQueue(runner, on_error=lambda s, m, e: errors.append((s, m.text, str(e))))
    queue.mark_active("s", "run-0")
    for i in range(1, 5):
        await queue.submit("s", msg(f"m{i}"))
    queue.mark_idle("s", "someone-else")  # a stale end changes nothing
    assert runner.runs == []
    assert queue.is_busy("s")
    queue.mark_idle("s", "run-0")
    for i in range(1, 5):
        assert await runner.started.get() == f"m{i}"
        assert runner.running == 1
        late = await queue.submit("s", msg(f"during m{i}"), mode="steer")
        assert late.status is SubmitStatus.STEERED
        assert texts(queue.take_steering("s")) == [f"during m{i}"]
        runner.release(f"m{i}")
    await queue.wait_drained("s")
    assert runner.texts() == ["m1", "m2", "m3", "m4"]
    assert runner.peak == 1
    assert errors == [("s", "m2", "run for m2 failed")]
    assert queue.sessions() == []


async def test_failing_runs_are_logged_without_on_error(caplog: pytest.LogCaptureFixture) -> None:
    queue = FollowupQueue(Runner(fail=frozenset({"x"})))
    await queue.submit("s", msg("x"))
    await queue.wait_drained()
    assert "follow-up run for session 's' failed" in caplog.text


async def test_messages_queued_during_a_drained_run_follow_it() -> None:
    runner = Runner(hold=True)
    queue = FollowupQueue(runner)
    await queue.submit("s", msg("first"))
    assert await runner.started.get() == "first"
    assert (await queue.submit("s", msg("second"))).status is SubmitStatus.QUEUED
    runner.release("first")
    assert await runner.started.get() == "second"
    runner.release("second")
    await queue.wait_drained()
    assert runner.texts() == ["first", "second"]


async def test_a_run_marked_active_inside_a_drained_run_does_not_start_a_second_drain() -> None:
    runs: list[str] = []
    queue: FollowupQueue

    async def start_run(session_id: str, message: Message) -> None:
        with queue.active(session_id, f"run-{message.text}"):
            runs.append(message.text)
            await asyncio.sleep(0)

    queue = FollowupQueue(start_run)
    for text in ("a", "b", "c"):
        await queue.submit("s", msg(text))
    await queue.wait_drained()
    assert runs == ["a", "b", "c"]
    assert queue.sessions() == []


async def test_close_rejects_and_cancel_stops_runs_and_drops_pending() -> None:
    runner = Runner(hold=True)
    queue = FollowupQueue(runner)
    await queue.submit("s", msg("running"))
    await queue.submit("s", msg("pending"))
    assert await runner.started.get() == "running"
    await queue.close(cancel=True)
    assert runner.texts() == ["running"]
    assert queue.pending("s") == []
    with pytest.raises(FollowupQueueClosedError):
        await queue.submit("s", msg("late"))


async def test_close_waits_for_the_drain() -> None:
    runner = Runner()
    queue = FollowupQueue(runner)
    await queue.submit("s", msg("a"))
    await queue.submit("s", msg("b"))
    await queue.close()
    assert runner.texts() == ["a", "b"]


async def test_memory_is_bounded_by_busy_sessions() -> None:
    runner = Runner()
    queue = FollowupQueue(runner, max_pending=3)
    for i in range(500):
        await queue.submit(f"s{i}", msg("hi"))
    await queue.wait_drained()
    assert len(runner.runs) == 500
    assert queue.sessions() == []
    assert queue._sessions == {}
    queue.mark_active("busy", "r")
    for i in range(100):
        await queue.submit("busy", msg(f"m{i}"))
    assert len(queue.pending("busy")) == 3


async def test_invalid_input_is_refused() -> None:
    queue = FollowupQueue(Runner())
    with pytest.raises(InvalidIdError):
        await queue.submit("../etc", msg("x"))
    with pytest.raises(InvalidInputError, match="must be a Message"):
        await queue.submit("s", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="mode must be one of steer, queue"):
        await queue.submit("s", msg("x"), mode="collect")
    with pytest.raises(InvalidInputError, match="drop_policy"):
        FollowupQueue(Runner(), drop_policy="summarize")
    with pytest.raises(InvalidInputError, match="max_pending"):
        FollowupQueue(Runner(), max_pending=0)
    with pytest.raises(InvalidInputError, match="min_interval"):
        FollowupQueue(Runner(), min_interval=-1)
    assert queue.sessions() == []


# -- properties -------------------------------------------------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(["steer", "queue"]), st.integers(0, 6)),
        st.tuples(st.just("take"), st.just(""), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(steps, st.integers(min_value=1, max_value=5))
def test_every_accepted_message_is_steered_or_run_once_in_order(
    ops: list[tuple[str, str, int]], max_pending: int
) -> None:
    async def scenario() -> None:
        runner = Runner()
        queue = FollowupQueue(runner, max_pending=max_pending)
        queue.mark_active("s", "r")
        steered: list[str] = []
        accepted: list[str] = []
        evicted: list[str] = []
        for kind, mode, n in ops:
            if kind == "take":
                steered += [m.id for m in queue.take_steering("s")]
                continue
            message = msg(f"t{n}")
            outcome = await queue.submit("s", message, mode=mode)
            if outcome.accepted:
                accepted.append(message.id)
            if outcome.evicted is not None:
                evicted.append(outcome.evicted.id)
            assert len(queue.pending("s")) <= max_pending
            pending_texts = texts(queue.pending("s"))
            assert len(pending_texts) == len(set(pending_texts))  # dedup holds
        queue.mark_idle("s", "r")
        await queue.wait_drained()
        assert sorted(steered + runner.ids + evicted) == sorted(accepted)
        assert runner.peak <= 1
        # Steering is taken, and runs happen, in arrival order.
        for delivered in (steered, runner.ids):
            positions = [accepted.index(i) for i in delivered]
            assert positions == sorted(positions)

    asyncio.run(scenario())


async def test_close_with_cancel_before_a_drain_started_does_not_hang() -> None:
    runner = Runner()
    queue = FollowupQueue(runner)
    await queue.submit("s", msg("never runs"))  # the drain task has not stepped yet
    await queue.close(cancel=True)
    assert runner.runs == []
    assert queue.sessions() == []


async def test_after_close_follow_ups_behind_an_active_run_still_drain() -> None:
    runner = Runner()
    queue = FollowupQueue(runner)
    queue.mark_active("s", "r")
    await queue.submit("s", msg("accepted before close"))
    await queue.close()
    queue.mark_idle("s", "r")
    await queue.wait_drained()
    assert runner.texts() == ["accepted before close"]
