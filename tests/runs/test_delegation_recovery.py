"""A delegated child that crashes after its final checkpoint, before reporting its usage
to the parent, still counts: the parent rolls it up when it is next loaded, once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from statekeeper.runs import Runner, rollup
from statekeeper.runtime import SubagentRegistry
from statekeeper.stores import open_store

HERE = Path(__file__).parent


def crash_in_child(db: Path, mode: str) -> None:
    """Run delegation_crash_app.py: the child checkpoints, then its process dies."""
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    app = str(HERE / "delegation_crash_app.py")
    done = subprocess.run(
        [sys.executable, app, f"sqlite:///{db}", mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 17, done.stderr


async def child_of(runner: Runner, parent_id: str) -> str:
    [child] = [r.run_id for r in await runner.runs.list() if r.parent_run_id == parent_id]
    return child


@pytest.mark.slow
async def test_a_finished_childs_lost_report_is_rolled_up_on_load(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    crash_in_child(db, "finish")
    import delegation_crash_app as app

    async with open_store(f"sqlite:///{db}") as store:
        runner = app.make_runner(store)
        child_id = await child_of(runner, "run-parent")
        child = (await runner.runs.load(child_id))[0]
        assert child.status == "completed"  # its final checkpoint is there ...
        index, _ = await runner.runs.index("run-parent")
        assert index.child_usage == {}  # ... its report is not

        loaded = await runner.load("run-parent")
        assert loaded.metrics.accumulated_cost == pytest.approx(0.4)
        assert loaded.limits.budget is not None
        assert loaded.limits.budget.current == pytest.approx(0.4)
        again = await runner.load("run-parent")  # idempotent: counted once
        assert again.metrics.accumulated_cost == pytest.approx(0.4)
        live, _ = await rollup.live_children(runner.runs, "run-parent")
        assert live.children == {}  # it ended: its reservation is released
        entry = await SubagentRegistry(store, "t", owner_id="operator").get(child_id)
        assert (entry.status, entry.outcome) == ("completed", "done")  # not left running

        await runner.raise_limits("run-parent", iterations=2)
        resumed = await runner.resume("run-parent")
        assert resumed.state.metrics.accumulated_cost == pytest.approx(0.5)  # 0.4 + 0.1
        assert resumed.state.own_metrics.accumulated_cost == pytest.approx(0.1)


@pytest.mark.slow
async def test_a_paused_childs_lost_report_is_rolled_up_and_it_keeps_its_room(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    crash_in_child(db, "pause")
    import delegation_crash_app as app

    async with open_store(f"sqlite:///{db}") as store:
        runner = app.make_runner(store)
        child_id = await child_of(runner, "run-parent")
        assert (await runner.runs.load(child_id))[0].status == "paused"  # at its 0.5
        assert (await runner.runs.index("run-parent"))[0].child_usage == {}
        registry = SubagentRegistry(store, "t", owner_id="operator")
        assert (await registry.get(child_id)).status == "running"  # as the crash left it

        await runner.raise_limits("run-parent", iterations=2)
        result = await runner.resume("run-parent")  # the child's 0.6 counts
        assert result.state.metrics.accumulated_cost == pytest.approx(0.7)  # 0.6 + 0.1
        live, _ = await rollup.live_children(runner.runs, "run-parent")
        assert set(live.children) == {child_id}  # paused, not ended: it holds its room
        entry = await registry.get(child_id)
        assert (entry.status, entry.outcome) == ("paused", "budget limit reached: 0.6 of 0.5")
