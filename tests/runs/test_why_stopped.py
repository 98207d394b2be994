"""`why_stopped`: the cause an operator reads beside a run's status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from test_lane_close_cancels_run import queue_behind

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits
from statekeeper.demo_app import make_runner
from statekeeper.runs.index import RunIndex
from statekeeper.runs.state import ErrorDetails
from statekeeper.runs.why import why_stopped
from statekeeper.runtime.lane_types import LaneClearedError
from statekeeper.stores import Store


async def test_each_stop_names_its_cause(store: Store) -> None:
    runner = make_runner(store, "alice")
    waiting = await runner.start("support", "Refund order 1042.", headless=False)
    paused = await runner.start(
        "support",
        "Where is order 7?",
        headless=False,
        limits=Limits(iterations=IterationFlag(maximum=1)),
    )
    done = await runner.start("triage", "Escalated: orders 1.", headless=False)

    async def reason(run_id: str) -> object:
        index, _ = await runner.runs.index(run_id)
        return why_stopped(index, await runner.load(run_id))

    found = await reason(waiting.run_id)
    assert found is not None
    assert found.kind == "approval"
    assert "issue_refund (c-refund)" in found.text
    limit = await reason(paused.run_id)
    assert limit is not None
    assert (limit.kind, limit.limit, limit.current, limit.maximum) == ("limit", "iterations", 1, 1)
    assert limit.text == "iterations limit reached: 1 of 1; raise it to go on"
    assert await reason(done.run_id) is None

    await runner.cancel(paused.run_id, reason="operator said stop")
    cancelled = await reason(paused.run_id)
    assert cancelled is not None
    assert cancelled.text == "cancelled: operator said stop"


def _index(**changes: object) -> RunIndex:
    return RunIndex(run_id="run_x", session_id="ses_x", agent="a", status="running").model_copy(
        update=changes
    )


def test_a_running_run_no_live_process_holds_stopped_mid_run() -> None:
    gone = _index(owner="elsewhere:1:x", lease_until=datetime.now(UTC) - timedelta(seconds=1))
    crashed = why_stopped(gone, None)
    assert crashed is not None
    assert crashed.kind == "crashed"
    live = _index(owner="elsewhere:1:x", lease_until=datetime.now(UTC) + timedelta(minutes=5))
    assert why_stopped(live, None) is None  # another host's lease: trusted while it lasts


async def test_budget_rate_limit_and_lane_say_by_how_much_and_until_when(store: Store) -> None:
    runner = make_runner(store, "alice")
    started = await runner.start(
        "support",
        "Where is order 7?",
        headless=False,
        limits=Limits(iterations=IterationFlag(maximum=1)),
    )
    state = await runner.load(started.run_id)
    index, _ = await runner.runs.index(started.run_id)

    over = state.model_copy(deep=True)
    over.limits = Limits(budget=BudgetFlag(current=0.025, maximum=0.02))
    budget = why_stopped(index, over)
    assert budget is not None
    assert (
        budget.text
        == "budget limit reached: $0.0250 of $0.0200, over by $0.0050; raise it to go on"
    )

    until = datetime(2026, 11, 28, 17, 30, tzinfo=UTC)
    limited = state.model_copy(deep=True)
    limited.error = ErrorDetails(
        type="RateLimited",
        message="every profile is cooling down",
        data={"available_at": until.isoformat(), "profile": "p1"},
    )
    rate = why_stopped(index, limited)
    assert rate is not None
    assert (rate.kind, rate.until) == ("rate_limited", until)
    assert "until 2026-11-28 17:30:00 UTC" in rate.text

    cleared = state.model_copy(deep=True)
    cleared.limits = Limits()
    cleared.error = ErrorDetails(type="LaneClearedError", message="lane session:x was cleared")
    lane = why_stopped(index, cleared)
    assert lane is not None
    assert lane.kind == "lane"
    assert "lane session:x was cleared" in lane.text
    assert lane.to_dict()["kind"] == "lane"


async def test_a_run_whose_lane_was_cleared_says_so_until_it_goes_on(store: Store) -> None:
    made = await queue_behind(store)  # run-q waits in the lane behind a blocked run
    runner, agent, first, queued = made.runner, made.agent, made.first, made.queued

    assert made.lanes.clear(f"session:{made.session_id}") == 1
    with pytest.raises(LaneClearedError):
        await queued
    index, _ = await runner.runs.index("run-q")
    stopped = why_stopped(index, await runner.load("run-q"))
    assert stopped is not None
    assert stopped.kind == "lane"
    assert f"session:{made.session_id}" in stopped.text

    agent.release.set()
    assert (await first).status == "completed"
    resumed = await runner.resume("run-q", "later")
    assert resumed.status == "completed"
    assert resumed.state.error is None  # the reason went with the pause
