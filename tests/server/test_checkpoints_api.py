"""``GET /api/v1/runs/{id}/checkpoints/{step}``: a run's state at one checkpoint, then
"edit and rerun" through the fork endpoint with a state update and new input."""

from __future__ import annotations

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
