"""A run whose process died before its first checkpoint: shown as failed to start (run
index, `RunStore.load`, ``runs list`` / ``runs show``, the server's run views), and
cancellable and deletable; a run a live process is still starting is left alone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from asgi_client import served
from statekeeper.cli import app as cli_app
from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, NotFoundError
from statekeeper.runs import Finish, Runner, RunState, RunStore
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.server import ApiKeys
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import WrappingStore

HERE = Path(__file__).parent


def cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli_app, ["--store", url, *args])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "Traceback" not in result.output
    return result.stdout


def kill_in_first_step(db: Path, run_id: str) -> None:
    """Start a run in a real subprocess that is SIGKILLed in its first step."""
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    app = [sys.executable, str(HERE / "proc_app.py"), f"sqlite:///{db}", "start-dying", run_id]
    done = subprocess.run(app, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_fails_to_start(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    url = f"sqlite:///{db}"
    kill_in_first_step(db, "run-dead")

    async def look() -> tuple[Any, RunState]:
        async with await open_store(url) as store:
            runs = RunStore(store, "t")
            return await runs.list(), await runs.load_latest("run-dead")

    listed, loaded = asyncio.run(look())
    [index] = listed
    assert (index.run_id, index.status, index.failed_to_start) == ("run-dead", "error", True)
    assert loaded.index.failed_to_start
    assert loaded.checkpoint_id == ""
    state = loaded.state
    assert (state.status, state.revision, state.agent) == ("error", 0, "dier")
    assert state.error is not None
    assert state.error.type == "FailedToStart"
    assert "before the run's first checkpoint" in state.error.message
    assert f"process {socket.gethostname()}:" in state.error.message  # the one that held it
    assert (index.owner, index.lease_until) == (None, None)  # a dead process's lease

    shown = json.loads(cli(url, "--tenant", "t", "--json", "runs", "show", "run-dead"))
    assert shown["index"]["status"] == "error"
    assert shown["state"]["error"]["type"] == "FailedToStart"
    assert "FailedToStart" in cli(url, "--tenant", "t", "runs", "show", "run-dead")
    listed_json = json.loads(cli(url, "--tenant", "t", "--json", "runs", "list"))
    assert [(r["run_id"], r["status"]) for r in listed_json["items"]] == [("run-dead", "error")]
    assert listed_json["items"][0]["failed_to_start"] is True
    assert "failed to start" in cli(url, "--tenant", "t", "runs", "list")

    assert "cancelled run run-dead" in cli(url, "--tenant", "t", "runs", "cancel", "run-dead")
    status = json.loads(cli(url, "--tenant", "t", "--json", "runs", "show", "run-dead"))
    assert status["state"]["status"] == "cancelled"
    cli(url, "--tenant", "t", "runs", "delete", "run-dead", "--yes")
    assert json.loads(cli(url, "--tenant", "t", "--json", "runs", "list"))["items"] == []


async def test_runner_cancel_and_delete_a_run_that_failed_to_start(store: Store) -> None:
    runs = RunStore(store, "t")
    session = await SessionManager(store, "t").create()
    await runs.create(RunState(run_id="run-x", tenant="t", session_id=session.id, agent="a"))

    runner = Runner(store, "t", [ScriptedAgent("a", [Finish("done")])])
    assert (await runner.load("run-x")).status == "error"
    with pytest.raises(InvalidInputError, match="failed to start: nothing of it was saved"):
        await runner.resume("run-x")
    cancelled = await runner.cancel("run-x", "never ran")
    assert cancelled.status == "cancelled"
    assert (await runner.load("run-x")).status == "cancelled"
    assert [i.status for i in await runs.list(status="cancelled")] == ["cancelled"]
    await runs.delete("run-x")
    with pytest.raises(NotFoundError):
        await runner.load("run-x")


async def test_a_run_a_live_process_is_starting_is_not_failed(store: Store) -> None:
    runs = RunStore(store, "t")
    session = await SessionManager(store, "t").create()
    alive = f"{socket.gethostname()}:{os.getpid()}:starter"
    state = RunState(run_id="run-s", tenant="t", session_id=session.id, agent="a")
    await runs.create(state, owner=alive, ttl=60)

    [index] = await runs.list()
    assert (index.status, index.failed_to_start) == ("initializing", False)
    with pytest.raises(NotFoundError, match="no checkpoint yet"):
        await runs.load("run-s")

    # The lease ran out (a process elsewhere, whose liveness cannot be seen): failed.
    index, version = await runs.index("run-s")
    index.owner, index.lease_until = "elsewhere:1:x", utcnow() - timedelta(seconds=1)
    await runs.put_index(index, expected_version=version)
    assert (await runs.load("run-s"))[0].status == "error"
    # A stored index never keeps the derived flag.
    record = await store.get_record("t", "runs", "run-s")
    assert isinstance(record.value, dict)
    assert "failed_to_start" not in record.value


class IndexWrites(WrappingStore):
    """Records the run index records written."""

    def __init__(self, store: Store) -> None:
        self.wrapped, self.written = store, []

    async def put_record(self, tenant: str, namespace: str, key: str, value: Any, **kw: Any) -> Any:
        if namespace == "runs":
            self.written.append(value)
        return await self.wrapped.put_record(tenant, namespace, key, value, **kw)


async def test_start_holds_the_run_from_its_registration(store: Store) -> None:
    """No window between registering the run and taking its lease, in which another
    process would see it unheld and declare it failed to start."""
    spy = IndexWrites(store)
    runner = Runner(spy, "t", [ScriptedAgent("a", [Finish("done")])])  # type: ignore[arg-type]
    await runner.start("a", "hi", run_id="run-h")
    assert spy.written[0]["revision"] == 0
    assert spy.written[0]["owner"] == runner.owner


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Store]]:
    url = f"sqlite:///{tmp_path}/state.db"
    async with await open_store(url) as store:
        _, key = await ApiKeys(store).create("t", "operate", label="ops")
        async with served(url, key) as client:
            yield client, store


async def test_the_server_shows_and_cancels_a_run_that_failed_to_start(
    server: tuple[httpx.AsyncClient, Store],
) -> None:
    client, store = server
    session = await SessionManager(store, "t").create()
    state = RunState(run_id="run-f", tenant="t", session_id=session.id, agent="a")
    await RunStore(store, "t").create(state)

    listed = (await client.get("/api/v1/runs")).json()
    assert [(r["run_id"], r["status"]) for r in listed["items"]] == [("run-f", "error")]
    detail = (await client.get("/api/v1/runs/run-f")).json()
    assert detail["status"] == "error"
    assert detail["error_detail"]["type"] == "FailedToStart"
    assert listed["items"][0]["failed_to_start"] is detail["failed_to_start"] is True
    cancelled = await client.post("/api/v1/runs/run-f/cancel", json={"reason": "dead"})
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
