"""``statekeeper runs history`` and ``runs fork``: a run's checkpoints, and new runs from them."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    JsonFlag,
    console,
    fail,
    message_text,
    print_json,
    run,
    stamp,
    wants_json,
)
from statekeeper.cli.runs import load_app, make_runner
from statekeeper.errors import StatekeeperError
from statekeeper.jsoncodec import MAX_JSON_DEPTH
from statekeeper.runs.history import CheckpointInfo
from statekeeper.runs.runner import RunResult
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunStore
from statekeeper.stores import Store

__all__ = ["fork", "history"]

RunId = Annotated[str, typer.Argument(help="The run id.", show_default=False)]


def history(ctx: typer.Context, run_id: RunId, json_output: JsonFlag = False) -> None:
    """List a run's checkpoints: step, turn, status, time and what each step added.

    Fork the run from any of them with `statekeeper runs fork RUN --at STEP`.
    """

    async def work(store: Store, tenant: str) -> list[CheckpointInfo]:
        return await RunStore(store, tenant).history(run_id)

    rows = run(ctx, work)
    if wants_json(ctx, json_output):
        print_json({"run_id": run_id, "items": [info.to_json() for info in rows]})
        return
    out = console()
    if not rows:
        out.print(Text(f"Run {run_id} has no checkpoints (none written yet, or pruned)."))
        return
    table = Table(title=f"Checkpoints of run {run_id}")
    for column in ("step", "turn", "status", "agent", "written (UTC)", "added", "cost"):
        right = column in ("step", "turn", "cost")
        table.add_column(column, justify="right" if right else "left", overflow="fold")
    for info in rows:
        added = f"{info.message_count} message(s)"
        if info.added:
            added += ": " + ", ".join(info.added)
        table.add_row(
            str(info.step),
            "" if info.turn is None else str(info.turn),
            Text(info.status, style="red" if info.corrupt else ""),
            Text(info.agent or ""),
            stamp(info.at),
            Text(info.corrupt or added),
            f"{info.cost:.6f}",
        )
    out.print(table)


At = Annotated[
    int | None,
    typer.Option(
        "--at",
        min=1,
        metavar="STEP",
        help="The checkpoint to fork from (a step of `runs history`; default: the newest "
        "one that is not finished).",
    ),
]
StateJson = Annotated[
    str | None,
    typer.Option(
        "--state",
        metavar="JSON",
        help='Run state fields to change in the new run, e.g. \'{"metadata": {"x": 1}}\'.',
    ),
]
OptionalApp = Annotated[
    str | None,
    typer.Option(
        "--app",
        metavar="MODULE:ATTR",
        help="Also run the new run now, with this (store, tenant) -> Runner factory.",
    ),
]


def _state_update(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"--state is not valid JSON: {exc}") from None
    except RecursionError:
        raise typer.BadParameter(f"--state nests deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("--state must be a JSON object of run state fields")
    return value


async def _fork_and_run(
    spec: str, store: Store, tenant: str, run_id: str, options: dict[str, Any]
) -> RunResult:
    runner = await make_runner(load_app(spec), spec, store, tenant)
    try:
        return await runner.fork(run_id, **options)
    except StatekeeperError:
        raise
    except Exception as exc:  # the agent or a tool failed: the new run recorded it as ERROR
        fail(f"the fork of run {run_id} failed: {type(exc).__name__}: {exc}")


def fork(
    ctx: typer.Context,
    run_id: RunId,
    at: At = None,
    new_run_id: Annotated[str | None, typer.Option("--run-id", help="The new run's id.")] = None,
    title: Annotated[str | None, typer.Option(help="Title of the forked session.")] = None,
    state: StateJson = None,
    app_spec: OptionalApp = None,
    input_text: Annotated[
        str | None, typer.Option("--input", help="New user input (needs --app).")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Fork a run from a past checkpoint into a new run on a forked session.

    Nothing is copied: the new session reads the shared history from the run's session.
    Without --app the new run is only created (stopped); resume it later with
    `statekeeper runs resume NEW --app ...`.
    """
    update = _state_update(state)
    if input_text is not None and app_spec is None:
        fail(
            "--input needs --app (the new run must run to take it); or fork without --input "
            "and pass it to `statekeeper runs resume NEW --app ... --input ...`"
        )
    options: dict[str, Any] = {"at": at, "state_update": update, "new_run_id": new_run_id}
    options["title"] = title

    async def work(store: Store, tenant: str) -> RunState | RunResult:
        if app_spec is None:
            return await RunStore(store, tenant).fork(run_id, **options)
        new_input = input_text if input_text is not None else ()
        return await _fork_and_run(app_spec, store, tenant, run_id, {**options, "input": new_input})

    made = run(ctx, work)
    result = made if isinstance(made, RunResult) else None
    new_state = made.state if isinstance(made, RunResult) else made
    _print_fork(ctx, run_id, new_state, result, json_output=json_output)


def _print_fork(
    ctx: typer.Context,
    run_id: str,
    state: RunState,
    result: RunResult | None,
    *,
    json_output: bool,
) -> None:
    origin = state.metadata.get("forked_from")
    step = origin.get("step") if isinstance(origin, dict) else None
    if wants_json(ctx, json_output):
        data: dict[str, Any] = {
            "run_id": state.run_id,
            "session_id": state.session_id,
            "status": state.status,
            "forked_from": {"run_id": run_id, "step": step},
        }
        if result is not None:
            data["output"] = result.output
            data["new_messages"] = [m.to_dict() for m in result.new_messages]
        print_json(data)
        return
    out = console()
    out.print(
        Text(
            f"forked run {run_id} at step {step} into run {state.run_id} "
            f"(session {state.session_id}): {state.status}"
        )
    )
    if result is None:
        out.print(Text(f"resume it with `statekeeper runs resume {state.run_id} --app ...`"))
        return
    for message in result.new_messages:
        out.print(Text(f"{message.role}: ").append(message_text(message)))
    if result.output is not None:
        out.print(Text(f"output: {json.dumps(result.output, ensure_ascii=False)}"))
