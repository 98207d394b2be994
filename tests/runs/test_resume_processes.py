"""Runs stopped in one process continue in another: real subprocesses, real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from statekeeper.runs import Runner
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store

HERE = Path(__file__).parent


def spawn(db: Path, command: str, run_id: str, *rest: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, str(HERE / "proc_app.py"), f"sqlite:///{db}", command, run_id, *rest],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
async def test_paused_run_resumes_in_another_process(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    first = spawn(db, "start-payer", "run-pay")
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert out.strip() == "waiting_for_approval"

    import proc_app

    store = await open_store(f"sqlite:///{db}")
    try:
        runner = proc_app.make_runner(store, "t")
        await runner.approve("run-pay", "pay")
    finally:
        await store.close()

    second = spawn(db, "resume", "run-pay")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert out.split()[0] == "completed"


@pytest.mark.slow
async def test_sigkill_mid_step_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    proc = spawn(db, "start-hanging", "run-kill")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "hanging in step 4"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    import proc_app

    store = await open_store(f"sqlite:///{db}")
    try:
        runner = proc_app.make_runner(store, "t")
        crashed = await runner.load("run-kill")
        assert crashed.status == "running"
        assert crashed.turn == 3  # steps 1-3 were checkpointed, step 4 left nothing
        session = await SessionManager(store, "t").get(crashed.session_id)
        texts = [m.text for m in await session.messages()]
        assert texts == ["go"] + [t for n in (1, 2, 3) for t in (f"step {n}", f"worked {n}")]

        result = await runner.resume("run-kill")
        assert result.status == "completed"
        texts = [m.text for m in await session.messages()]
        expected = ["go"] + [t for n in range(1, 7) for t in (f"step {n}", f"worked {n}")]
        assert texts == expected
        ids = [m.id for m in await session.messages()]
        assert len(ids) == len(set(ids))
        assert result.state.tool_use == {"work": 6}
    finally:
        await store.close()


@pytest.mark.slow
async def test_a_fork_made_in_one_process_resumes_in_another(tmp_path: Path) -> None:
    import proc_app

    db = tmp_path / "runs.db"
    store = await open_store(f"sqlite:///{db}")
    try:
        done = await proc_app.make_runner(store, "t").start("worker", "go", run_id="run-src")
        assert done.status == "completed"
        steps = [c.step for c in await proc_app.make_runner(store, "t").runs.history("run-src")]
    finally:
        await store.close()
    at = steps[3]  # after step 3 of the worker: its tool call and result are in

    forker = spawn(db, "fork", "run-src", str(at), "run-fork")
    out, err = forker.communicate(timeout=60)
    assert forker.returncode == 0, err
    status, session_id = out.split()
    assert status == "paused"

    resumer = spawn(db, "resume", "run-fork")
    out, err = resumer.communicate(timeout=60)
    assert resumer.returncode == 0, err
    assert out.split()[0] == "completed"

    store = await open_store(f"sqlite:///{db}")
    try:
        runner = proc_app.make_runner(store, "t")
        forked = await runner.load("run-fork")
        assert forked.session_id == session_id
        assert forked.metadata["forked_from"] == {"run_id": "run-src", "step": at}
        session = await SessionManager(store, "t").get(session_id)
        texts = [m.text for m in await session.messages()]
        expected = ["go"] + [t for n in range(1, 7) for t in (f"step {n}", f"worked {n}")]
        assert texts == expected  # steps 1-3 read from the origin, 4-6 replayed in the fork
        own = {e.id for e in await session.entries()}
        origin = await SessionManager(store, "t").get((await runner.load("run-src")).session_id)
        assert not own & {m.id for m in await origin.messages()}  # nothing copied
        assert forked.tool_use == {"work": 6}
    finally:
        await store.close()


@pytest.mark.slow
async def test_sigkill_mid_run_leaves_each_step_with_its_events_or_neither(tmp_path: Path) -> None:
    """A step's message, checkpoint and ``assistant/complete`` event are one append: a
    process killed in the middle of writing step 40 leaves steps 1-39, each with its
    event, and nothing of step 40 (its event was not logged ahead of its write)."""
    db = tmp_path / "runs.db"
    proc = spawn(db, "start-talking", "run-talk")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "appending said 40", proc.communicate()[1]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)

    store = await open_store(f"sqlite:///{db}")
    try:
        state, _, _ = await Runner(store, "t", []).runs.load("run-talk")
        session = await SessionManager(store, "t").get(state.session_id)
        said = [m.id for m in await session.messages() if m.role == "assistant"]
        events = await store.read_events("t", "run-talk")
        told = [e.payload["id"] for e in events if (e.stream, e.kind) == ("assistant", "complete")]
        assert len(said) == state.turn == 39
        assert told == said  # every stored step has its event, in order, and no other has
    finally:
        await store.close()
