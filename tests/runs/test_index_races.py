"""A checkpoint's index write against others writing the index meanwhile (a reader of the
run rolling it forward, as the server's run view does; a decision's checkpoint): it
keeps trying, keeps what they wrote, and never points the index back at an older
checkpoint. Under load, a run's start failed with ConflictError after its checkpoint was
saved (13-20 of 100 on Redis, `python -m bench load`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statekeeper.demo_app import make_runner
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.stores import open_store


def racing(runs: RunStore, times: int, newer_by: int = 0) -> None:
    """Before each of ``runs``' next ``times`` index writes, another writer writes the
    stored index (moved on by ``newer_by`` checkpoint seqs)."""
    real = runs.put_index
    left = times

    async def put_index(index: RunIndex, *, expected_version: int | None) -> int:
        nonlocal left
        if left:
            left -= 1
            current, version = await runs.index(index.run_id)
            current.checkpoint_seq += newer_by
            await real(current, expected_version=version)
        return await real(index, expected_version=expected_version)

    runs.put_index = put_index  # type: ignore[method-assign]


async def waiting_run(tmp_path: Path) -> Any:
    store = await open_store(f"sqlite:///{tmp_path}/state.db")
    runner = make_runner(store, "t")
    result = await runner.start("support", "Refund order 1042.")  # waits for approval
    return store, runner.runs, result.run_id


async def test_an_index_write_outlasts_readers_rolling_the_index_forward(tmp_path: Path) -> None:
    store, runs, run_id = await waiting_run(tmp_path)
    try:
        state, version, _ = await runs.load(run_id)
        index, _ = await runs.index(run_id)
        racing(runs, times=3)
        written = await runs.index_saved(
            state, index.checkpoint_seq, version, owner="me", lease_until=None
        )
        stored, stored_version = await runs.index(run_id)
        assert (stored_version, stored.owner) == (written, "me")
        assert stored.checkpoint_seq == index.checkpoint_seq
    finally:
        await store.close()


async def test_an_index_write_never_goes_back_to_an_older_checkpoint(tmp_path: Path) -> None:
    store, runs, run_id = await waiting_run(tmp_path)
    try:
        state, version, _ = await runs.load(run_id)
        index, _ = await runs.index(run_id)
        racing(runs, times=1, newer_by=2)  # meanwhile a newer checkpoint was indexed
        written = await runs.index_saved(
            state, index.checkpoint_seq, version, owner="me", lease_until=None
        )
        stored, stored_version = await runs.index(run_id)
        assert stored_version == written
        assert stored.checkpoint_seq == index.checkpoint_seq + 2  # theirs stands
    finally:
        await store.close()


async def test_a_look_at_a_run_gives_an_index_and_a_checkpoint_that_go_together(
    tmp_path: Path,
) -> None:
    # The server's run view once said `waiting_for_approval` with no pending call
    # (tests/server/test_many_servers.py, under load): its look at the run rolled the
    # index forward, lost that write to the runner's index write for a newer checkpoint,
    # and paired the runner's index with the older checkpoint it had read.
    store, runs, run_id = await waiting_run(tmp_path)
    try:
        state, version, _ = await runs.load(run_id)
        state.turn += 1  # a running runner's checkpoint, its index not written yet
        saved = await runs.save(state, index_version=version, update_index=False)
        real = runs.put_index

        async def put_index(index: RunIndex, *, expected_version: int | None) -> int:
            runs.put_index = real  # type: ignore[method-assign]
            newer, newer_version, _ = await runs.load(run_id)
            newer.turn += 1  # meanwhile the runner checkpoints again, index and all
            await runs.save(newer, index_version=newer_version)
            return await real(index, expected_version=expected_version)

        runs.put_index = put_index  # type: ignore[method-assign]
        loaded = await runs.load_latest(run_id)
        assert loaded.state.turn == state.turn + 1  # the newest checkpoint
        assert loaded.index.turn == loaded.state.turn
        assert loaded.index.checkpoint_seq == loaded.checkpoint_seq > saved.checkpoint_seq
    finally:
        await store.close()
