"""The runner's option groups, and the flat keywords of earlier versions that map onto them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from statekeeper.codec import StateCodec
from statekeeper.core.lifecycle import DEFAULT_TRANSITIONS
from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError, InvalidPayloadError, LimitReachedError
from statekeeper.runs import (
    CheckpointOptions,
    ContextCodec,
    Coordination,
    Finish,
    GuardrailResult,
    Guardrails,
    Respond,
    Runner,
    RunPolicy,
    StepInput,
)
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runtime import CommandLanes
from statekeeper.stores import Store, open_store


@pytest.fixture
async def memory() -> AsyncIterator[Store]:
    async with open_store("memory://") as store:
        yield store


def looping() -> ScriptedAgent:
    return ScriptedAgent("a", [Respond([Message.assistant("again")])])


def test_flat_keywords_set_the_fields_of_their_groups(memory: Store) -> None:
    codec = StateCodec()
    lanes = CommandLanes()

    def check(messages: Any) -> None:
        return None

    runner = Runner(
        memory,
        "alice",
        [],
        write_mode="exit",
        codec=codec,
        lanes=lanes,
        lease_ttl=30.0,
        input_guardrails=[check],
        context_serializer=str,
        transitions=DEFAULT_TRANSITIONS,
        owner=None,  # None kept meaning "the default owner"
    )
    assert runner.checkpoints == CheckpointOptions(write_mode="exit", codec=codec)
    assert runner.coordination.lanes is lanes
    assert runner.coordination.lease_ttl == 30.0
    assert runner.owner  # generated: host:pid:random
    assert runner.guardrails.input == (check,)
    assert runner.context_codec.serializer is str
    assert runner.policy.transitions is DEFAULT_TRANSITIONS


def test_flat_keywords_refine_a_group_given_too(memory: Store) -> None:
    runner = Runner(
        memory,
        "alice",
        [],
        coordination=Coordination(owner="worker-1", lease_ttl=10.0),
        lease_ttl=20.0,
    )
    assert (runner.owner, runner.coordination.lease_ttl) == ("worker-1", 20.0)


def test_unknown_keywords_and_bad_options_are_refused(memory: Store) -> None:
    with pytest.raises(TypeError, match="write_mod"):
        Runner(memory, "alice", [], write_mod="step")  # type: ignore[call-arg]
    with pytest.raises(InvalidInputError, match="write mode"):
        CheckpointOptions(write_mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="lease_ttl"):
        Coordination(lease_ttl=0)


async def test_policy_limits_apply_to_each_run_separately(memory: Store) -> None:
    policy = RunPolicy(limits=Limits(iterations=IterationFlag(maximum=2)))
    runner = Runner(memory, "alice", [looping()], policy=policy)
    for _ in range(2):  # the second run starts from zero, not from the first one's count
        with pytest.raises(LimitReachedError) as caught:
            await runner.start("a", "go")
        assert caught.value.state.limits.iterations.current == 2
    assert policy.limits is not None
    assert policy.limits.iterations.current == 0  # the policy's own flag is never stepped
    own = Limits(iterations=IterationFlag(maximum=5))
    with pytest.raises(LimitReachedError) as caught:
        await runner.start("a", "go", limits=own)  # limits given to start win
    assert caught.value.state.limits.iterations.maximum == 5


async def test_the_context_codec_stores_and_restores_the_user_context(memory: Store) -> None:
    seen: list[Any] = []

    def remember(run: StepInput) -> Finish:
        seen.append(run.context)
        return Finish("ok")

    agent = ScriptedAgent("a", [remember])
    codec = ContextCodec(serializer=lambda c: {"user": c[0]}, deserializer=lambda d: (d["user"],))
    runner = Runner(memory, "alice", [agent], context_codec=codec)
    result = await runner.start("a", "go", context=("ada",))
    assert result.state.context == {"user": "ada"}
    assert seen == [("ada",)]
    with pytest.raises(InvalidInputError, match="context_serializer"):
        await Runner(memory, "alice", [agent]).start("a", "go", context=("ada",))
    broken = ContextCodec(deserializer=lambda d: 1 / 0)
    with pytest.raises(InvalidPayloadError, match="cannot be deserialized"):
        broken.load({"user": "ada"})


async def test_guardrails_given_as_a_group(memory: Store) -> None:
    def flag_all(messages: Any) -> GuardrailResult:
        return GuardrailResult(name="flag_all", kind="input", triggered=False)

    runner = Runner(
        memory,
        "alice",
        [ScriptedAgent("a", [Finish("ok")])],
        guardrails=Guardrails(input=[flag_all]),
        checkpoints=CheckpointOptions(write_mode="background"),
    )
    result = await runner.start("a", "go")
    assert [g.name for g in result.state.guardrails] == ["flag_all"]
