"""Auth profiles inside runs: a profile per model call, rotation on a rate limit, and a
pause when no profile is free."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from statekeeper.core.messages import Message
from statekeeper.core.metrics import TokenUsage
from statekeeper.errors import InvalidInputError
from statekeeper.runs import Finish, ModelCall, RateLimited, Runner, StepInput
from statekeeper.runtime.profiles import AuthProfiles
from statekeeper.stores import Store, open_store

T0 = datetime(2030, 1, 1, tzinfo=UTC)
CALL = ModelCall("model-a", TokenUsage(input_tokens=10, output_tokens=5), cost=0.01)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class Keyed:
    """Uses the step's auth profile; the profiles in ``limited`` are rate limited."""

    name = "a"

    def __init__(self, *limited: str, retry_after: float | None = 30) -> None:
        self.limited = set(limited)
        self.retry_after = retry_after
        self.used: list[str] = []
        self.inputs: list[list[str]] = []

    async def step(self, run: StepInput) -> Finish:
        profile = await run.auth_profile()
        assert await run.auth_profile() is profile  # one profile per model call
        self.used.append(profile.id)
        self.inputs.append([m.text for m in run.new_input])
        if profile.id in self.limited:
            raise RateLimited(f"429 on {profile.id}", retry_after=self.retry_after)
        return Finish("ok", Message.assistant("done"), call=CALL)


@pytest.fixture
async def mem() -> AsyncIterator[Store]:
    store = await open_store("memory://")
    yield store
    await store.close()


async def two_profiles(store: Store, clock: Clock) -> AuthProfiles:
    profiles = AuthProfiles(store, "alice", "a", clock=clock, base_cooldown=60)
    await profiles.add("env:KEY_1", profile_id="first")
    await profiles.add("env:KEY_2", profile_id="second")
    return profiles


async def test_a_rate_limited_profile_is_rotated_and_the_run_completes(store: Store) -> None:
    clock = Clock()
    profiles = await two_profiles(store, clock)
    agent = Keyed("first")
    runner = Runner(store, "alice", [agent], auth=profiles)
    result = await runner.start("a", "hi")

    assert result.status == "completed"
    assert agent.used == ["first", "second"]
    assert result.state.turn == 1  # the refused attempt is not a step
    assert result.state.limits.iterations.current == 1
    first, second = await profiles.get("first"), await profiles.get("second")
    assert first.cooldown_until == T0 + timedelta(seconds=30)
    assert (first.failure_count, first.failure_reason) == (1, "429 on first")
    assert (first.usage_count, second.usage_count) == (1, 1)
    assert (second.failure_count, second.cooldown_until) == (0, None)

    events = await runner.runs.events(result.run_id)  # with the texts the events name
    rotated = [e.payload for e in events if e.stream == "auth"]
    assert [(p["from"], p["to"], p["reason"]) for p in rotated] == [
        ("first", "second", "429 on first")
    ]
    assert rotated[0]["cooldown_until"] == (T0 + timedelta(seconds=30)).isoformat()
    said = [e.payload for e in events if (e.stream, e.kind) == ("assistant", "complete")]
    assert [(p["text"], p["profile"]) for p in said] == [("done", "second")]

    # The cooldown outlives the run: the next run goes straight to the free profile.
    again = Keyed()
    await Runner(store, "alice", [again], auth=profiles).start("a", "hi")
    assert again.used == ["second"]


async def test_every_profile_limited_pauses_the_run_until_one_is_free(mem: Store) -> None:
    clock = Clock()
    profiles = await two_profiles(mem, clock)
    agent = Keyed("first", "second")
    runner = Runner(mem, "alice", [agent], auth={"a": profiles})
    paused = await runner.start("a", "hello")

    assert paused.status == "paused"
    assert agent.used == ["first", "second"]
    assert paused.state.turn == 0
    assert paused.state.limits.iterations.current == 0
    error = paused.state.error
    assert error is not None
    assert error.type == "RateLimited"
    assert error.data["available_at"] == (T0 + timedelta(seconds=30)).isoformat()
    events = await mem.read_events("alice", paused.run_id)
    statuses = [e.payload for e in events if e.kind == "status"]
    assert statuses[-1]["status"] == "paused"
    assert statuses[-1]["reason"] == "rate_limited"
    assert statuses[-1]["available_at"] == error.data["available_at"]
    assert len([p for p in statuses if p["status"] == "paused"]) == 1

    clock.now = T0 + timedelta(seconds=31)
    agent.limited.clear()
    done = await runner.resume(paused.run_id)
    assert done.status == "completed"
    assert done.state.error is None
    assert done.state.turn == 1
    assert agent.inputs[-1] == ["hello"]  # the input the paused step never used


async def test_a_provider_asking_for_no_rest_cannot_spin_forever(mem: Store) -> None:
    profiles = await two_profiles(mem, Clock())
    agent = Keyed("first", "second", retry_after=0)
    result = await Runner(mem, "alice", [agent], auth=profiles).start("a", "hi")
    assert result.status == "paused"
    assert len(agent.used) == 2


async def test_rate_limited_without_profiles_pauses_the_run(mem: Store) -> None:
    class Limited:
        name = "a"
        calls = 0

        async def step(self, run: StepInput) -> Finish:
            Limited.calls += 1
            if Limited.calls == 1:
                raise RateLimited("quota", retry_after=timedelta(minutes=2))
            return Finish("ok")

    runner = Runner(mem, "alice", [Limited()])
    before = datetime.now(UTC)
    paused = await runner.start("a", "hi")
    assert paused.status == "paused"
    assert paused.state.error is not None
    available = datetime.fromisoformat(str(paused.state.error.data["available_at"]))
    assert available >= before + timedelta(minutes=2)
    assert (await runner.resume(paused.run_id)).status == "completed"


async def test_an_agent_without_profiles_is_told_how_to_give_them(mem: Store) -> None:
    profiles = await two_profiles(mem, Clock())

    class Other(Keyed):
        name = "b"

    runner = Runner(mem, "alice", [Keyed(), Other()], auth={"a": profiles})
    with pytest.raises(InvalidInputError, match=r"Runner\(auth=AuthProfiles"):
        await runner.start("b", "hi")


def test_rate_limited_checks_retry_after() -> None:
    with pytest.raises(InvalidInputError, match="retry_after must be >= 0"):
        RateLimited("x", retry_after=-1)
    assert RateLimited("x", retry_after=timedelta(seconds=5)).retry_after == 5.0


async def test_a_state_handler_agent_signals_a_rate_limit_too(mem: Store) -> None:
    from statekeeper.runs import Action, Cancel, HandlerContext, StateHandlerAgent

    profiles = await two_profiles(mem, Clock())

    class Answer(StateHandlerAgent):
        name = "a"
        used: list[str] = []

        async def on_running(self, ctx: HandlerContext) -> Action:
            profile = await ctx.run.auth_profile()
            Answer.used.append(profile.id)
            if profile.id == "first":
                raise RateLimited("429")  # not the handler's error: the runner's to handle
            return ctx.complete("ok", "done")

        async def on_error(self, ctx: HandlerContext) -> Action:
            return Cancel("handled as an error")

    result = await Runner(mem, "alice", [Answer()], auth=profiles).start("a", "hi")
    assert (result.status, result.output) == ("completed", "ok")
    assert Answer.used == ["first", "second"]
