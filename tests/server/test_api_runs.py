"""The runs API through HTTP against a running server: list, show, history, events,
approve (once), resume, cancel, limits, fork; keys, scopes and tenants."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits
from statekeeper.demo_app import make_runner
from statekeeper.stores import Store

from .conftest import Live, SseReader

QUESTION = "Order 1042 never arrived. Can I get my money back?"


async def start_waiting_run(store: Store, tenant: str = "acme") -> str:
    """A demo run stopped on its refund call (c-refund), as another process would leave it."""
    limits = Limits(iterations=IterationFlag(maximum=10), budget=BudgetFlag(maximum=1.0))
    result = await make_runner(store, tenant).start("support", QUESTION, limits=limits)
    assert result.status == "waiting_for_approval"
    return result.run_id


async def wait_for_end(live: Live, run_id: str) -> list[dict[str, Any]]:
    """Follow the run's stream from its start until its lifecycle end; every message."""
    seen: list[dict[str, Any]] = []
    async with (
        live.client("read", timeout=30) as client,
        client.stream("GET", "/api/v1/stream", params={"run_id": run_id}) as response,
    ):
        assert response.status_code == 200
        reader = SseReader(response)
        while True:
            message = await reader.next()
            seen.append(message)
            if message["event"] in ("lifecycle/end", "lifecycle/abort"):
                return seen


async def test_list_and_show_a_run_waiting_for_approval(live: Live, db: tuple[str, Store]) -> None:
    run_id = await start_waiting_run(db[1])
    async with live.client("read") as client:
        listed = (await client.get("/api/v1/runs")).json()
        detail = (await client.get(f"/api/v1/runs/{run_id}")).json()
        history = (await client.get(f"/api/v1/runs/{run_id}/checkpoints")).json()
        events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
        waiting = await client.get("/api/v1/runs", params={"status": "waiting_for_approval"})
        session = listed["items"][0]["session_id"]
        entries = (await client.get(f"/api/v1/sessions/{session}/entries")).json()["items"]
    [summary] = listed["items"]
    assert summary["run_id"] == run_id
    assert summary["pending_approvals"] == 1
    assert summary["status"] == "waiting_for_approval"
    assert summary["cost_usd"] > 0
    assert [r["run_id"] for r in waiting.json()["items"]] == [run_id]
    [pending] = detail["pending"]
    assert pending["call_id"] == "c-refund"
    assert pending["tool"] == "issue_refund"
    assert pending["arguments"] == {"order": 1042, "amount": 42.5}
    assert pending["prompt"] == "Refund 42.50 for order 1042?"
    assert detail["metrics"]["calls"] == 2
    assert {flag["name"] for flag in detail["limits"]} >= {"iterations"}
    assert history["items"]
    assert history["items"][-1]["status"] == "waiting_for_approval"
    seqs = [e["seq"] for e in events["items"]]
    assert seqs == list(range(1, len(seqs) + 1))
    assert events["items"][0]["session_id"] == summary["session_id"]
    checkpoints = [e for e in entries if e["kind"] == "checkpoint"]
    assert len(checkpoints) == len(history["items"])
    assert {e["payload"] for e in checkpoints} == {None}  # the run's routes show them
    assert next(e["message"]["content"] for e in entries if e["kind"] == "message") == QUESTION


async def test_approve_and_resume_finishes_the_run_and_records_the_key(
    live: Live, db: tuple[str, Store]
) -> None:
    run_id = await start_waiting_run(db[1])
    async with live.client("operate") as client:
        answer = await client.post(
            f"/api/v1/runs/{run_id}/approve",
            json={"call_id": "c-refund", "reason": "lost parcel", "resume": True},
        )
    assert answer.status_code == 200, answer.text
    messages = await wait_for_end(live, run_id)
    assert messages[-1]["data"]["type"] == "lifecycle/end"
    async with live.client("read") as client:
        detail = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert detail["status"] == "completed"
    assert detail["output"] == {"refunded": True}
    # Settled, the decision is kept for good: who decided, in the view as in the log.
    [kept] = [d for d in detail["decisions"] if d["call_id"] == "c-refund"]
    assert (kept["approved"], kept["reason"]) == (True, "lost parcel")
    # Who decided reads as the key's label, with its id (labels need not be unique).
    assert kept["decided_by"] == f"test operate (key:{live.key_ids['operate']})"
    [decision] = [m["data"] for m in messages if m["event"] == "approval/approved"]
    assert decision["data"]["decided_by"] == f"test operate (key:{live.key_ids['operate']})"
    assert decision["data"]["call_id"] == "c-refund"
    assert decision["data"]["reason"] == "lost parcel"


async def test_two_concurrent_approvals_of_one_call_exactly_one_wins(
    live: Live, db: tuple[str, Store]
) -> None:
    for _ in range(3):  # a few rounds: the race lands differently each time
        run_id = await start_waiting_run(db[1])
        async with live.client("operate") as one, live.client("admin") as two:
            answers = await asyncio.gather(
                one.post(f"/api/v1/runs/{run_id}/approve", json={"call_id": "c-refund"}),
                two.post(f"/api/v1/runs/{run_id}/reject", json={"call_id": "c-refund"}),
            )
        assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
        loser = next(a for a in answers if a.status_code == 409)
        assert loser.json()["error"]["type"] == "ConflictError"
        async with live.client("read") as client:
            detail = (await client.get(f"/api/v1/runs/{run_id}")).json()
        assert len(detail["decisions"]) == 1


async def test_deciding_an_already_decided_call_is_a_conflict(
    live: Live, db: tuple[str, Store]
) -> None:
    run_id = await start_waiting_run(db[1])
    async with live.client("operate") as client:
        first = await client.post(f"/api/v1/runs/{run_id}/approve", json={"call_id": "c-refund"})
        again = await client.post(f"/api/v1/runs/{run_id}/approve", json={"call_id": "c-refund"})
        unknown = await client.post(f"/api/v1/runs/{run_id}/approve", json={"call_id": "nope"})
    assert first.status_code == 200
    assert again.status_code == 409
    assert "already approved" in again.json()["error"]["message"]
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "NotFoundError"


async def test_reject_then_resume_and_wait(live: Live, db: tuple[str, Store]) -> None:
    run_id = await start_waiting_run(db[1])
    async with live.client("operate", timeout=30) as client:
        rejected = await client.post(
            f"/api/v1/runs/{run_id}/reject", json={"call_id": "c-refund", "reason": "no"}
        )
        resumed = await client.post(f"/api/v1/runs/{run_id}/resume", json={"wait": True})
        again = await client.post(f"/api/v1/runs/{run_id}/resume", json={"wait": True})
    assert rejected.status_code == 200
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"] == "completed"
    assert resumed.json()["output"] == {"refunded": False}
    assert again.status_code == 409
    assert again.json()["error"]["type"] == "ConflictError"


async def test_cancel_raise_limits_and_fork(live: Live, db: tuple[str, Store]) -> None:
    run_id = await start_waiting_run(db[1])
    async with live.client("operate") as client:
        raised = await client.post(f"/api/v1/runs/{run_id}/limits", json={"iterations": 50})
        named = await client.post(
            f"/api/v1/runs/{run_id}/limits", json={"name": "budget", "limit": 2.5}
        )
        bad = await client.post(f"/api/v1/runs/{run_id}/limits", json={"name": "speed"})
        forked = await client.post(f"/api/v1/runs/{run_id}/fork", json={"at": 1})
        cancelled = await client.post(f"/api/v1/runs/{run_id}/cancel", json={"reason": "test"})
    assert raised.status_code == 200, raised.text
    limits = {f["name"]: f["limit"] for f in named.json()["limits"]}
    assert limits["iterations"] == 50
    assert limits["budget"] == 2.5
    assert named.json()["budget_usd"] == 2.5
    assert bad.status_code == 422
    assert bad.json()["error"]["type"] == "InvalidInputError"
    assert forked.status_code == 201, forked.text
    assert forked.json()["run_id"] != run_id
    assert forked.json()["forked_from"] == {"run_id": run_id, "step": 1}
    assert cancelled.json()["status"] == "cancelled"


async def test_keys_scopes_and_tenants(live: Live, db: tuple[str, Store]) -> None:
    run_id = await start_waiting_run(db[1])
    path = f"/api/v1/runs/{run_id}"
    async with httpx.AsyncClient(base_url=live.url) as anonymous:
        missing = await anonymous.get(path)
        wrong = await anonymous.get(path, headers={"Authorization": "Bearer sk_kdead_beef"})
        garbage = await anonymous.get(path, headers={"Authorization": "Bearer hello"})
    async with live.client("read") as reader:
        refused = await reader.post(f"{path}/approve", json={"call_id": "c-refund"})
        me = (await reader.get("/api/v1/whoami")).json()
    other = {"Authorization": f"Bearer {live.other_key}"}
    async with httpx.AsyncClient(base_url=live.url, headers=other) as stranger:
        hidden = await stranger.get(path)
        listed = await stranger.get("/api/v1/runs")
        not_approved = await stranger.post(f"{path}/approve", json={"call_id": "c-refund"})
        stream = await stranger.get("/api/v1/stream", params={"run_id": run_id})
    for answer in (missing, wrong, garbage):
        assert answer.status_code == 401
        assert answer.json()["error"]["type"] == "AuthenticationError"
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "PermissionDeniedError"
    assert me == {"tenant": "acme", "scope": "read", "key_id": live.key_ids["read"]}
    assert hidden.status_code == 404
    assert hidden.json()["error"]["type"] == "NotFoundError"
    assert listed.json()["items"] == []
    assert not_approved.status_code == 404
    assert stream.status_code == 404


async def test_a_revoked_key_is_refused(live: Live, db: tuple[str, Store]) -> None:
    from statekeeper.server import ApiKeys

    async with live.client("read") as client:
        assert (await client.get("/api/v1/runs")).status_code == 200
        await ApiKeys(db[1]).revoke(live.key_ids["read"])
        answer = await client.get("/api/v1/runs")
    assert answer.status_code == 401


async def test_bad_input_gets_typed_errors(live: Live) -> None:
    async with live.client("operate") as client:
        unknown = await client.get("/api/v1/runs/run_nope")
        bad_id = await client.get("/api/v1/runs/a..b")
        bad_body = await client.post("/api/v1/runs/run_x/approve", json={"call": 1})
        not_json = await client.post(
            "/api/v1/runs/run_x/approve",
            content=b"{",
            headers={"Content-Type": "application/json"},
        )
        no_route = await client.get("/api/v1/nothing-here")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "NotFoundError"
    assert bad_id.status_code == 422
    assert bad_id.json()["error"]["type"] == "InvalidIdError"
    for answer in (bad_body, not_json):
        assert answer.status_code == 422
        assert answer.json()["error"]["type"] == "InvalidInputError"
    assert no_route.status_code == 404
    assert no_route.json()["error"]["type"] == "NotFoundError"
