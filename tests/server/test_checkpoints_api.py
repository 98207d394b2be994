"""``GET /api/v1/runs/{id}/checkpoints/{step}``: a run's state at one checkpoint, then
"edit and rerun" through the fork endpoint with a state update and new input."""

from __future__ import annotations

from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.demo_app import make_runner
from statekeeper.stores import Store

from .conftest import Live
from .test_api_runs import start_waiting_run


async def test_a_checkpoint_shows_its_state_and_forks_with_edits(
    live: Live, db: tuple[str, Store]
) -> None:
    run_id = await start_waiting_run(db[1])
    async with live.client("read") as reader:
        listed = (await reader.get(f"/api/v1/runs/{run_id}/checkpoints")).json()["items"]
        steps = [c["step"] for c in listed]
        waiting = (await reader.get(f"/api/v1/runs/{run_id}/checkpoints/{steps[-1]}")).json()
        first = (await reader.get(f"/api/v1/runs/{run_id}/checkpoints/{steps[0]}")).json()
        missing = await reader.get(f"/api/v1/runs/{run_id}/checkpoints/99")
        stranger = await reader.get("/api/v1/runs/run_nope/checkpoints/1")
    assert waiting["status"] == "waiting_for_approval"
    assert [c["call_id"] for c in waiting["pending"]] == ["c-refund"]
    assert waiting["state"]["run_id"] == run_id
    assert {"context", "metadata", "limits"} <= waiting["editable"].keys()
    assert "run_id" in waiting["fixed"]
    assert waiting["metrics"]["calls"] >= first["metrics"]["calls"]
    assert first["pending"] == []
    assert missing.status_code == 404
    assert "runs history" in missing.json()["error"]["message"]
    assert stranger.status_code == 404

    async with live.client("operate") as operator:
        forked = await operator.post(
            f"/api/v1/runs/{run_id}/fork",
            json={"at": steps[-1], "state_update": {"metadata": {"note": "edited"}}},
        )
    assert forked.status_code == 201, forked.text
    async with live.client("read") as reader:
        fork_id = forked.json()["run_id"]
        again = (await reader.get(f"/api/v1/runs/{fork_id}/checkpoints/1")).json()
    assert again["state"]["metadata"]["note"] == "edited"
    assert again["state"]["metadata"]["forked_from"] == {"run_id": run_id, "step": steps[-1]}


async def test_a_fork_to_run_with_no_room_is_refused_and_leaves_nothing(
    live: Live, db: tuple[str, Store]
) -> None:
    runner = make_runner(db[1], "acme")
    paused = await runner.start(
        "support",
        "Where is it?",
        headless=False,
        limits=Limits(iterations=IterationFlag(maximum=1)),
    )
    assert paused.status == "paused"
    last = (await runner.runs.history(paused.run_id))[-1].step
    before = {r.run_id for r in await runner.runs.list()}
    async with live.client("operate") as operator:
        refused = await operator.post(
            f"/api/v1/runs/{paused.run_id}/fork", json={"at": last, "run": True, "input": "go"}
        )
        made = await operator.post(f"/api/v1/runs/{paused.run_id}/fork", json={"at": last})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "LimitReachedError"
    assert "no room under its limits" in refused.json()["error"]["message"]
    after = {r.run_id for r in await runner.runs.list()}
    assert after - before == {made.json()["run_id"]}  # only the fork not asked to run
