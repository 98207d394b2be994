"""``POST /api/v1/runs/{id}/approve`` with ``arguments``: approve with edited arguments.

The decision is recorded as an edit (the run view and the approval event say what runs),
the tool runs with the edited arguments, bad arguments are refused and nothing is saved.
"""

from __future__ import annotations

from statekeeper.stores import Store

from .conftest import Live
from .test_api_runs import start_waiting_run, wait_for_end


async def test_approve_with_edited_arguments(live: Live, db: tuple[str, Store]) -> None:
    run_id = await start_waiting_run(db[1])
    edited = {"order": 1042, "amount": 20}
    async with live.client("operate") as client:
        answer = await client.post(
            f"/api/v1/runs/{run_id}/approve",
            json={"call_id": "c-refund", "arguments": edited, "reason": "partial", "resume": True},
        )
    assert answer.status_code == 200, answer.text
    messages = await wait_for_end(live, run_id)
    async with live.client("read") as client:
        detail = (await client.get(f"/api/v1/runs/{run_id}")).json()
        session = detail["session_id"]
        entries = (await client.get(f"/api/v1/sessions/{session}/entries")).json()["items"]
    assert detail["status"] == "completed"
    [kept] = [d for d in detail["decisions"] if d["call_id"] == "c-refund"]
    assert (kept["approved"], kept["edited_arguments"]) == (True, edited)
    [event] = [m["data"]["data"] for m in messages if m["event"] == "approval/approved"]
    assert (event["tool"], event["edited_arguments"]) == ("issue_refund", edited)
    # What ran: the refund of 20 (the model asked for 42.5), and the result says so.
    results = [
        e["message"]
        for e in entries
        if e["kind"] == "message" and e["message"]["role"] == "tool"
        if "edited_arguments" in e["message"].get("metadata", {})
    ]
    [result] = results
    assert '"amount": 20' in result["content"][0]["content"]
    assert result["metadata"]["original_arguments"] == '{"order": 1042, "amount": 42.5}'


async def test_bad_edited_arguments_are_refused(live: Live, db: tuple[str, Store]) -> None:
    run_id = await start_waiting_run(db[1])
    path = f"/api/v1/runs/{run_id}"
    async with live.client("operate") as client:
        listed = await client.post(
            f"{path}/approve", json={"call_id": "c-refund", "arguments": [1]}
        )
        rejecting = await client.post(
            f"{path}/reject", json={"call_id": "c-refund", "arguments": {"amount": 1}}
        )
        detail = (await client.get(path)).json()
    assert listed.status_code == 422
    assert rejecting.status_code == 422
    assert "approval only" in rejecting.json()["error"]["message"]
    assert detail["pending"][0]["decision"] is None
