"""``statekeeper events|subagents|lanes|profiles`` against a SQLite file seeded via the API."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
from cli_harness import Cli
from pydantic import JsonValue

from statekeeper.cli import events as runtime_cli
from statekeeper.core.messages import Message
from statekeeper.runs import Action, Finish, Respond, Runner, RunStore, StepInput
from statekeeper.runtime import (
    AllProfilesCoolingDownError,
    AuthProfiles,
    EventBus,
    SubagentRegistry,
)
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store

T = TypeVar("T")
HERE = Path(__file__).parent
TENANT = "default"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    made = Cli(f"sqlite:///{tmp_path / 'state.db'}")
    made.api(lambda store: asyncio.sleep(0))  # an empty store (reading never creates one)
    return made


@pytest.fixture
def cli_app(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(HERE))
    module = importlib.import_module("cli_app")
    module.refunds.clear()
    return module


def start_run(cli: Cli, cli_app: ModuleType, agent: str = "support") -> tuple[str, str]:
    """A run of ``agent`` (support stops waiting for approval): (run id, session id)."""

    async def work(store: Store) -> tuple[str, str]:
        result = await cli_app.make_runner(store, TENANT).start(agent, "hello")
        return str(result.run_id), str(result.state.session_id)

    return cli.api(work)


def finished_run(cli: Cli, cli_app: ModuleType) -> str:
    """A support run approved and resumed to completion (its log ends with lifecycle/end)."""

    async def work(store: Store) -> str:
        runner = cli_app.make_runner(store, TENANT)
        run_id = str((await runner.start("support", "refund please")).run_id)
        await runner.approve(run_id, "c1")
        assert (await runner.resume(run_id)).status == "completed"
        return run_id

    return cli.api(work)


def publish(cli: Cli, run_id: str, *events: tuple[str, str, dict[str, Any]]) -> None:
    async def work(store: Store) -> None:
        bus = EventBus(store, TENANT)
        for stream, kind, payload in events:
            await bus.publish(run_id, stream, kind, payload)
        await bus.aclose()

    cli.api(work)


SEEDED = (
    ("lifecycle", "start", {"agent": "bot", "trace_id": "tr-hidden"}),
    ("tool", "call_start", {"tool": "search", "args": {"q": "weather"}}),
    ("assistant", "complete", {"text": "It is sunny."}),
    ("custom.notes", "note", {"n": 1}),
    ("lifecycle", "end", {"status": "completed"}),
)


def seqs(output: str) -> list[int]:
    return [int(line.split()[0]) for line in output.splitlines() if line.strip()]


# -- events tail ----------------------------------------------------------------------------


def test_tail_prints_a_runs_events_after_from_in_order(cli: Cli) -> None:
    publish(cli, "run-1", *SEEDED)
    out = cli("events", "tail", "--run", "run-1").stdout
    assert seqs(out) == [1, 2, 3, 4, 5]
    lines = out.splitlines()
    assert "lifecycle/start" in lines[0]
    assert '{"agent":"bot"}' in lines[0]  # compact, without the trace id
    assert "tr-hidden" not in out
    assert 'tool/call_start  {"tool":"search","args":{"q":"weather"}}' in lines[1]
    assert "custom.notes/note" in lines[3]
    assert re.fullmatch(
        r" +1  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}  lifecycle/start  .*", lines[0]
    )

    assert seqs(cli("events", "tail", "--run", "run-1", "--from", "2").stdout) == [3, 4, 5]
    filtered = cli("events", "tail", "--run", "run-1", "--stream", "tool", "--stream", "lifecycle")
    assert seqs(filtered.stdout) == [1, 2, 5]
    assert seqs(cli("events", "tail", "--run", "run-1", "--limit", "2").stdout) == [4, 5]
    after = cli("events", "tail", "--run", "run-1", "--from", "1", "--limit", "9").stdout
    assert seqs(after) == [2, 3, 4, 5]
    none = cli("events", "tail", "--run", "run-1", "--from", "5").stdout
    assert none.strip() == "No events of run run-1 after seq 5."


def test_tail_json_lines_parse(cli: Cli) -> None:
    publish(cli, "run-1", *SEEDED)
    lines = cli.json_lines("events", "tail", "--run", "run-1", "--from", "1")
    assert [line["seq"] for line in lines] == [2, 3, 4, 5]
    assert lines[0]["run_id"] == "run-1"
    assert (lines[0]["stream"], lines[0]["kind"]) == ("tool", "call_start")
    assert lines[0]["payload"] == {"tool": "search", "args": {"q": "weather"}}
    assert datetime.fromisoformat(lines[0]["ts"]).tzinfo is not None
    # JSON keeps the whole payload; the command's own flag works too.
    first = json.loads(cli("events", "tail", "--run", "run-1", "--json").stdout.splitlines()[0])
    assert first["payload"]["trace_id"] == "tr-hidden"
    assert cli("--json", "events", "tail", "--run", "run-1", "--from", "5").stdout == ""


def test_tail_follow_stops_at_the_end_of_a_finished_run(
    cli: Cli, cli_app: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = finished_run(cli, cli_app)

    async def no_wait(seconds: float) -> None:
        raise AssertionError("a finished run needs no polling")

    monkeypatch.setattr(runtime_cli, "pause", no_wait)
    out = cli("events", "tail", "--run", run_id, "--follow").stdout
    lines = out.splitlines()
    assert "lifecycle/start" in lines[0]
    assert "tool/result" in out
    assert "lifecycle/end" in lines[-1]
    assert '"status":"completed"' in lines[-1]
    assert seqs(out) == list(range(1, len(lines) + 1))

    # Following is the default on a terminal; it stops at the end all the same.
    monkeypatch.setattr(runtime_cli, "stdout_is_terminal", lambda: True)
    assert cli("events", "tail", "--run", run_id).stdout == out
    # --from past the end event: nothing new, and the run is known to be over.
    assert cli("events", "tail", "--run", run_id, "--from", str(len(lines))).stdout == ""
    lines_json = cli.json_lines("events", "tail", "--run", run_id, "--stream", "lifecycle")
    assert lines_json[-1]["kind"] == "end"


def test_tail_follow_polls_until_the_end_event(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    publish(cli, "run-2", SEEDED[0], SEEDED[1])
    waits: list[float] = []
    later = [SEEDED[2], SEEDED[4]]  # one event per poll: the end comes on the second

    async def other_process(seconds: float) -> None:
        waits.append(seconds)
        store = await open_store(cli.url)
        try:
            bus = EventBus(store, TENANT)
            stream, kind, payload = later.pop(0)
            await bus.publish("run-2", stream, kind, payload)
        finally:
            await store.close()

    monkeypatch.setattr(runtime_cli, "pause", other_process)
    out = cli("events", "tail", "--run", "run-2", "--follow", "--interval", "0.2").stdout
    assert seqs(out) == [1, 2, 3, 4]
    assert "lifecycle/end" in out.splitlines()[-1]
    assert waits == [0.2, 0.2]
    assert later == []


def test_tail_without_a_run_shows_recent_runs(cli: Cli, cli_app: ModuleType) -> None:
    done = finished_run(cli, cli_app)
    waiting, _ = start_run(cli, cli_app)
    out = cli("events", "tail").stdout
    assert done in out
    assert waiting in out
    assert "lifecycle/end" in out
    assert "events tail --run ID" in out
    lines = cli.json_lines("events", "tail")
    assert [line["run_id"] for line in lines] == [waiting, done]  # most recently updated first
    assert lines[1]["last_event"]["kind"] == "end"
    assert lines[1]["last_seq"] == lines[1]["last_event"]["seq"]
    assert [line["run_id"] for line in cli.json_lines("events", "tail", "--limit", "1")] == [
        waiting
    ]
    by_stream = cli.json_lines("events", "tail", "--stream", "tool")
    assert by_stream[1]["last_event"]["stream"] == "tool"

    # Following and --from need a run; unknown runs are one error line.
    assert "--follow needs --run" in cli("events", "tail", "--follow", code=2).output
    cli("events", "tail", "--from", "3", code=2)
    missing = cli("events", "tail", "--run", "nope", code=1)
    assert missing.stderr.startswith("error: no run 'nope'")
    assert missing.stdout == ""
    assert cli("events", "tail", "--run", "../x", code=1).stderr.startswith("error: ")


def test_tail_of_an_empty_store(cli: Cli) -> None:
    assert cli("events", "tail").stdout.strip() == "No runs."
    assert cli("--json", "events", "tail").stdout == ""


# -- subagents ------------------------------------------------------------------------------


def register(cli: Cli, *entries: tuple[str, str, str]) -> None:
    """Register (run id, child session id, requester session id) entries."""

    async def work(store: Store) -> None:
        registry = SubagentRegistry(store, TENANT, owner_id="worker-1")
        for run_id, child, requester in entries:
            await registry.register(
                run_id, child_session_id=child, requester_session_id=requester, task=f"do {run_id}"
            )

    cli.api(work)


def entries(cli: Cli, *args: str) -> dict[str, str]:
    return {e["run_id"]: e["status"] for e in cli.json("subagents", "list", *args)["items"]}


def test_subagents_list_filters(cli: Cli) -> None:
    register(cli, ("sub-1", "ses-c1", "ses-p1"), ("sub-2", "ses-c2", "ses-p1"))
    register(cli, ("sub-3", "ses-c3", "ses-p2"))

    async def finish(store: Store) -> None:
        await SubagentRegistry(store, TENANT, owner_id="worker-1").complete("sub-2", "done")

    cli.api(finish)
    out = cli("subagents", "list").stdout
    for text in ("sub-1", "sub-2", "sub-3", "ses-p1", "ses-c3", "worker-1", "do sub-1", "done"):
        assert text in out, text
    assert "heartbeat" in out
    assert entries(cli) == {"sub-1": "running", "sub-2": "completed", "sub-3": "running"}
    assert entries(cli, "--requester", "ses-p1") == {"sub-1": "running", "sub-2": "completed"}
    assert entries(cli, "--status", "running") == {"sub-1": "running", "sub-3": "running"}
    assert entries(cli, "--requester", "ses-p1", "--status", "completed") == {"sub-2": "completed"}
    assert cli("subagents", "list", "--requester", "nobody").stdout.strip() == "No subagent runs."
    cli("subagents", "list", "--status", "bogus", code=2)


def test_subagents_kill_marks_killed_and_cancels_the_run(cli: Cli, cli_app: ModuleType) -> None:
    run_id, session_id = start_run(cli, cli_app)
    register(cli, (run_id, session_id, "ses-parent"))
    out = cli("subagents", "kill", run_id).stdout
    assert f"killed subagent run {run_id}: run cancelled (was waiting_for_approval)" in out
    assert entries(cli) == {run_id: "killed"}
    assert cli.json("runs", "show", run_id)["state"]["status"] == "cancelled"
    events = cli.json_lines("events", "tail", "--run", run_id, "--stream", "lifecycle")
    assert events[-1]["kind"] == "abort"

    again = cli("subagents", "kill", run_id, code=1)
    assert again.stderr.startswith(f"error: subagent run '{run_id}' is already killed")
    unknown = cli("subagents", "kill", "sub-nope", code=1)
    assert unknown.stderr.startswith("error: no subagent run 'sub-nope'")
    assert unknown.stdout == ""


def test_subagents_kill_a_run_another_process_holds(cli: Cli, cli_app: ModuleType) -> None:
    run_id, session_id = start_run(cli, cli_app)
    register(cli, (run_id, session_id, "ses-parent"), ("sub-gone", "ses-x", "ses-parent"))

    async def hold(store: Store) -> None:
        await RunStore(store, TENANT).claim(run_id, "elsewhere:1:abc", ttl=600)

    cli.api(hold)
    out = cli("subagents", "kill", run_id).stdout
    assert "cancel requested" in out
    assert "elsewhere:1:abc" in out
    assert cli.json("runs", "show", run_id)["index"]["cancel_requested"] is True
    assert entries(cli)[run_id] == "killed"
    # An entry whose run is not in the runs index is only marked killed.
    out = cli("subagents", "kill", "sub-gone").stdout
    assert "not in the runs index" in out
    assert entries(cli)["sub-gone"] == "killed"


class SteeredAgent:
    """Steered from the CLI during its first step; finishes with what it saw."""

    name = "steered"

    def __init__(self, cli: Cli) -> None:
        self.cli = cli
        self.steer_output = ""

    async def step(self, run: StepInput) -> Action:
        if run.state.turn == 1:
            # Another "process": the CLI, with its own connection, from another thread.
            args = ("subagents", "steer", run.state.run_id, "Focus on order 7, please.")
            result = await asyncio.to_thread(self.cli, *args)
            self.steer_output = result.stdout
            return Respond([Message.assistant("Working on it.")])
        new: list[JsonValue] = [m.text for m in run.new_input]
        return Finish({"new_input": new}, Message.assistant("Done."))


def test_subagents_steer_reaches_the_running_child(cli: Cli) -> None:
    register(cli, ("run-child", "ses-child", "ses-parent"))
    agent = SteeredAgent(cli)

    async def work(store: Store) -> Any:
        await SessionManager(store, TENANT).create(session_id="ses-child")
        runner = Runner(store, TENANT, [agent])
        result = await runner.start(
            "steered", "Look at my orders.", run_id="run-child", session_id="ses-child"
        )
        messages = await (await SessionManager(store, TENANT).get("ses-child")).messages()
        return result.output, [(m.role, m.text) for m in messages]

    output, messages = cli.api(work)
    assert "steered subagent run run-child: appended to session ses-child" in agent.steer_output
    assert "reads it as new input at its next step" in agent.steer_output
    assert output == {"new_input": ["Focus on order 7, please."]}
    # Appended while step 1 ran, so before that step's reply was written.
    assert messages == [
        ("user", "Look at my orders."),
        ("user", "Focus on order 7, please."),
        ("assistant", "Working on it."),
        ("assistant", "Done."),
    ]


def test_subagents_steer_refusals(cli: Cli, cli_app: ModuleType) -> None:
    asking, asking_session = start_run(cli, cli_app, "asker")
    approving, approving_session = start_run(cli, cli_app, "support")
    register(cli, (asking, asking_session, "ses-p"), (approving, approving_session, "ses-p"))
    register(cli, ("sub-unindexed", "ses-loose", "ses-p"))

    async def messages(store: Store) -> list[tuple[str, str]]:
        session = await SessionManager(store, TENANT).get(asking_session)
        return [(str(m.role), m.text) for m in await session.messages()]

    before = cli.api(messages)
    waiting = cli("subagents", "steer", asking, "hi", code=1)
    assert waiting.stderr.startswith(f"error: run {asking} is waiting for input")
    assert "--input" in waiting.stderr
    approval = cli("subagents", "steer", approving, "hi", code=1)
    assert "waiting for approval" in approval.stderr
    assert cli.api(messages) == before

    unknown = cli("subagents", "steer", "sub-nope", "hi", code=1)
    assert unknown.stderr.startswith("error: no subagent run 'sub-nope'")
    missing_session = cli("subagents", "steer", "sub-unindexed", "hi", code=1)
    assert missing_session.stderr.startswith("error: ")
    cli("subagents", "kill", asking)
    finished = cli("subagents", "steer", asking, "too late", code=1)
    assert "already killed" in finished.stderr
    assert entries(cli) == {asking: "killed", approving: "running", "sub-unindexed": "running"}


# -- lanes ----------------------------------------------------------------------------------


def dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_lanes_show_held_runs_by_session(cli: Cli, cli_app: ModuleType) -> None:
    assert "No session lane is held" in cli("lanes").stdout
    held, held_session = start_run(cli, cli_app)
    gone, gone_session = start_run(cli, cli_app)
    stale, _ = start_run(cli, cli_app)
    free, _ = start_run(cli, cli_app)
    dead_owner = f"{socket.gethostname()}:{dead_pid()}:abc"

    async def claim(store: Store) -> None:
        runs = RunStore(store, TENANT)
        await runs.claim(held, "elsewhere:1:abc", ttl=600)
        await runs.claim(gone, dead_owner, ttl=600)
        await runs.claim(stale, "elsewhere:2:def", ttl=0)

    cli.api(claim)
    out = cli("lanes").stdout
    assert f"session:{held_session}" in out
    assert held in out
    assert "elsewhere:1:abc" in out
    assert "waiting_for_approval" in out
    assert "owner process is gone" in out
    assert f"1 run(s) have an expired lease (not released by its owner): {stale}" in out
    assert free not in out
    assert "CommandLanes.stats()" in out

    data = cli.json("lanes")
    lanes = {lane["lane"]: lane["runs"] for lane in data["lanes"]}
    assert set(lanes) == {f"session:{held_session}", f"session:{gone_session}"}
    [run] = lanes[f"session:{held_session}"]
    assert (run["run_id"], run["owner"], run["owner_alive"]) == (held, "elsewhere:1:abc", True)
    assert 500 < run["lease_left_seconds"] <= 600
    assert run["since_update_seconds"] >= 0
    assert lanes[f"session:{gone_session}"][0]["owner_alive"] is False
    assert [e["run_id"] for e in data["expired_leases"]] == [stale]
    assert "CommandLanes.stats()" in cli("lanes", "--help").stdout


# -- profiles -------------------------------------------------------------------------------


def seed_profiles(cli: Cli) -> None:
    async def work(store: Store) -> None:
        profiles = AuthProfiles(store, TENANT, "support")
        await profiles.add("env:OPENAI_KEY_SECRET_NAME", label="main", profile_id="key-a")
        await profiles.add("vault:kv/openai#key", label="backup", profile_id="key-b")
        await profiles.pick()  # key-a
        await profiles.report_failure("key-a", "429 too many requests", retry_after=600)

    cli.api(work)


def test_profiles_list_hides_secrets_and_shows_cooldowns(cli: Cli) -> None:
    seed_profiles(cli)
    out = cli("profiles", "list", "--agent", "support").stdout
    for text in ("key-a", "key-b", "main", "backup", "env:…", "vault:…", "429 too many requests"):
        assert text in out, text
    assert "(in 9m" in out or "(in 10m" in out
    assert "OPENAI_KEY" not in out
    assert "kv/openai" not in out

    data = cli.json("profiles", "list", "--agent", "support")
    assert data["agent"] == "support"
    by_id = {p["id"]: p for p in data["items"]}
    assert by_id["key-a"]["secret_ref"] == "env:…"
    assert by_id["key-a"]["cooling"] is True
    assert by_id["key-a"]["failure_count"] == 1
    assert by_id["key-a"]["usage_count"] == 1
    assert by_id["key-b"]["cooling"] is False
    assert by_id["key-b"]["usage_count"] == 1  # the failure moved on to key-b
    assert "OPENAI_KEY" not in json.dumps(data)

    empty = cli("profiles", "list", "--agent", "nobody").stdout
    assert empty.strip() == "Agent nobody has no auth profiles."
    cli("profiles", "list", code=2)  # --agent is required


def test_profiles_reset_clears_cooldowns(cli: Cli) -> None:
    seed_profiles(cli)
    out = cli("profiles", "reset", "--agent", "support", "key-a").stdout
    assert "reset profile key-a of agent support: cleared 1 cooldown(s) and 1 failure(s)" in out
    items = cli.json("profiles", "list", "--agent", "support")["items"]
    key_a = next(p for p in items if p["id"] == "key-a")
    assert (key_a["cooling"], key_a["cooldown_until"], key_a["failure_count"]) == (False, None, 0)
    assert key_a["failure_reason"] is None

    async def fail_both(store: Store) -> None:
        profiles = AuthProfiles(store, TENANT, "support")
        await profiles.report_failure("key-a", "429", retry_after=60)
        with pytest.raises(AllProfilesCoolingDownError):
            await profiles.report_failure("key-b", "429", retry_after=60)

    cli.api(fail_both)
    out = cli("profiles", "reset", "--agent", "support").stdout
    assert "reset 2 profile(s) of agent support: cleared 2 cooldown(s) and 2 failure(s)" in out
    items = cli.json("profiles", "list", "--agent", "support")["items"]
    assert [(p["failure_count"], p["cooling"]) for p in items] == [(0, False), (0, False)]

    unknown = cli("profiles", "reset", "--agent", "support", "key-z", code=1)
    assert unknown.stderr.startswith("error: no auth profile 'key-z'")
    nobody = cli("profiles", "reset", "--agent", "nobody", code=1)
    assert nobody.stderr.startswith("error: agent 'nobody' has no auth profiles")


def test_tail_follow_of_a_run_not_started_yet_waits_for_it(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    later = [SEEDED[0], SEEDED[1], SEEDED[2], SEEDED[4]]

    async def run_starts_meanwhile(seconds: float) -> None:
        store = await open_store(cli.url)
        try:
            stream, kind, payload = later.pop(0)
            await EventBus(store, TENANT).publish("run-late", stream, kind, payload)
        finally:
            await store.close()

    monkeypatch.setattr(runtime_cli, "pause", run_starts_meanwhile)
    result = cli("events", "tail", "--run", "run-late", "--follow")
    assert "waiting for run run-late to start" in result.stderr
    assert seqs(result.stdout) == [1, 2, 3, 4]
    assert "lifecycle/end" in result.stdout.splitlines()[-1]
    # Without --follow a run that does not exist is still an error naming the fix.
    missing = cli("events", "tail", "--run", "run-none", code=1)
    assert "no run 'run-none'" in missing.output
    assert "--follow" in missing.output
