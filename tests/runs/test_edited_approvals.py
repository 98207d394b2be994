"""Approving a held tool call with edited arguments (`Runner.approve(..., arguments=...)`),
and a rejection's reason reaching the model as the call's result.

The decision stays bound to the call it answers (its id, tool and own arguments) and
records the edit; the tool runs with the edited arguments; the transcript keeps the
model's call as made and a result that says what ran.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from statekeeper.cli import app as cli_app
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.errors import ConflictError, InvalidInputError
from statekeeper.runs import Finish, Respond, Runner, Tool, ToolContext
from statekeeper.runs.agent import StepInput
from statekeeper.runs.approvals import MAX_EDITED_ARGUMENTS, settle
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runs.state import ApprovalDecision
from statekeeper.stores import Store, open_store

RAN: list[dict[str, Any]] = []


async def wire(args: dict[str, Any], ctx: ToolContext) -> str:
    RAN.append(args)
    return f"sent {args['amount']} to {args['to']}"


class Seen:
    """What the model saw at its second step: the held call's result."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def __call__(self, run: StepInput) -> Finish:
        self.messages = list(run.messages)
        return Finish("done")


def make_runner(store: Store, seen: Seen) -> Runner:
    call = ToolCallBlock(id="pay-1", name="wire", arguments='{"amount": 900, "to": "acme"}')
    agent = ScriptedAgent(
        "payer", [Respond([Message.assistant("paying", tool_calls=[call])]), seen]
    )
    return Runner(store, "t", [agent], [Tool("wire", wire, requires_approval=True)])


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


async def test_an_approval_with_edited_arguments_runs_the_tool_with_them(store: Store) -> None:
    seen = Seen()
    runner = make_runner(store, seen)
    run_id = (await runner.start("payer", "pay")).run_id

    waiting = await runner.approve(
        run_id, "pay-1", arguments={"amount": 90, "to": "acme"}, by="alice", reason="typo"
    )
    decision = waiting.decisions[0]
    # Bound to the call as the model made it, and recording the edit.
    assert decision.arguments == '{"amount": 900, "to": "acme"}'
    assert json.loads(decision.edited_arguments or "") == {"amount": 90, "to": "acme"}
    assert (decision.approved, decision.decided_by, decision.reason) == (True, "alice", "typo")
    assert settle(waiting).edits == {"pay-1": decision.edited_arguments}

    done = await runner.resume(run_id)
    assert done.status == "completed"
    assert RAN == [{"amount": 90, "to": "acme"}]  # what ran: the edited arguments

    state = await runner.load(run_id)
    kept = state.settled_decisions[0]
    assert kept.edited_arguments == decision.edited_arguments
    # The transcript: the model's own call, then a result of what actually ran.
    assistant, result = seen.messages[-2:]
    assert assistant.tool_calls[0].arguments == '{"amount": 900, "to": "acme"}'
    text = result.tool_results[0].content
    assert text.endswith("sent 90 to acme")
    assert "edited the arguments" in text
    assert '"amount": 90' in text
    assert result.metadata["edited_arguments"] == decision.edited_arguments
    assert result.metadata["original_arguments"] == '{"amount": 900, "to": "acme"}'
    assert result.metadata["edited_by"] == "alice"


async def test_arguments_as_json_text_and_unchanged_arguments_are_no_edit(store: Store) -> None:
    runner = make_runner(store, Seen())
    run_id = (await runner.start("payer", "pay")).run_id

    state = await runner.approve(run_id, "pay-1", arguments='{"to": "acme", "amount": 900}')
    assert state.decisions[0].edited_arguments is None  # the same object: a plain approval
    await runner.resume(run_id)
    assert RAN == [{"amount": 900, "to": "acme"}]


async def test_a_rejection_reason_is_the_result_the_model_gets(store: Store) -> None:
    seen = Seen()
    runner = make_runner(store, seen)
    run_id = (await runner.start("payer", "pay")).run_id

    await runner.reject(run_id, "pay-1", reason="ask the customer first", by="bob")
    await runner.resume(run_id)

    assert RAN == []
    result = seen.messages[-1].tool_results[0]
    assert result.tool_call_id == "pay-1"
    assert result.is_error
    assert result.content == "Tool call rejected: ask the customer first"


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON list"),
        ('"text"', "JSON str"),
        ('{"amount": NaN}', "not valid JSON"),
        (42, "are a int"),
        ({"x": object()}, "cannot be written as JSON"),
        ({"x": "a" * MAX_EDITED_ARGUMENTS}, "bytes, more than"),
    ],
)
async def test_bad_edited_arguments_are_refused_and_nothing_is_saved(
    store: Store, arguments: Any, says: str
) -> None:
    runner = make_runner(store, Seen())
    run_id = (await runner.start("payer", "pay")).run_id
    before = await runner.load(run_id)

    with pytest.raises(InvalidInputError, match=says) as caught:
        await runner.approve(run_id, "pay-1", arguments=arguments)

    assert "pay-1" in str(caught.value)
    after = await runner.load(run_id)
    assert after.decisions == []
    assert after.revision == before.revision


async def test_edits_go_with_approvals_only_and_cannot_change_afterwards(store: Store) -> None:
    runner = make_runner(store, Seen())
    run_id = (await runner.start("payer", "pay")).run_id

    with pytest.raises(InvalidInputError, match="approval only"):
        await runner.approvals.decide(run_id, "pay-1", approved=False, arguments={"a": 1})

    first = await runner.approve(run_id, "pay-1", arguments={"amount": 1, "to": "acme"})
    again = await runner.approve(run_id, "pay-1", arguments='{"amount": 1, "to": "acme"}')
    assert again.decisions == first.decisions  # the same decision: nothing changes
    with pytest.raises(ConflictError, match="already approved with the arguments"):
        await runner.approve(run_id, "pay-1", arguments={"amount": 2, "to": "acme"})
    with pytest.raises(ConflictError, match="already approved"):
        await runner.approve(run_id, "pay-1")


async def test_decisions_that_disagree_on_the_edit_fail_closed(store: Store) -> None:
    runner = make_runner(store, Seen())
    run_id = (await runner.start("payer", "pay")).run_id
    state = await runner.approve(run_id, "pay-1", arguments={"amount": 1, "to": "acme"})
    other = state.decisions[0].model_copy(update={"edited_arguments": '{"amount": 2}'})
    state.decisions = [*state.decisions, ApprovalDecision.model_validate(other.model_dump())]

    settled = settle(state)

    assert settled.approved == []
    assert settled.edits == {}
    assert "ambiguous" in settled.rejected[0][1]


def test_the_cli_approves_with_edited_arguments_and_runs_show_prints_the_edit(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/state.db"

    async def started() -> str:
        async with await open_store(url) as store:
            return (await make_runner(store, Seen()).start("payer", "pay")).run_id

    async def resumed(run_id: str) -> None:
        async with await open_store(url) as store:
            await make_runner(store, Seen()).resume(run_id)

    run_id = asyncio.run(started())
    base = ["--store", url, "--tenant", "t", "runs"]
    invoke = CliRunner().invoke
    bad = invoke(cli_app, [*base, "approve", run_id, "pay-1", "--arguments", "[1]"])
    assert bad.exit_code != 0
    assert "JSON object" in bad.output
    edited = '{"amount": 50, "to": "acme"}'
    approved = invoke(
        cli_app, [*base, "approve", run_id, "pay-1", "--arguments", edited, "--by", "carol"]
    )
    assert approved.exit_code == 0, approved.output
    assert "edited arguments" in approved.stdout
    waiting = invoke(cli_app, [*base, "show", run_id])
    assert "approved with edited arguments" in waiting.stdout
    asyncio.run(resumed(run_id))
    assert RAN == [{"amount": 50, "to": "acme"}]

    shown = invoke(cli_app, [*base, "show", run_id])
    assert shown.exit_code == 0, shown.output
    assert "approved with edits" in shown.stdout
    assert '"amount": 50' in shown.stdout
    as_json = invoke(cli_app, ["--store", url, "--tenant", "t", "--json", "runs", "show", run_id])
    [kept] = json.loads(as_json.stdout)["state"]["settled_decisions"]
    assert (kept["decided_by"], kept["edited_arguments"]) == ("carol", edited)
