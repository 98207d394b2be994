"""A new run's id leaves room for the ids derived from it (issue 22): one too long is
refused before anything is written."""

from __future__ import annotations

import pytest

from statekeeper.errors import InvalidIdError
from statekeeper.runs import Finish, Runner
from statekeeper.runs.runner import MAX_RUN_ID_LENGTH
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store


def _runner(store: Store) -> Runner:
    return Runner(store, "alice", [ScriptedAgent("a", [Finish("done")])])


@pytest.mark.parametrize("length", [MAX_RUN_ID_LENGTH + 1, 128])
async def test_a_run_id_too_long_for_its_checkpoints_is_refused_and_leaves_nothing(
    store: Store, length: int
) -> None:
    with pytest.raises(InvalidIdError, match=f"limit for a new run is {MAX_RUN_ID_LENGTH}"):
        await _runner(store).start("a", "hi", run_id="r" * length)
    assert (await SessionManager(store, "alice").list()).items == []


async def test_a_run_id_at_the_limit_runs_and_checkpoints(store: Store) -> None:
    runner = _runner(store)
    done = await runner.start("a", "hi", run_id="r" * MAX_RUN_ID_LENGTH)
    assert done.status == "completed"
    assert (await runner.runs.load_latest(done.run_id)).state.status == "completed"
