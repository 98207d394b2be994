"""Time travel: a run's checkpoint history, and forks of a run from any past checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError, InvalidPayloadError, NotFoundError
from statekeeper.runs import AskInput, CheckpointOptions, Finish, Respond, Runner, StepInput
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store


def talker() -> ScriptedAgent:
    """Three steps that talk, then a question, then done."""
    talk = [Respond([Message.assistant(word)]) for word in ("one", "two", "three")]
    return ScriptedAgent("a", [*talk, AskInput("name?"), Finish("done")])


async def texts(store: Store, session_id: str) -> list[str]:
    session = await SessionManager(store, "alice").get(session_id)
    return [m.text for m in await session.messages()]


async def test_history_lists_every_checkpoint_with_what_it_added(store: Store) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    history = await runner.runs.history(asked.run_id)

    assert [c.step for c in history] == [1, 2, 3, 4, 5]
    assert [c.turn for c in history] == [0, 1, 2, 3, 4]
    assert [c.status for c in history] == ["running"] * 4 + ["waiting_for_input"]
    session = await SessionManager(store, "alice").get(asked.state.session_id)
    messages = await session.messages()
    by_id = {m.id: m.text for m in messages}
    assert [[by_id[i] for i in c.added] for c in history] == [
        ["hi"],
        ["one"],
        ["two"],
        ["three"],
        ["name?"],
    ]
    assert [c.message_count for c in history] == [1, 1, 1, 1, 1]
    assert [c.at for c in history] == sorted(c.at for c in history)
    assert history[-1].id == f"{asked.run_id}.c5"
    assert all(c.corrupt is None for c in history)

    # A later run of the same session: its first checkpoint adds only its own input.
    again = await runner.start("a", "again", session_id=asked.state.session_id)
    first = (await runner.runs.history(again.run_id))[0]
    assert [by_id.get(i, "new") for i in first.added] == ["new"]
    assert first.message_count == 1


async def test_fork_from_a_past_checkpoint_replays_it_on_a_forked_session(store: Store) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    before = await texts(store, asked.state.session_id)

    forked = await runner.fork(asked.run_id, at=3)  # after "two", at turn 2
    assert forked.run_id != asked.run_id
    assert forked.status == "waiting_for_input"
    assert [m.text for m in forked.new_messages] == ["three", "name?"]
    fork_session = forked.state.session_id
    assert fork_session != asked.state.session_id
    assert await texts(store, fork_session) == ["hi", "one", "two", "three", "name?"]

    record = await store.get_session("alice", fork_session)
    assert record.forked_from is not None
    assert record.forked_from.session_id == asked.state.session_id
    own = await store.read_entries("alice", fork_session)
    assert not {"hi", "one", "two"} & {e.payload.get("content") for e in own}  # nothing copied

    # The original is untouched.
    assert await texts(store, asked.state.session_id) == before
    assert (await runner.load(asked.run_id)).status == "waiting_for_input"
    assert forked.state.metadata["forked_from"] == {"run_id": asked.run_id, "step": 3}
    done = await runner.resume(forked.run_id, "Ada")
    assert done.status == "completed"


async def test_fork_with_new_input_and_edited_state(store: Store) -> None:
    seen: list[tuple[list[str], Any]] = []

    def look(run: StepInput) -> Finish:
        seen.append(([m.text for m in run.new_input], run.state.metadata.get("mood")))
        return Finish("ok")

    agent = ScriptedAgent("a", [Respond([Message.assistant("one")]), AskInput("more?"), look])
    runner = Runner(store, "alice", [agent])
    asked = await runner.start("a", "hi")
    forked = await runner.fork(
        asked.run_id, at=2, input="instead", state_update={"metadata": {"mood": "brave"}}
    )
    assert forked.status == "waiting_for_input"  # turn 2 of the script asks again
    done = await runner.resume(forked.run_id, "yes")
    assert done.status == "completed"
    assert seen == [(["yes"], "brave")]
    assert forked.state.metadata["forked_from"] == {"run_id": asked.run_id, "step": 2}
    assert await texts(store, forked.state.session_id) == ["hi", "one", "instead", "more?", "yes"]


async def test_fork_creates_a_paused_run_that_resumes_later(store: Store) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    state = await runner.runs.fork(asked.run_id, at=2, new_run_id="run-fork", title="what if")
    assert state.run_id == "run-fork"
    assert state.status == "paused"
    assert state.turn == 1
    assert (await runner.load("run-fork")).status == "paused"
    assert (await store.get_session("alice", state.session_id)).title == "what if"
    index, _ = await runner.runs.index("run-fork")
    assert index.owner is None
    assert [c.step for c in await runner.runs.history("run-fork")] == [1]
    result = await Runner(store, "alice", [talker()]).resume("run-fork")
    assert result.status == "waiting_for_input"
    assert await texts(store, state.session_id) == ["hi", "one", "two", "three", "name?"]


async def test_bad_forks_are_typed_errors_naming_the_fix(store: Store) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    done = await runner.resume(asked.run_id, "Ada")
    assert done.status == "completed"
    with pytest.raises(NotFoundError, match="runs history"):
        await runner.runs.fork(asked.run_id, at=99)
    with pytest.raises(InvalidInputError, match="session_id"):
        await runner.runs.fork(asked.run_id, at=2, state_update={"session_id": "x"})
    with pytest.raises(InvalidPayloadError, match="turn"):
        await runner.runs.fork(asked.run_id, at=2, state_update={"turn": -5})
    with pytest.raises(InvalidPayloadError, match="nonsense"):
        await runner.runs.fork(asked.run_id, at=2, state_update={"nonsense": 1})
    with pytest.raises(NotFoundError):
        await runner.runs.fork("run-nope", at=1)
    forks = [r for r in await runner.runs.list() if r.run_id != asked.run_id]
    assert forks == []  # nothing was created by a refused fork


async def test_a_finished_checkpoint_forks_into_a_run_that_goes_on_with_new_input(
    store: Store,
) -> None:
    # As LangGraph allows: ask a follow-up of a finished conversation, on a fork of it.
    runner = Runner(store, "alice", [ScriptedAgent("a", [Finish("first"), Finish("second")])])
    done = await runner.start("a", "hi")
    assert done.status == "completed"
    last = (await runner.runs.history(done.run_id))[-1]
    assert last.status == "completed"

    fork = await runner.runs.fork(done.run_id, at=last.step)
    assert fork.status == "paused"
    assert (fork.output, fork.error) == (None, None)
    followed = await runner.fork(done.run_id, at=last.step, input="and then?")
    assert followed.status == "completed"
    assert followed.output == "second"
    assert (await texts(store, followed.state.session_id))[-1] == "and then?"
    assert (await runner.load(done.run_id)).output == "first"  # the original is untouched


async def test_a_finished_run_points_at_fork_and_the_newest_resumable_step(store: Store) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    await runner.resume(asked.run_id, "Ada")
    with pytest.raises(InvalidInputError) as caught:
        await runner.resume(asked.run_id)
    message = str(caught.value)
    assert "runner.fork" in message
    assert f"statekeeper runs fork {asked.run_id} --at" in message
    assert "runs history" in message

    history = await runner.runs.history(asked.run_id)
    assert [c.status for c in history[-3:]] == ["waiting_for_input", "running", "completed"]
    newest = await runner.runs.fork(asked.run_id)  # the newest step that is not finished
    assert newest.metadata["forked_from"] == {"run_id": asked.run_id, "step": history[-2].step}
    assert (await texts(store, newest.session_id))[-1] == "Ada"

    asked_at = history[-3].step  # where the run asked for the name: answer differently
    forked = await runner.fork(asked.run_id, at=asked_at, input="Grace")
    assert forked.status == "completed"
    assert forked.output == "done"
    fork_texts = await texts(store, forked.state.session_id)
    assert fork_texts[-1] == "Grace"
    assert "Ada" not in fork_texts


@pytest.mark.parametrize("mode", ["step", "background", "exit"])
async def test_history_accounts_for_every_message_in_any_write_mode(
    store: Store, mode: Any
) -> None:
    runner = Runner(store, "alice", [talker()], checkpoints=CheckpointOptions(write_mode=mode))
    asked = await runner.start("a", "hi")
    await runner.resume(asked.run_id, "Ada")
    history = await runner.runs.history(asked.run_id)
    session = await SessionManager(store, "alice").get(asked.state.session_id)
    assert [i for c in history for i in c.added] == [m.id for m in await session.messages()]
    assert history[-1].status == "completed"


async def test_a_fork_with_no_room_under_its_limits_is_refused_and_leaves_nothing(
    store: Store,
) -> None:
    from statekeeper.core.limits import IterationFlag, Limits
    from statekeeper.errors import LimitReachedError
    from statekeeper.sessions import SessionManager

    talks = ScriptedAgent("t", [Respond([Message.assistant(f"{n}")]) for n in range(6)])
    runner = Runner(store, "alice", [talks])
    paused = await runner.start(
        "t", "hi", headless=False, limits=Limits(iterations=IterationFlag(maximum=2))
    )
    assert paused.status == "paused"
    runs_before = [r.run_id for r in await runner.runs.list()]
    sessions_before = [s.id for s in (await SessionManager(store, "alice").list()).items]
    newest = (await runner.runs.history(paused.run_id))[-1].step

    with pytest.raises(LimitReachedError, match="no room under its limits"):
        await runner.fork(paused.run_id, at=newest, input="go on")
    assert [r.run_id for r in await runner.runs.list()] == runs_before
    assert [s.id for s in (await SessionManager(store, "alice").list()).items] == sessions_before


async def test_raising_the_limits_of_a_run_another_process_drives_is_refused(
    store: Store,
) -> None:
    from statekeeper.core.limits import IterationFlag, Limits
    from statekeeper.errors import ConflictError

    talks = ScriptedAgent("t", [Respond([Message.assistant(f"{n}")]) for n in range(6)])
    runner = Runner(store, "alice", [talks])
    paused = await runner.start(
        "t", "hi", headless=False, limits=Limits(iterations=IterationFlag(maximum=2))
    )
    await runner.runs.claim(paused.run_id, "otherhost:1:x", ttl=60)  # driven elsewhere
    with pytest.raises(ConflictError, match="being run by otherhost:1:x"):
        await runner.raise_limits(paused.run_id, iterations=10)
    assert (await runner.load(paused.run_id)).limits.iterations.maximum == 2
    await runner.runs.claim(paused.run_id, runner.owner, take_over=True)  # it is ours again
    raised = await runner.raise_limits(paused.run_id, iterations=10)
    assert raised.limits.iterations.maximum == 10
