"""``statekeeper runs ...``: list, show, approve, reject, resume, cancel, delete, export,
import."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    FINISHED_RUNS,
    JsonFlag,
    OutputFile,
    YesFlag,
    confirm_delete,
    console,
    fail,
    message_text,
    print_corrupt,
    print_json,
    read_input,
    report_deleted,
    run,
    wants_json,
    write_output,
)
from statekeeper.cli.runview import RunView, print_run, recoveries, runs_table, timeline
from statekeeper.errors import (
    InvalidInputError,
    NotFoundError,
    StatekeeperError,
    StoreCorruptError,
)
from statekeeper.runs.approvals import settle
from statekeeper.runs.index import RunList, started_view
from statekeeper.runs.operations import build_runner, load_factory, status_filter
from statekeeper.runs.runner import Runner, RunResult
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.stores import Store

__all__ = ["app"]

app = typer.Typer(
    help="List and inspect runs; approve, reject, resume, raise limits, cancel, export, "
    "import; history and fork (time travel).",
    no_args_is_help=True,
)

RunId = Annotated[str, typer.Argument(help="The run id.", show_default=False)]
CallId = Annotated[str, typer.Argument(help="The pending tool call id.", show_default=False)]
Reason = Annotated[str | None, typer.Option(help="Why (kept with the decision).")]
DecidedBy = Annotated[str | None, typer.Option("--by", help="Who decides (default: cli).")]
RejectReason = Annotated[
    str | None,
    typer.Option(
        "--reason",
        help="A message to the model: it gets 'Tool call rejected: <reason>' as the result.",
    ),
]
EditedArguments = Annotated[
    str | None,
    typer.Option(
        "--arguments",
        metavar="JSON",
        help="Approve with these edited arguments (a JSON object): the tool runs with them.",
    ),
]


@app.command("list")
def list_runs(
    ctx: typer.Context,
    status: Annotated[
        str | None, typer.Option(help="Only runs in this status (e.g. waiting_for_approval).")
    ] = None,
    session: Annotated[str | None, typer.Option(help="Only runs over this session id.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs.")] = 100,
    json_output: JsonFlag = False,
) -> None:
    """List runs, oldest first."""
    wanted = status_filter(status)

    async def work(store: Store, tenant: str) -> RunList:
        return await RunStore(store, tenant).list(status=wanted, session_id=session, limit=limit)

    runs = run(ctx, work, read_only=True)
    if wants_json(ctx, json_output):
        items = [index.model_dump(mode="json") for index in runs]
        corrupt = [item.model_dump(mode="json") for item in runs.corrupt]
        print_json({"items": items, "corrupt": corrupt})
        return
    out = console()
    if runs:
        out.print(runs_table(runs))
    elif not runs.corrupt:
        out.print("No runs.")
    print_corrupt(out, "run index", runs.corrupt)


@app.command("show")
def show(ctx: typer.Context, run_id: RunId, json_output: JsonFlag = False) -> None:
    """Show a run: status, approvals, tool use, cost, errors and its status timeline."""

    async def work(store: Store, tenant: str) -> RunView:
        runs = RunStore(store, tenant)
        index, _ = await runs.index(run_id)
        state: RunState | None = None
        try:  # the same roll-forward (and corrupt-checkpoint fallback) as loading
            loaded = await runs.load_latest(run_id)
            index, state = loaded.index, loaded.state
        except NotFoundError:
            if index.revision != 0:
                raise
        return RunView(index, state, await store.read_events(tenant, run_id))

    view = run(ctx, work)
    if wants_json(ctx, json_output):
        print_json(
            {
                "index": view.index.model_dump(mode="json"),
                "state": view.state.checkpoint_data() if view.state else None,
                "timeline": timeline(view.events),
                "recovery": recoveries(view.events),
            }
        )
        return
    print_run(view)


def _runner(store: Store, tenant: str) -> Runner:
    """A runner without agents: enough to decide approvals and to cancel."""
    return Runner(store, tenant, agents=[])


def _decided(state: RunState, run_id: str, call_id: str, verb: str) -> None:
    out = console()
    tool = next((i.tool for i in state.interruptions if i.call_id == call_id), "?")
    out.print(Text(f"{verb} tool call {call_id} ({tool}) of run {run_id}"))
    edit = next((d.edited_arguments for d in state.decisions if d.call_id == call_id), None)
    if edit is not None:
        out.print(Text(f"it will run with the edited arguments {edit}"))
    pending = settle(state).pending
    if pending:
        ids = ", ".join(i.call_id for i in pending)
        out.print(Text(f"{len(pending)} call(s) still wait for a decision: {ids}"))
    else:
        out.print(
            Text(f"every call is decided: resume with `statekeeper runs resume {run_id} --app ...`")
        )


@app.command("approve")
def approve(
    ctx: typer.Context,
    run_id: RunId,
    call_id: CallId,
    always: Annotated[
        bool, typer.Option("--always", help="Also approve every later call of this tool.")
    ] = False,
    reason: Reason = None,
    by: DecidedBy = None,
    arguments: EditedArguments = None,
) -> None:
    """Approve a tool call a run is waiting on (``--arguments``: with edited arguments)."""

    async def work(store: Store, tenant: str) -> RunState:
        return await _runner(store, tenant).approve(
            run_id, call_id, always=always, reason=reason, by=by or "cli", arguments=arguments
        )

    _decided(run(ctx, work), run_id, call_id, "approved")


@app.command("reject")
def reject(
    ctx: typer.Context,
    run_id: RunId,
    call_id: CallId,
    reason: RejectReason = None,
    always: Annotated[
        bool, typer.Option("--always", help="Also reject every later call of this tool.")
    ] = False,
    by: DecidedBy = None,
) -> None:
    """Reject a tool call a run is waiting on (the model gets the rejection, with
    ``--reason``, as the call's result)."""

    async def work(store: Store, tenant: str) -> RunState:
        return await _runner(store, tenant).reject(
            run_id, call_id, always=always, reason=reason, by=by or "cli"
        )

    _decided(run(ctx, work), run_id, call_id, "rejected")


def _check_app(value: str | None) -> str | None:
    if value is not None:
        module, sep, attr = value.partition(":")
        if not (module and sep and attr):
            raise typer.BadParameter(
                f"{value!r} is not MODULE:ATTR (e.g. myapp.agents:make_runner)"
            )
    return value


def load_app(spec: str) -> Callable[..., Any]:
    """Import the ``MODULE:ATTR`` runner factory (the current directory is importable)."""
    try:
        return load_factory(spec)
    except InvalidInputError as exc:
        fail(str(exc))


async def make_runner(factory: Callable[..., Any], spec: str, store: Store, tenant: str) -> Runner:
    """Call the ``--app`` factory; anything but a Runner is a clear error, not a traceback."""
    try:
        return await build_runner(factory, spec, store, tenant)
    except InvalidInputError as exc:
        fail(str(exc))


@dataclass
class _Resumed:
    before: str
    result: RunResult


AppSpec = Annotated[
    str,
    typer.Option(
        "--app",
        envvar="STATEKEEPER_APP",
        callback=_check_app,
        metavar="MODULE:ATTR",
        help="A function (store, tenant) -> Runner that knows the agents and tools.",
        show_default=False,
    ),
]
InputText = Annotated[
    str | None, typer.Option("--input", help="New user input (a run waiting for input).")
]
TakeOver = Annotated[
    bool,
    typer.Option(
        "--take-over",
        help="Resume even if another live process holds the run (you know it is gone).",
    ),
]


async def _resume(
    factory: Callable[..., Any],
    store: Store,
    tenant: str,
    *,
    run_id: str,
    app_spec: str,
    input_text: str | None,
    take_over: bool,
) -> _Resumed:
    runner = await make_runner(factory, app_spec, store, tenant)
    before = (await runner.load(run_id)).status
    if before == "waiting_for_input" and not input_text:
        # Checked here too: the runner takes the run's lease before it checks this.
        fail(f"run {run_id} is waiting for input; pass --input TEXT to resume it")
    try:
        new_input = input_text if input_text is not None else ()
        result = await runner.resume(run_id, new_input, take_over=take_over)
    except StatekeeperError:
        raise
    except Exception as exc:  # the agent or a tool failed: the run recorded it as ERROR
        fail(f"run {run_id} failed: {type(exc).__name__}: {exc}")
    return _Resumed(before, result)


def _resumed_json(resumed: _Resumed) -> dict[str, Any]:
    result = resumed.result
    return {
        "run_id": result.run_id,
        "previous_status": resumed.before,
        "status": result.status,
        "output": result.output,
        "new_messages": [m.to_dict() for m in result.new_messages],
        "interruptions": [i.model_dump(mode="json") for i in result.interruptions],
    }


def _print_resumed(resumed: _Resumed) -> None:
    result = resumed.result
    out = console()
    out.print(Text(f"run {result.run_id}: {resumed.before} -> {result.status}"))
    if result.new_messages:
        table = Table(title=f"{len(result.new_messages)} new message(s)")
        table.add_column("role")
        table.add_column("content", overflow="fold")
        for message in result.new_messages:
            table.add_row(str(message.role), message_text(message))
        out.print(table)
    for item in result.interruptions:
        prompt = f": {item.prompt}" if item.prompt else ""
        out.print(
            Text(f"waiting for approval of {item.call_id} {item.tool}({item.arguments}){prompt}")
        )
    if result.output is not None:
        out.print(Text(f"output: {json.dumps(result.output, ensure_ascii=False)}"))


@app.command("resume")
def resume(
    ctx: typer.Context,
    run_id: RunId,
    app_spec: AppSpec,
    input_text: InputText = None,
    take_over: TakeOver = False,
    json_output: JsonFlag = False,
) -> None:
    """Resume a stopped run from its last checkpoint with the app's agents and tools."""
    factory = load_app(app_spec)

    async def work(store: Store, tenant: str) -> _Resumed:
        return await _resume(
            factory,
            store,
            tenant,
            run_id=run_id,
            app_spec=app_spec,
            input_text=input_text,
            take_over=take_over,
        )

    resumed = run(ctx, work)
    if wants_json(ctx, json_output):
        print_json(_resumed_json(resumed))
    else:
        _print_resumed(resumed)


@app.command("cancel")
def cancel(
    ctx: typer.Context,
    run_id: RunId,
    reason: Annotated[str | None, typer.Option(help="Why the run is cancelled.")] = None,
) -> None:
    """Cancel a run: a stopped one at once, a running one before its next step."""

    async def work(store: Store, tenant: str) -> tuple[str, RunState, RunIndex]:
        runner = _runner(store, tenant)
        before = (await runner.load(run_id)).status
        state = await runner.cancel(run_id, reason)
        return before, state, (await runner.runs.index(run_id))[0]

    before, state, index = run(ctx, work)
    out = console()
    if state.status == "cancelled" and before != "cancelled":
        out.print(Text(f"cancelled run {run_id} (was {before})"))
    elif before in FINISHED_RUNS:
        out.print(Text(f"run {run_id} is already {before}; nothing to cancel"))
    else:
        owner = f" by {index.owner}" if index.owner else ""
        out.print(
            Text(
                f"cancel requested: run {run_id} is being run{owner}; it stops before its next step"
            )
        )


@app.command("delete")
def delete(ctx: typer.Context, run_id: RunId, yes: YesFlag = False) -> None:
    """Delete a run's index, events and checkpoints (asks first unless --yes); its messages
    stay in its session. A damaged run is deleted like any other: how to clean up."""

    async def work(store: Store, tenant: str) -> bool:
        runs = RunStore(store, tenant)
        try:
            question = (
                f"Delete run {run_id} ({started_view((await runs.index(run_id))[0]).status})?"
            )
        except StoreCorruptError:
            question = f"Run {run_id} is damaged (its index cannot be read). Delete it?"
        if not confirm_delete(f"run {run_id}", question, yes):
            return False
        await runs.delete(run_id)
        return True

    report_deleted(f"run {run_id}", run(ctx, work))


@app.command("export")
def export(ctx: typer.Context, run_id: RunId, output: OutputFile = None) -> None:
    """Export a run as one self-contained JSON snapshot (checkpoint plus messages)."""

    async def work(store: Store, tenant: str) -> str:
        return await RunStore(store, tenant).export(run_id)

    snapshot = json.loads(run(ctx, work, read_only=True))
    write_output(json.dumps(snapshot, indent=2, ensure_ascii=False), output)
    if output is not None:
        console().print(Text(f"exported run {run_id} to {output}"))


@app.command("import")
def import_(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="A file made by `runs export` (- for stdin).")],
    new_run_id: Annotated[
        str | None, typer.Option("--run-id", help="Import under this run id.")
    ] = None,
    new_session_id: Annotated[
        str | None, typer.Option("--session-id", help="Id of the session created for it.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Import a run exported with `runs export` (into a new session)."""
    snapshot = read_input(file)

    async def work(store: Store, tenant: str) -> RunState:
        runs = RunStore(store, tenant)
        target = new_run_id or RunState.from_json(snapshot).run_id
        try:
            await runs.index(target)
        except NotFoundError:
            pass
        else:  # checked first: importing would create the session before failing
            fail(f"run {target!r} already exists here; pass --run-id to import under a new id")
        return await runs.import_(snapshot, run_id=new_run_id, session_id=new_session_id)

    state = run(ctx, work, create=True)
    if wants_json(ctx, json_output):
        print_json({"run_id": state.run_id, "session_id": state.session_id, "status": state.status})
        return
    console().print(
        Text(f"imported run {state.run_id} ({state.status}) into session {state.session_id}")
    )
