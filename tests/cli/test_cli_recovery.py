"""``statekeeper runs show`` after crashes and corrupt checkpoints; ``runs history`` and
``runs fork`` (time travel). Against a SQLite file seeded through the Python API."""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest
from cli_harness import Cli

from statekeeper.runs import RunStore
from statekeeper.runs.store import CHECKPOINT_KIND
from statekeeper.stores import Store

T = TypeVar("T")
HERE = Path(__file__).parent


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(f"sqlite:///{tmp_path / 'state.db'}")


@pytest.fixture
def cli_app(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(HERE))
    return importlib.import_module("cli_app")


def start_asker(cli: Cli, cli_app: ModuleType) -> tuple[str, str]:
    """A run waiting for input; returns its id and session id."""

    async def work(store: Store) -> tuple[str, str]:
        result = await cli_app.make_runner(store, "default").start("asker", "hello")
        return result.run_id, result.state.session_id

    return cli.api(work)


def test_show_after_a_crash_prints_what_load_sees(cli: Cli, cli_app: ModuleType) -> None:
    run_id, _ = start_asker(cli, cli_app)

    async def step_without_index(store: Store) -> int:
        runs = RunStore(store, "default")
        state, index_version, _ = await runs.load(run_id)
        state.turn += 1  # a running runner's checkpoint; it crashed before its index write
        await runs.save(state, index_version=index_version, update_index=False)
        return state.turn

    turn = cli.api(step_without_index)
    shown = cli.json("runs", "show", run_id)
    assert shown["index"]["turn"] == turn == shown["state"]["turn"]
    lines = cli("runs", "show", run_id).stdout.splitlines()
    assert [line.split() for line in lines if line.startswith("turn ")] == [["turn", str(turn)]]
    listed = cli.json("runs", "list")["items"]
    assert listed[0]["turn"] == turn  # show rolled the index forward


def test_show_reports_a_corrupt_checkpoint_and_what_it_loaded(
    cli: Cli, cli_app: ModuleType
) -> None:
    run_id, session_id = start_asker(cli, cli_app)

    async def checkpoints(store: Store) -> list[str]:
        entries = await store.read_entries("default", session_id)
        return [e.id for e in entries if e.kind == CHECKPOINT_KIND]

    ids = cli.api(checkpoints)
    with sqlite3.connect(cli.url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE entries SET payload='{not json' WHERE id=?", (ids[-1],))
    conn.close()

    shown = cli.json("runs", "show", run_id)
    assert shown["state"]["status"] == "running"  # the checkpoint before the question
    [recovery] = shown["recovery"]
    assert (recovery["checkpoint"], recovery["loaded"]) == (ids[-1], ids[-2])
    text = cli("runs", "show", run_id).stdout
    assert "Recovered from corrupt checkpoints" in text
    assert ids[-1] in text
    cli("runs", "resume", run_id, "--app", "cli_app:make_runner")


def test_history_then_fork_and_resume(cli: Cli, cli_app: ModuleType) -> None:
    run_id, _ = start_asker(cli, cli_app)
    cli("runs", "resume", run_id, "--app", "cli_app:make_runner", "--input", "1042")
    items = cli.json("runs", "history", run_id)["items"]
    assert [(i["step"], i["status"]) for i in items] == [
        (1, "running"),
        (2, "waiting_for_input"),
        (3, "running"),
        (4, "completed"),
    ]
    assert [i["message_count"] for i in items] == [1, 1, 1, 1]
    text = cli("runs", "history", run_id).stdout
    assert "waiting_for_input" in text
    assert items[1]["added"][0] in text

    refused = cli("runs", "resume", run_id, "--app", "cli_app:make_runner", code=1)
    assert f"statekeeper runs fork {run_id} --at STEP" in " ".join(refused.output.split())

    made = cli.json("runs", "fork", run_id, "--at", "2", "--run-id", "run-b", "--title", "retry")
    assert made["run_id"] == "run-b"
    assert made["status"] == "waiting_for_input"
    assert made["forked_from"] == {"run_id": run_id, "step": 2}
    resumed = cli.json("runs", "resume", "run-b", "--app", "cli_app:make_runner", "--input", "2077")
    assert resumed["output"] == {"order": "2077"}
    assert cli.json("runs", "show", run_id)["state"]["output"] == {"order": "1042"}
    assert f"run {run_id} at step 2" in cli("runs", "show", "run-b").stdout

    ran = cli(
        "runs", "fork", run_id, "--at", "2", "--app", "cli_app:make_runner", "--input", "7"
    ).stdout
    assert "completed" in ran
    assert "Thanks, looking at order 7." in ran


def test_fork_errors_are_one_line(cli: Cli, cli_app: ModuleType) -> None:
    run_id, _ = start_asker(cli, cli_app)
    missing = cli("runs", "fork", run_id, "--at", "9", code=1)
    assert "runs history" in missing.output
    needs_app = cli("runs", "fork", run_id, "--input", "x", code=1)
    assert "--app" in needs_app.output
    bad_state = cli("runs", "fork", run_id, "--state", "[1]", code=2)
    assert "JSON object" in bad_state.output
    fixed = cli("runs", "fork", run_id, "--state", '{"run_id": "x"}', code=1)
    assert "run_id" in fixed.output
    assert [r["run_id"] for r in cli.json("runs", "list")["items"]] == [run_id]
    state = cli.json("runs", "fork", run_id, "--state", '{"metadata": {"why": "retry"}}')
    assert cli.json("runs", "show", state["run_id"])["state"]["metadata"]["why"] == "retry"
