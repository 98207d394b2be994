"""``statekeeper runs start`` and ``statekeeper runs followup``: start a run of an app's
agent with input, and send a follow-up to a run (what the console's "New run" form and
the run page's follow-up box do through the server)."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.text import Text

from statekeeper.cli._common import JsonFlag, console, fail, message_text, print_json, run
from statekeeper.cli.runs import AppSpec, RunId, load_app, make_runner
from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits, TimeFlag, TokenFlag
from statekeeper.errors import StatekeeperError
from statekeeper.runs.results import RunResult
from statekeeper.runs.steering import check_session_idle, plan_followup
from statekeeper.stores import Store

__all__ = ["followup", "start"]


@dataclass
class _Outcome:
    outcome: str
    mode: str | None
    result: RunResult


async def _drive(work: Coroutine[Any, Any, RunResult], what: str) -> RunResult:
    try:
        return await work
    except StatekeeperError:
        raise
    except Exception as exc:  # the agent or a tool failed: the run recorded it as ERROR
        fail(f"{what} failed: {type(exc).__name__}: {exc}")


def _limits(
    iterations: int | None, budget: float | None, tokens: int | None, seconds: float | None
) -> Limits | None:
    if iterations is None and budget is None and tokens is None and seconds is None:
        return None
    limits = Limits()
    if iterations is not None:
        limits.iterations = IterationFlag(maximum=iterations)
    if budget is not None:
        limits.budget = BudgetFlag(maximum=budget)
    if tokens is not None:
        limits.tokens = TokenFlag(maximum=tokens)
    if seconds is not None:
        limits.time = TimeFlag(maximum=seconds)
    return limits


def _report(done: _Outcome, json_output: bool, ctx: typer.Context) -> None:
    from statekeeper.cli._common import wants_json

    result = done.result
    if wants_json(ctx, json_output):
        print_json(
            {
                "outcome": done.outcome,
                "mode": done.mode,
                "run_id": result.run_id,
                "session_id": result.state.session_id,
                "status": result.status,
                "output": result.output,
                "new_messages": [m.to_dict() for m in result.new_messages],
                "interruptions": [i.model_dump(mode="json") for i in result.interruptions],
            }
        )
        return
    out = console()
    out.print(Text(f"run {result.run_id} ({done.outcome}): {result.status}"))
    for message in result.new_messages:
        out.print(Text(f"  {message.role}: {message_text(message)}"))
    for item in result.interruptions:
        out.print(Text(f"waiting for approval of {item.call_id} {item.tool}({item.arguments})"))
    if result.output is not None:
        out.print(Text(f"output: {json.dumps(result.output, ensure_ascii=False)}"))


def start(
    ctx: typer.Context,
    agent: Annotated[str, typer.Argument(help="The app's agent to run.", show_default=False)],
    input_text: Annotated[
        str, typer.Argument(metavar="INPUT", help="The user's input.", show_default=False)
    ],
    app_spec: AppSpec,
    title: Annotated[str | None, typer.Option(help="The new session's title.")] = None,
    session_id: Annotated[
        str | None, typer.Option("--session", help="Run on this session (default: a new one).")
    ] = None,
    iterations: Annotated[int | None, typer.Option(min=1, help="Most steps.")] = None,
    budget: Annotated[float | None, typer.Option(min=0, help="Most spend.")] = None,
    tokens: Annotated[int | None, typer.Option(min=1, help="Most tokens.")] = None,
    seconds: Annotated[float | None, typer.Option(min=0, help="Most wall time (s).")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Start a run of AGENT with INPUT and drive it until it stops (finished, waiting for
    approval or input, or at a limit)."""
    factory = load_app(app_spec)
    if not input_text.strip():
        fail("INPUT is empty: give the run something to do")

    async def work(store: Store, tenant: str) -> _Outcome:
        runner = await make_runner(factory, app_spec, store, tenant)
        limits = _limits(iterations, budget, tokens, seconds)
        if session_id is not None:
            await check_session_idle(runner, session_id)
        started = runner.start(agent, input_text, session_id=session_id, title=title, limits=limits)
        return _Outcome("started", None, await _drive(started, f"the run of {agent}"))

    _report(run(ctx, work, create=True), json_output, ctx)


def followup(
    ctx: typer.Context,
    run_id: RunId,
    text: Annotated[str, typer.Argument(help="The follow-up message.", show_default=False)],
    app_spec: AppSpec,
    mode: Annotated[
        str,
        typer.Option(
            help="steer (into a running run's next step) or queue (after it stops); a "
            "stopped run resumes with the text either way."
        ),
    ] = "steer",
    json_output: JsonFlag = False,
) -> None:
    """Send a follow-up to a run: a paused run or one waiting for input resumes with it; a
    finished one goes on in a fork of its last checkpoint. A running run is driven by
    another process: send it there (its server's POST /api/v1/runs/RUN/followups)."""
    factory = load_app(app_spec)
    if not text.strip():
        fail("TEXT is empty: give the follow-up something to say")

    async def work(store: Store, tenant: str) -> _Outcome:
        runner = await make_runner(factory, app_spec, store, tenant)
        plan = await plan_followup(runner, run_id, text, mode)
        if plan.work is None:  # not reached from here: plan_followup refuses a running run
            fail(f"run {run_id}: the follow-up was {plan.outcome}")
        result = await _drive(plan.work, f"run {plan.run_id}")
        return _Outcome(plan.outcome, plan.mode, result)

    _report(run(ctx, work), json_output, ctx)
