"""The ``statekeeper`` command line, against a SQLite file seeded through the Python API."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
import typer
from cli_harness import Cli
from typer.testing import CliRunner

from statekeeper.cli import _common as common_cli
from statekeeper.cli import app
from statekeeper.cli._common import parse_when
from statekeeper.core.messages import Message
from statekeeper.runs import RunStore
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store
from statekeeper.testing.damage import damage_record, damage_session

T = TypeVar("T")
HERE = Path(__file__).parent


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(f"sqlite:///{tmp_path / 'state.db'}")


@pytest.fixture
def cli_app(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(HERE))
    module = importlib.import_module("cli_app")
    module.refunds.clear()
    return module


def seed_sessions(cli: Cli) -> None:
    async def work(store: Store) -> None:
        manager = SessionManager(store, "default")
        await manager.create(
            session_id="ses-a",
            title="Order 1042",
            agent_id="support",
            messages=[
                Message.system("You are a support agent."),
                Message.user("My order 1042 is late."),
                Message.assistant("Let me check order 1042."),
                Message.user("Thanks [bold]a lot[/bold]."),
            ],
        )
        await manager.create(
            session_id="ses-b",
            title="Pricing",
            agent_id="sales",
            messages=[Message.user("How much is it?")],
        )

    cli.api(work)


def start_run(cli: Cli, cli_app: ModuleType, agent: str, text: str = "hello") -> str:
    async def work(store: Store) -> str:
        result = await cli_app.make_runner(store, "default").start(agent, text)
        return str(result.run_id)

    return cli.api(work)


def session_ids(cli: Cli) -> set[str]:
    return {item["id"] for item in cli.json("sessions", "list")["items"]}


def run_status(cli: Cli, run_id: str) -> str:
    return str(cli.json("runs", "show", run_id)["state"]["status"])


# -- sessions --------------------------------------------------------------------------------


def test_sessions_list_names_a_damaged_session_and_what_to_do(cli: Cli) -> None:
    seed_sessions(cli)
    cli.api(lambda store: damage_session(store, "default", "ses-a"))

    out = cli("sessions", "list").stdout
    assert "ses-b" in out
    assert "Pricing" in out
    [line] = [line for line in out.splitlines() if "damaged" in line]
    assert "damaged session ses-a" in line
    assert "delete" in out  # what to do: the message names the fix
    data = cli.json("sessions", "list")
    assert [item["id"] for item in data["items"]] == ["ses-b"]
    assert [item["id"] for item in data["corrupt"]] == ["ses-a"]
    assert "sessions delete ses-a" in data["corrupt"][0]["error"]

    shown = cli("sessions", "show", "ses-a", code=1)
    assert "ses-a" in shown.output
    assert "cannot be decoded" in shown.output
    cli("sessions", "delete", "ses-a", "--yes")
    assert cli.json("sessions", "list")["corrupt"] == []


def test_sessions_list_table_json_and_paging(cli: Cli) -> None:
    seed_sessions(cli)
    out = cli("sessions", "list").stdout
    for text in ("ses-a", "Order 1042", "support", "ses-b", "Pricing", "sales"):
        assert text in out
    assert "next cursor" not in out

    data = cli.json("sessions", "list")
    assert {item["id"] for item in data["items"]} == {"ses-a", "ses-b"}
    assert data["next_cursor"] is None
    assert cli.json("sessions", "list", "--agent", "sales")["items"][0]["id"] == "ses-b"
    # The command's own --json works as well as the global one.
    assert json.loads(cli("sessions", "list", "--json").stdout)["items"]

    first = cli("sessions", "list", "--limit", "1").stdout
    cursor = first.split("next cursor:")[1].strip()
    page = cli.json("sessions", "list", "--limit", "1")
    assert page["next_cursor"] == cursor
    rest = cli.json("sessions", "list", "--limit", "1", "--cursor", cursor)
    assert {page["items"][0]["id"], rest["items"][0]["id"]} == {"ses-a", "ses-b"}


def test_sessions_show_and_entries(cli: Cli) -> None:
    seed_sessions(cli)
    out = cli("sessions", "show", "ses-a").stdout
    assert "Order 1042" in out
    assert "My order 1042 is late." in out
    assert "Thanks [bold]a lot[/bold]." in out  # stored text is shown literally, not as markup
    assert "All entries" not in out

    out = cli("sessions", "show", "ses-a", "--entries").stdout
    assert "All entries (4)" in out
    assert "message" in out

    data = cli.json("sessions", "show", "ses-a", "--entries")
    assert data["session"]["id"] == "ses-a"
    assert [m["seq"] for m in data["messages"]] == [1, 2, 3, 4]
    assert data["messages"][1]["content"] == "My order 1042 is late."
    assert [(e["seq"], e["parent_seq"], e["kind"]) for e in data["entries"]] == [
        (1, None, "message"),
        (2, 1, "message"),
        (3, 2, "message"),
        (4, 3, "message"),
    ]
    assert all(e["active"] for e in data["entries"])


def test_sessions_fork_by_seq_and_by_entry_id(cli: Cli) -> None:
    seed_sessions(cli)
    args = ("--at", "2", "--title", "What if", "--id", "ses-f")
    out = cli("sessions", "fork", "ses-a", *args).stdout
    assert "forked ses-a at entry 2 into ses-f" in out
    forked = cli.json("sessions", "show", "ses-f")
    assert forked["session"]["title"] == "What if"
    assert [m["content"] for m in forked["messages"]] == [
        "You are a support agent.",
        "My order 1042 is late.",
    ]

    entry_id = cli.json("sessions", "show", "ses-a", "--entries")["entries"][2]["id"]
    data = cli.json("sessions", "fork", "ses-a", "--at", entry_id)
    new_id = data["session"]["id"]
    assert data["session"]["forked_from"] == {"session_id": "ses-a", "seq": 3}
    assert data["session"]["title"] == "Order 1042"
    assert len(cli.json("sessions", "show", new_id)["messages"]) == 3

    result = cli("sessions", "fork", "ses-a", "--at", "99", code=1)
    assert result.stderr.startswith("error: no entry 99")


def test_sessions_export_import_round_trip(cli: Cli, tmp_path: Path) -> None:
    seed_sessions(cli)
    document = json.loads(cli("sessions", "export", "ses-a").stdout)
    assert document["session"]["id"] == "ses-a"

    target = tmp_path / "ses-a.json"
    out = cli("sessions", "export", "ses-a", "-o", str(target)).stdout
    assert f"to {target}" in out
    assert json.loads(target.read_text()) == document

    result = cli("sessions", "import", str(target), code=1)  # the id is taken here
    assert result.stderr.startswith("error: ")
    out = cli("sessions", "import", str(target), "--id", "ses-copy").stdout
    assert "imported session ses-copy (" in out
    original = cli.json("sessions", "show", "ses-a")["messages"]
    copied = cli.json("sessions", "show", "ses-copy")["messages"]
    assert [m["content"] for m in copied] == [m["content"] for m in original]

    # Into another store altogether, through stdin.
    other = Cli(f"sqlite:///{tmp_path / 'other.db'}")
    other("sessions", "import", "-", input=target.read_text())
    assert session_ids(other) == {"ses-a"}

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "is not valid JSON" in cli("sessions", "import", str(bad), code=1).stderr
    missing = cli("sessions", "import", str(tmp_path / "nope.json"), code=1)
    assert missing.stderr.startswith("error: cannot read")


def test_sessions_delete_needs_confirmation(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    seed_sessions(cli)
    # Not a terminal (CliRunner's stdin): refuses without --yes.
    refused = cli("sessions", "delete", "ses-a", code=1)
    assert refused.stderr.startswith("error: not deleting session ses-a")
    assert "--yes" in refused.stderr
    assert session_ids(cli) == {"ses-a", "ses-b"}

    monkeypatch.setattr(common_cli, "stdin_is_interactive", lambda: True)
    declined = cli("sessions", "delete", "ses-a", input="n\n", code=1)
    assert "Delete session ses-a 'Order 1042' and its 4 messages?" in declined.output
    assert "Nothing deleted." in declined.stdout
    assert session_ids(cli) == {"ses-a", "ses-b"}

    cli("sessions", "delete", "ses-a", input="y\n")
    assert session_ids(cli) == {"ses-b"}

    monkeypatch.setattr(common_cli, "stdin_is_interactive", lambda: False)
    assert "deleted session ses-b" in cli("sessions", "delete", "ses-b", "--yes").stdout
    assert session_ids(cli) == set()


def test_unknown_ids_print_one_error_line(cli: Cli) -> None:
    seed_sessions(cli)
    for args in (
        ("sessions", "show", "nope"),
        ("sessions", "fork", "nope"),
        ("sessions", "export", "nope"),
        ("sessions", "delete", "nope", "--yes"),
        ("runs", "show", "nope"),
        ("runs", "approve", "nope", "c1"),
        ("runs", "cancel", "nope"),
        ("runs", "export", "nope"),
    ):
        result = cli(*args, code=1)
        assert result.stderr.startswith("error: "), args
        assert result.stderr.count("\n") == 1, args
        assert result.stdout == "", args
    assert "not found" in cli("sessions", "show", "nope", code=1).stderr
    # Invalid ids are refused the same way, and usage errors keep typer's exit code 2.
    assert cli("sessions", "show", "../etc", code=1).stderr.startswith("error: ")
    cli("sessions", "show", code=2)
    cli("sessions", "list", "--limit", "0", code=2)


def test_tenant_and_store_come_from_options_or_environment(cli: Cli) -> None:
    seed_sessions(cli)
    assert cli.json("--tenant", "someone-else", "sessions", "list")["items"] == []
    result = CliRunner().invoke(
        app,
        ["--json", "sessions", "list"],
        env={"STATEKEEPER_STORE": cli.url, "STATEKEEPER_TENANT": "default"},
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["items"]) == 2
    bad = cli("--store", "nosuch://x", "sessions", "list", code=1)
    assert bad.stderr.startswith("error: unknown store URL scheme")


# -- runs ------------------------------------------------------------------------------------


def test_runs_list_names_damaged_run_indexes(cli: Cli, cli_app: ModuleType) -> None:
    kept = start_run(cli, cli_app, "asker")
    not_json = start_run(cli, cli_app, "asker")
    not_an_index = start_run(cli, cli_app, "asker")
    cli.api(lambda store: damage_record(store, "default", "runs", not_json))
    cli.api(lambda store: damage_record(store, "default", "runs", not_an_index, '{"x": 1}'))

    data = cli.json("runs", "list")
    assert [r["run_id"] for r in data["items"]] == [kept]
    assert sorted(c["id"] for c in data["corrupt"]) == sorted([not_json, not_an_index])
    assert all("delete" in c["error"] for c in data["corrupt"])
    out = cli("runs", "list").stdout
    assert kept in out
    assert out.count("damaged run index") == 2
    shown = cli("runs", "show", not_an_index, code=1)
    assert not_an_index in shown.output


def test_a_damaged_run_is_deleted_from_the_cli(
    cli: Cli, cli_app: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = start_run(cli, cli_app, "asker")
    damaged = start_run(cli, cli_app, "asker")
    cli.api(lambda store: damage_record(store, "default", "runs", damaged, '{"x": 1}'))
    [reported] = cli.json("runs", "list")["corrupt"]
    assert f"statekeeper runs delete {damaged}" in reported["error"]

    monkeypatch.setattr(common_cli, "stdin_is_interactive", lambda: False)
    refused = cli("runs", "delete", damaged, code=1)
    assert "--yes" in refused.output
    assert len(cli.json("runs", "list")["corrupt"]) == 1  # nothing deleted

    assert f"deleted run {damaged}" in cli("runs", "delete", damaged, "--yes").stdout
    data = cli.json("runs", "list")
    assert [r["run_id"] for r in data["items"]] == [kept]
    assert data["corrupt"] == []
    assert cli("runs", "delete", kept, "--yes").stdout.startswith(f"deleted run {kept}")
    assert cli.json("runs", "list")["items"] == []
    cli("runs", "delete", kept, "--yes", code=1)  # gone: not found


def test_runs_list_and_show(cli: Cli, cli_app: ModuleType) -> None:
    run_id = start_run(cli, cli_app, "support", "refund please")
    done_id = start_run(cli, cli_app, "asker")

    out = cli("runs", "list").stdout
    assert run_id in out
    assert done_id in out
    assert "waiting_for_approval" in out
    assert "waiting_for_input" in out
    waiting = cli.json("runs", "list", "--status", "WAITING_FOR_APPROVAL")["items"]
    assert [r["run_id"] for r in waiting] == [run_id]
    assert cli.json("runs", "list", "--status", "completed")["items"] == []
    session_id = waiting[0]["session_id"]
    assert [r["run_id"] for r in cli.json("runs", "list", "--session", session_id)["items"]] == [
        run_id
    ]

    out = cli("runs", "show", run_id).stdout
    for text in (
        "waiting_for_approval",
        "Pending approvals",
        "c1",
        "refund",
        '{"amount": 5}',
        "Send money back?",
        "pending",
        "model-a",
        "120",
        "0.020000",
        "Status timeline",
        "initializing -> running",
        "running -> waiting_for_approval",
    ):
        assert text in out, text

    data = cli.json("runs", "show", run_id)
    assert data["index"]["status"] == "waiting_for_approval"
    assert data["state"]["interruptions"][0]["call_id"] == "c1"
    statuses = [(r.get("from"), r.get("to")) for r in data["timeline"] if r["kind"] == "status"]
    assert statuses == [("initializing", "running"), ("running", "waiting_for_approval")]


def test_approve_then_resume_completes(cli: Cli, cli_app: ModuleType) -> None:
    run_id = start_run(cli, cli_app, "support")
    out = cli("runs", "approve", run_id, "c1", "--reason", "fine").stdout
    assert f"approved tool call c1 (refund) of run {run_id}" in out
    assert "every call is decided" in out
    assert "approved (fine)" in cli("runs", "show", run_id).stdout
    assert cli_app.refunds == []

    out = cli("runs", "resume", run_id, "--app", "cli_app:make_runner").stdout
    assert f"run {run_id}: waiting_for_approval -> completed" in out
    assert "Refund sent." in out
    assert "refunded 5" in out
    assert 'output: {"refunded": 5}' in out
    assert cli_app.refunds == [5]
    assert run_status(cli, run_id) == "completed"
    assert "Tool calls" in cli("runs", "show", run_id).stdout

    again = cli("runs", "resume", run_id, "--app", "cli_app:make_runner", code=1)
    assert "finished run cannot be resumed" in again.stderr


def test_reject_then_resume_tells_the_agent(cli: Cli, cli_app: ModuleType) -> None:
    run_id = start_run(cli, cli_app, "support")
    unknown = cli("runs", "reject", run_id, "c9", code=1)
    assert unknown.stderr.startswith("error: run")
    assert "c9" in unknown.stderr
    cli("runs", "reject", run_id, "c1", "--reason", "too much", "--always")
    data = cli.json("runs", "resume", run_id, "--app", "cli_app:make_runner")
    assert data["status"] == "completed"
    texts = [m["content"] for m in data["new_messages"]]
    assert any("Tool call rejected: too much" in json.dumps(t) for t in texts)
    assert cli_app.refunds == []


def test_resume_with_input_and_waiting_without_decision(cli: Cli, cli_app: ModuleType) -> None:
    run_id = start_run(cli, cli_app, "asker")
    missing = cli("runs", "resume", run_id, "--app", "cli_app:make_runner", code=1)
    assert "waiting for input" in missing.stderr
    out = cli("runs", "resume", run_id, "--app", "cli_app:make_runner", "--input", "1042").stdout
    assert "waiting_for_input -> completed" in out
    assert "Thanks, looking at order 1042." in out

    pending = start_run(cli, cli_app, "support")
    out = cli("runs", "resume", pending, "--app", "cli_app:make_runner").stdout
    assert "waiting_for_approval -> waiting_for_approval" in out
    assert "waiting for approval of c1 refund" in out


def test_a_run_another_process_holds(cli: Cli, cli_app: ModuleType) -> None:
    held_id = start_run(cli, cli_app, "support")
    free_id = start_run(cli, cli_app, "support")
    cli("runs", "approve", held_id, "c1")

    async def hold(store: Store) -> None:
        for run_id in (held_id, free_id):
            await RunStore(store, "default").claim(run_id, "elsewhere:1:abc", ttl=600)

    cli.api(hold)
    assert "running on elsewhere:1:abc" in cli("runs", "list").stdout
    held = cli("runs", "resume", held_id, "--app", "cli_app:make_runner", code=1)
    assert held.stderr.startswith(f"error: run {held_id!r} is being run by elsewhere:1:abc")
    out = cli("runs", "resume", held_id, "--app", "cli_app:make_runner", "--take-over").stdout
    assert "waiting_for_approval -> completed" in out
    assert cli_app.refunds == [5]

    out = cli("runs", "cancel", free_id).stdout
    assert "cancel requested" in out
    assert "elsewhere:1:abc" in out
    assert cli.json("runs", "show", free_id)["index"]["cancel_requested"] is True


def test_resume_app_errors(cli: Cli, cli_app: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = start_run(cli, cli_app, "crasher")
    cli("runs", "resume", run_id, "--app", "no-colon", code=2)
    cli("runs", "resume", run_id, code=2)  # --app is required
    result = cli("runs", "resume", run_id, "--app", "no_such_module_xyz:make", code=1)
    assert result.stderr.startswith("error: cannot import 'no_such_module_xyz'")
    result = cli("runs", "resume", run_id, "--app", "cli_app:missing", code=1)
    assert "has no attribute 'missing'" in result.stderr
    result = cli("runs", "resume", run_id, "--app", "cli_app:not_a_runner", code=1)
    assert "returned str, not a statekeeper Runner" in result.stderr

    monkeypatch.setenv("STATEKEEPER_APP", "cli_app:make_runner")
    result = cli("runs", "resume", run_id, "--input", "boom", code=1)
    assert result.stderr.startswith(f"error: run {run_id} failed: RuntimeError: model exploded")
    out = cli("runs", "show", run_id).stdout
    assert "Error" in out
    assert "model exploded" in out
    assert "RuntimeError" in out
    assert "waiting_for_input -> running" in out
    assert "running -> error" in out


def test_cancel_works_without_an_app(cli: Cli, cli_app: ModuleType) -> None:
    run_id = start_run(cli, cli_app, "support")
    out = cli("runs", "cancel", run_id, "--reason", "customer left").stdout
    assert f"cancelled run {run_id} (was waiting_for_approval)" in out
    data = cli.json("runs", "show", run_id)
    assert data["state"]["status"] == "cancelled"
    assert data["state"]["metadata"]["cancel_reason"] == "customer left"
    assert "customer left" in cli("runs", "show", run_id).stdout
    assert "already cancelled" in cli("runs", "cancel", run_id).stdout
    assert cli("runs", "approve", run_id, "c1", code=1).stderr.startswith("error: run")


def test_runs_export_import_round_trip(cli: Cli, cli_app: ModuleType, tmp_path: Path) -> None:
    run_id = start_run(cli, cli_app, "support", "refund please")
    snapshot = json.loads(cli("runs", "export", run_id).stdout)
    assert snapshot["run_id"] == run_id
    assert any(item["content"] == "refund please" for item in snapshot["items"])
    target = tmp_path / "run.json"
    cli("runs", "export", run_id, "-o", str(target))

    taken = cli("runs", "import", str(target), code=1)
    assert "already exists" in taken.stderr
    out = cli("runs", "import", str(target), "--run-id", "run-copy", "--session-id", "ses-copy")
    assert "imported run run-copy (waiting_for_approval) into session ses-copy" in out.stdout
    assert run_status(cli, "run-copy") == "waiting_for_approval"
    messages = cli.json("sessions", "show", "ses-copy")["messages"]
    assert [m["content"] for m in messages] == ["refund please"]

    # The imported run goes on like the original would.
    cli("runs", "approve", "run-copy", "c1")
    cli("runs", "resume", "run-copy", "--app", "cli_app:make_runner")
    assert run_status(cli, "run-copy") == "completed"
    assert run_status(cli, run_id) == "waiting_for_approval"

    other = Cli(f"sqlite:///{tmp_path / 'other.db'}")
    assert other.json("runs", "import", "-", input=target.read_text())["run_id"] == run_id


# -- gc --------------------------------------------------------------------------------------


def test_gc_dry_run_then_everything_before_a_future_date(cli: Cli, cli_app: ModuleType) -> None:
    seed_sessions(cli)
    run_id = start_run(cli, cli_app, "support")
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()

    out = cli("gc", "--before", tomorrow, "--dry-run").stdout
    assert "would delete 1 run(s) and 3 session(s)" in out
    assert run_id in out
    assert "ses-a" in out
    assert len(session_ids(cli)) == 3

    assert "deleted 0 run(s) and 0 session(s)" in cli("gc", "--before", "30d").stdout
    data = cli.json("gc", "--before", tomorrow, "--no-sessions")
    assert data["runs"] == [run_id]
    assert data["sessions"] == []
    assert cli.json("runs", "list")["items"] == []
    assert len(session_ids(cli)) == 3

    out = cli("gc", "--before", tomorrow).stdout
    assert "deleted 0 run(s) and 3 session(s)" in out
    assert session_ids(cli) == set()

    bad = cli("gc", "--before", "last tuesday", code=2)
    assert "ISO 8601" in bad.output


def test_gc_keeps_what_is_newer(cli: Cli) -> None:
    seed_sessions(cli)
    yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")
    assert cli.json("gc", "--before", yesterday)["sessions"] == []
    assert len(session_ids(cli)) == 2


def test_gc_keeps_an_old_session_a_newer_fork_reads(cli: Cli) -> None:
    async def old(store: Store) -> None:
        manager = SessionManager(store, "default")
        await manager.create(session_id="ses-old", messages=[Message.user("first")])
        parent = await manager.create(session_id="ses-parent", messages=[Message.user("hi")])
        await parent.fork(session_id="ses-fork")

    async def new(store: Store) -> None:
        fork = await SessionManager(store, "default").get("ses-fork")
        await fork.append(Message.user("still here"))

    cli.api(old)
    cutoff = datetime.now(UTC).isoformat()
    cli.api(new)

    data = cli.json("gc", "--before", cutoff)
    assert data["sessions"] == ["ses-old"]
    assert data["kept_sessions"] == ["ses-parent"]
    assert session_ids(cli) == {"ses-parent", "ses-fork"}
    shown = cli.json("sessions", "show", "ses-fork")
    assert [m["content"] for m in shown["messages"]] == ["hi", "still here"]

    out = cli("gc", "--before", cutoff, "--dry-run").stdout
    assert "would delete 0 run(s) and 0 session(s)" in out
    assert "kept 0 older run(s) and 1 older session(s)" in out
    assert "ses-parent" in out


def test_parse_when() -> None:
    now = datetime(2024, 5, 10, 12, 0, tzinfo=UTC)
    assert parse_when("30d", now=now) == now - timedelta(days=30)
    assert parse_when("12h", now=now) == now - timedelta(hours=12)
    assert parse_when("1d12h", now=now) == now - timedelta(days=1, hours=12)
    assert parse_when("2w", now=now) == now - timedelta(weeks=2)
    assert parse_when("2024-05-01") == datetime(2024, 5, 1, tzinfo=UTC)
    assert parse_when("2024-05-01T10:00:00+02:00") == datetime(2024, 5, 1, 8, tzinfo=UTC)
    assert parse_when("2024-05-01T10:00:00Z") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    for bad in ("", "soon", "30x", "d30"):
        with pytest.raises(typer.BadParameter):
            parse_when(bad)


# -- the installed entry point ---------------------------------------------------------------


@pytest.mark.slow
def test_console_script_runs() -> None:
    script = Path(sys.executable).with_name("statekeeper")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "statekeeper.cli"]
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "sessions" in done.stdout
    assert "runs" in done.stdout
    assert "gc" in done.stdout


# -- help and the missing extra --------------------------------------------------------------


def all_command_paths() -> list[list[str]]:
    """The path of every group and command of the app (the root is [])."""
    paths: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():  # a group's commands
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_help_of_every_command_labels_no_flag_as_taking_a_value() -> None:
    runner = CliRunner()
    paths = all_command_paths()
    assert ["gc"] in paths
    assert ["runs", "resume"] in paths
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, path
        assert "--help" in result.output


@pytest.mark.slow
@pytest.mark.parametrize(
    "entry",
    [
        "from statekeeper.cli import main; main()",
        "import runpy; runpy.run_module('statekeeper.cli', run_name='__main__')",
    ],
    ids=["console-script", "python-m"],
)
def test_without_the_cli_extra_one_clear_line_and_exit_code_1(entry: str) -> None:
    # None in sys.modules makes `import typer` fail as if typer were not installed.
    code = f"import sys; sys.modules['typer'] = None; {entry}"
    done = subprocess.run(
        [sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        "error: the statekeeper command line requires the 'cli' extra. "
        "Install it with: pip install 'statekeeper[cli]'\n"
    )


def test_a_session_an_unfinished_run_uses_is_not_deleted_unless_forced(
    cli: Cli, cli_app: ModuleType
) -> None:
    run_id = start_run(cli, cli_app, "support", "refund please")  # waits for approval
    [listed] = cli.json("runs", "list")["items"]
    session_id = listed["session_id"]
    refused = cli("sessions", "delete", session_id, "--yes", code=1)
    assert run_id in refused.output
    assert "--force" in refused.output
    assert cli.json("sessions", "show", session_id)  # still there
    cli("runs", "cancel", run_id)
    cli("sessions", "delete", session_id, "--yes")  # a finished run no longer holds it
    other = start_run(cli, cli_app, "support", "refund again")
    [held] = [r for r in cli.json("runs", "list")["items"] if r["run_id"] == other]
    cli("sessions", "delete", held["session_id"], "--yes", "--force")
    cli("sessions", "show", held["session_id"], code=1)
