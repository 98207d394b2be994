"""Start and steer through HTTP: the app's agents, a run started with input, follow-ups
to a running, stopped, waiting or finished run; and the 422 of a server without --app."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from statekeeper.server import ServerConfig
from statekeeper.stores import Store

from .conftest import Live, ThreadServer, live_server, make_keys
from .steer_app import make_runner as steer_runner

APP = "server.steer_app:make_runner"


@pytest.fixture
async def steer(db: tuple[str, Store]) -> AsyncIterator[Live]:
    """A server whose --app has the ``listener`` agent (steer_app)."""
    async with live_server(db, APP) as server:
        yield server


async def until(
    client: httpx.AsyncClient, run_id: str, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The run's detail once ``check`` holds (polling its state, up to 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        run = (await client.get(f"/api/v1/runs/{run_id}")).json()
        if check(run):
            return run
        assert time.monotonic() < deadline, f"run {run_id} never got there: {run}"
        await asyncio.sleep(0.05)


async def texts(client: httpx.AsyncClient, run: dict[str, Any]) -> list[str]:
    """The texts of the run's session, oldest first."""
    entries = await client.get(f"/api/v1/sessions/{run['session_id']}/entries")
    found = []
    for entry in entries.json()["items"]:
        content = (entry.get("message") or {}).get("content")
        if isinstance(content, str):
            found.append(content)
    return found


async def heard(client: httpx.AsyncClient, run_id: str, text: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        run = (await client.get(f"/api/v1/runs/{run_id}")).json()
        if text in await texts(client, run):
            return run
        assert time.monotonic() < deadline, f"run {run_id} never said {text!r}"
        await asyncio.sleep(0.05)


async def start(client: httpx.AsyncClient, agent: str, text: str, **more: Any) -> dict[str, Any]:
    answer = await client.post("/api/v1/runs", json={"agent": agent, "input": text, **more})
    assert answer.status_code == 202, answer.text
    run: dict[str, Any] = answer.json()
    return run


async def test_agents_are_listed_and_a_run_starts_with_input(steer: Live) -> None:
    async with steer.client() as client:
        agents = (await client.get("/api/v1/agents")).json()["items"]
        run = await start(
            client, "support", "Refund order 1042.", title="Refund", limits={"iterations": 7}
        )
        waiting = await until(client, run["run_id"], lambda r: r["status"] != "running")
    assert [a["name"] for a in agents] == ["carrier", "listener", "support", "triage"]
    assert agents[1]["description"].startswith("Answers each input")
    assert run["agent"] == "support"
    assert waiting["status"] == "waiting_for_approval"
    assert {lim["name"]: lim["limit"] for lim in waiting["limits"]}["iterations"] == 7


async def test_a_start_that_is_refused_stores_nothing(steer: Live) -> None:
    async with steer.client() as client:
        unknown = await client.post("/api/v1/runs", json={"agent": "nobody", "input": "hi"})
        missing = await client.post(
            "/api/v1/runs", json={"agent": "support", "input": "hi", "session_id": "nope"}
        )
        empty = await client.post("/api/v1/runs", json={"agent": "support", "input": ""})
        async with steer.client("read") as read_only:
            reader = await read_only.post("/api/v1/runs", json={"agent": "support", "input": "hi"})
        runs = (await client.get("/api/v1/runs")).json()["items"]
    assert unknown.status_code in (404, 422), unknown.text
    assert "nobody" in unknown.json()["error"]["message"]
    assert missing.status_code == 404
    assert empty.status_code == 422
    assert reader.status_code == 403
    assert runs == []


async def test_steer_a_running_run_queue_behind_it_and_the_queue_goes_on_after(
    steer: Live,
) -> None:
    async with steer.client() as client:
        run = await start(client, "listener", "hello")
        run_id = run["run_id"]
        await heard(client, run_id, "heard: hello")
        steered = await client.post(
            f"/api/v1/runs/{run_id}/followups", json={"text": "go left", "mode": "steer"}
        )
        assert steered.status_code == 202, steered.text
        assert steered.json()["outcome"] == "steered"
        assert steered.json()["run_id"] == run_id
        await heard(client, run_id, "heard: go left")
        queued = await client.post(
            f"/api/v1/runs/{run_id}/followups", json={"text": "later", "mode": "queue"}
        )
        assert queued.json()["outcome"] == "queued"
        assert queued.json()["pending"] == 1
        again = await client.post(
            f"/api/v1/runs/{run_id}/followups", json={"text": "later", "mode": "queue"}
        )
        assert again.status_code == 200
        assert again.json()["outcome"] == "deduplicated"
        await client.post(f"/api/v1/runs/{run_id}/followups", json={"text": "stop"})
        done = await until(client, run_id, lambda r: r["status"] == "completed")
        assert done["output"] == {"heard": ["hello", "go left", "stop"]}
        # The queued text went on once the run ended: its conversation, forked.
        deadline = time.monotonic() + 20
        while True:
            listed = (await client.get("/api/v1/runs")).json()["items"]
            forks = [r for r in listed if r["run_id"] != run_id]
            if forks:
                break
            assert time.monotonic() < deadline, listed
            await asyncio.sleep(0.05)
        [fork] = forks
        fork_run = await heard(client, fork["run_id"], "heard: later")
        assert fork_run["forked_from"]["run_id"] == run_id
        await client.post(f"/api/v1/runs/{fork['run_id']}/cancel")


async def test_a_run_waiting_for_input_resumes_with_the_follow_up(steer: Live) -> None:
    async with steer.client() as client:
        run = await start(client, "listener", "ask")
        run_id = run["run_id"]
        await until(client, run_id, lambda r: r["status"] == "waiting_for_input")
        sent = await client.post(
            f"/api/v1/runs/{run_id}/followups", json={"text": "stop", "mode": "queue"}
        )
        assert sent.status_code == 202, sent.text
        assert sent.json()["outcome"] == "resumed"
        assert sent.json()["run_id"] == run_id
        done = await until(client, run_id, lambda r: r["status"] == "completed")
    assert done["output"] == {"heard": ["ask", "stop"]}


async def test_a_run_starts_on_a_session_only_when_no_run_is_going_on_it(steer: Live) -> None:
    async with steer.client() as client:
        first = await start(client, "listener", "ask")
        await until(client, first["run_id"], lambda r: r["status"] == "waiting_for_input")
        busy = await client.post(
            "/api/v1/runs",
            json={"agent": "listener", "input": "hi", "session_id": first["session_id"]},
        )
        await client.post(f"/api/v1/runs/{first['run_id']}/cancel")
        second = await start(client, "listener", "stop", session_id=first["session_id"])
        done = await until(client, second["run_id"], lambda r: r["status"] == "completed")
    assert busy.status_code == 409
    assert "followups" in busy.json()["error"]["message"]
    assert second["session_id"] == first["session_id"]
    assert done["output"] == {"heard": ["ask", "stop"]}  # the conversation went on


async def test_follow_ups_that_cannot_be_taken_are_refused_saying_why(steer: Live) -> None:
    async with steer.client() as client:
        waiting = await start(client, "support", "Refund order 1042.")
        await until(client, waiting["run_id"], lambda r: r["status"] == "waiting_for_approval")
        refused = await client.post(
            f"/api/v1/runs/{waiting['run_id']}/followups", json={"text": "hurry"}
        )
        at_limit = await start(client, "listener", "ask", limits={"iterations": 1})
        stopped = await until(client, at_limit["run_id"], lambda r: r["status"] != "running")
        assert stopped["status"] == "waiting_for_input"
        # One step used of one: input would need a step the limit does not allow.
        full = await client.post(
            f"/api/v1/runs/{at_limit['run_id']}/followups", json={"text": "more"}
        )
        bad_mode = await client.post(
            f"/api/v1/runs/{waiting['run_id']}/followups", json={"text": "x", "mode": "later"}
        )
        missing = await client.post("/api/v1/runs/run_nope/followups", json={"text": "x"})
        after = (await client.get(f"/api/v1/runs/{waiting['run_id']}")).json()
    assert refused.status_code == 409
    assert "approve or reject" in refused.json()["error"]["message"]
    assert full.status_code == 409
    assert "raise it first" in full.json()["error"]["message"]
    assert bad_mode.status_code == 422
    assert missing.status_code == 404
    assert after["status"] == "waiting_for_approval"  # nothing changed


async def test_a_finished_run_goes_on_in_a_fork_with_the_follow_up(steer: Live) -> None:
    async with steer.client() as client:
        run = await start(client, "listener", "stop")
        run_id = run["run_id"]
        await until(client, run_id, lambda r: r["status"] == "completed")
        sent = await client.post(f"/api/v1/runs/{run_id}/followups", json={"text": "ask"})
        assert sent.status_code == 202, sent.text
        body = sent.json()
        fork = await until(client, body["run_id"], lambda r: r["status"] == "waiting_for_input")
        original = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert body["outcome"] == "forked"
    assert body["run_id"] != run_id
    assert fork["forked_from"]["run_id"] == run_id
    assert original["status"] == "completed"
    assert original["output"] == {"heard": ["stop"]}


async def test_a_run_driven_by_another_process_is_not_steered(
    steer: Live, db: tuple[str, Store]
) -> None:
    elsewhere = steer_runner(db[1], "acme")
    work = asyncio.create_task(elsewhere.start("listener", "hello"))
    try:
        async with steer.client() as client:
            deadline = time.monotonic() + 20
            while not (listed := (await client.get("/api/v1/runs")).json()["items"]):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            [run] = listed
            refused = await client.post(
                f"/api/v1/runs/{run['run_id']}/followups", json={"text": "hi"}
            )
            owner = (await client.get("/api/v1/agents")).json()["owner"]
            await client.post(f"/api/v1/runs/{run['run_id']}/cancel")
    finally:
        await work
    assert refused.status_code == 409
    assert "another process" in refused.json()["error"]["message"]
    assert run["owner"] == elsewhere.owner != owner  # what the page compares


async def test_without_app_start_and_follow_ups_name_app(db: tuple[str, Store]) -> None:
    url, store = db
    keys, _, _ = await make_keys(store)
    server = ThreadServer(ServerConfig(url, poll_interval=0.05)).start()
    try:
        headers = {"Authorization": f"Bearer {keys['operate']}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
            answers = [
                await client.get("/api/v1/agents"),
                await client.post("/api/v1/runs", json={"agent": "support", "input": "hi"}),
                await client.post("/api/v1/runs/run_x/followups", json={"text": "hi"}),
            ]
    finally:
        server.stop()
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert "--app" in json.dumps(answer.json())


def test_cli_starts_a_run_and_sends_follow_ups(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from statekeeper.cli._app import app

    store = ["--store", f"sqlite:///{tmp_path}/cli.db", "--json"]
    cli = CliRunner()
    started = cli.invoke(app, [*store, "runs", "start", "listener", "ask", "--app", APP])
    assert started.exit_code == 0, started.output
    run = json.loads(started.output)
    assert (run["outcome"], run["status"]) == ("started", "waiting_for_input")
    sent = cli.invoke(app, [*store, "runs", "followup", run["run_id"], "stop", "--app", APP])
    assert sent.exit_code == 0, sent.output
    done = json.loads(sent.output)
    assert (done["outcome"], done["run_id"], done["status"]) == (
        "resumed",
        run["run_id"],
        "completed",
    )
    assert done["output"] == {"heard": ["ask", "stop"]}
    forked = cli.invoke(app, [*store, "runs", "followup", run["run_id"], "ask", "--app", APP])
    assert json.loads(forked.output)["outcome"] == "forked"
    waiting = cli.invoke(app, [*store, "runs", "start", "support", "Refund 1042.", "--app", APP])
    waiting_id = json.loads(waiting.output)["run_id"]
    session = json.loads(waiting.output)["session_id"]
    busy = cli.invoke(
        app, [*store, "runs", "start", "listener", "hi", "--session", session, "--app", APP]
    )
    assert busy.exit_code == 1
    assert "has a run that has not finished" in busy.output
    refused = cli.invoke(app, [*store, "runs", "followup", waiting_id, "hurry", "--app", APP])
    assert refused.exit_code == 1
    assert "approve or reject" in refused.output
    bad = cli.invoke(
        app, [*store, "runs", "followup", waiting_id, "x", "--app", APP, "--mode", "x"]
    )
    assert bad.exit_code != 0
    assert "steer, queue" in bad.output
