"""Who approved what is kept once the run settles its calls: `RunState.settled_decisions`
(and `decision_history`), `RunInspector.decisions`, ``runs show`` and the server's run
view (they showed ``decisions: []`` once the run completed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from asgi_client import served
from statekeeper.cli import app as cli_app
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.runs import Finish, Respond, Runner, Tool, ToolContext
from statekeeper.runs.inspect import RunInspector
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.server import ApiKeys
from statekeeper.stores import Store, open_store


async def wire(args: dict[str, object], ctx: ToolContext) -> str:
    return f"sent {args['amount']}"


async def look(args: dict[str, object], ctx: ToolContext) -> str:
    return "found"


def calls(*made: tuple[str, str, str]) -> Respond:
    blocks = [ToolCallBlock(id=i, name=n, arguments=a) for i, n, a in made]
    return Respond([Message.assistant("calling", tool_calls=blocks)])


def make_runner(store: Store) -> Runner:
    payer = ScriptedAgent(
        "payer",
        [
            calls(
                ("pay-1", "wire", '{"amount": 9}'),
                ("look-1", "look", "{}"),
                ("pay-1b", "wire", '{"amount": 1}'),
            ),
            calls(("pay-2", "wire", '{"amount": 5}')),
            Finish("paid"),
        ],
    )
    tools = [Tool("wire", wire, requires_approval=True), Tool("look", look)]
    return Runner(store, "t", [payer], tools)


async def pay(runner: Runner) -> str:
    """A run whose first call alice approves (always): the other wire call of that message
    is approved by that rule, the look call by policy (it needs no approval); the later
    wire call is never held (the rule covers it)."""
    result = await runner.start("payer", "pay")
    assert result.status == "waiting_for_approval"
    await runner.approve(result.run_id, "pay-1", always=True, reason="invoice ok", by="alice")
    done = await runner.resume(result.run_id)
    assert done.status == "completed"
    return result.run_id


async def test_settled_decisions_are_kept_after_the_run_completes(store: Store) -> None:
    runner = make_runner(store)
    run_id = await pay(runner)

    state = await runner.load(run_id)
    assert state.decisions == []  # nothing pending any more
    kept = [(d.call_id, d.tool, d.approved, d.decided_by) for d in state.settled_decisions]
    assert kept == [
        ("pay-1", "wire", True, "alice"),
        ("look-1", "look", True, "policy"),
        ("pay-1b", "wire", True, "always rule"),
    ]
    alice = state.settled_decisions[0]
    assert (alice.reason, alice.always, alice.arguments) == ("invoice ok", True, '{"amount": 9}')
    assert state.decision_history == state.settled_decisions
    assert await RunInspector(runner.runs, run_id).decisions() == state.settled_decisions


async def test_a_rejection_is_kept_too(store: Store) -> None:
    runner = make_runner(store)
    result = await runner.start("payer", "pay")
    await runner.reject(result.run_id, "pay-1", reason="no invoice", by="bob")
    await runner.reject(result.run_id, "pay-1b", by="bob")
    pending = await runner.load(result.run_id)
    assert [d.call_id for d in pending.decision_history] == ["look-1", "pay-1", "pay-1b"]
    await runner.resume(result.run_id)  # the agent's next call waits again
    state = await runner.load(result.run_id)
    rejected = state.settled_decisions[0]
    assert (rejected.call_id, rejected.approved, rejected.decided_by) == ("pay-1", False, "bob")
    assert rejected.reason == "no invoice"
    assert [d.call_id for d in state.decision_history] == ["pay-1", "look-1", "pay-1b"]


def test_runs_show_prints_the_settled_decisions(tmp_path: Path) -> None:
    import asyncio

    url = f"sqlite:///{tmp_path}/state.db"

    async def work() -> str:
        async with await open_store(url) as store:
            return await pay(make_runner(store))

    run_id = asyncio.run(work())
    invoke = CliRunner().invoke
    shown = invoke(cli_app, ["--store", url, "--tenant", "t", "--json", "runs", "show", run_id])
    assert shown.exit_code == 0, shown.output
    kept = json.loads(shown.stdout)["state"]["settled_decisions"]
    assert (kept[0]["call_id"], kept[0]["decided_by"]) == ("pay-1", "alice")
    text = invoke(cli_app, ["--store", url, "--tenant", "t", "runs", "show", run_id])
    assert text.exit_code == 0, text.output
    assert "Approval decisions" in text.stdout
    assert "alice" in text.stdout
    assert "invoice ok" in text.stdout


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Store]]:
    url = f"sqlite:///{tmp_path}/state.db"
    async with await open_store(url) as store:
        _, key = await ApiKeys(store).create("t", "read", label="viewer")
        async with served(url, key) as client:
            yield client, store


async def test_the_server_run_view_lists_decisions_after_completion(
    server: tuple[httpx.AsyncClient, Store],
) -> None:
    client, store = server
    run_id = await pay(make_runner(store))
    detail = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert detail["status"] == "completed"
    decided = [(d["call_id"], d["approved"], d["decided_by"]) for d in detail["decisions"]]
    assert decided == [
        ("pay-1", True, "alice"),
        ("look-1", True, "policy"),
        ("pay-1b", True, "always rule"),
    ]
