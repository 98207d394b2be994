"""``/api/v1/runs``: list, show, history, events, and the operator's actions."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.errors import ConflictError, InvalidInputError, NotFoundError, StatekeeperError
from statekeeper.ids import validate_id
from statekeeper.runs.approvals import record_decision, settle
from statekeeper.runs.index import check_not_held
from statekeeper.runs.lifecycle import FINISHED
from statekeeper.runs.operations import status_filter
from statekeeper.runs.rollup import children_of
from statekeeper.runs.runner import Runner
from statekeeper.runs.spans import decision_span
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.runtime.events import EventBus
from statekeeper.server.auth import Caller, Context, Operator, Reader
from statekeeper.server.context import ServerContext
from statekeeper.server.views import event_json, run_detail, run_summary

__all__ = ["load_run", "router"]

router = APIRouter(prefix="/runs", tags=["runs"])


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Decision(_Body):
    call_id: str = Field(min_length=1, max_length=256)
    always: bool = False
    reason: str | None = Field(
        default=None,
        max_length=4096,
        description="why; on a rejection, a message to the model (the call's result)",
    )
    arguments: dict[str, JsonValue] | None = Field(
        default=None,
        description="approve only: run the tool with these edited arguments (a JSON object)",
    )
    resume: bool = False


class Resume(_Body):
    input: str | None = Field(default=None, max_length=1_000_000)
    take_over: bool = False
    wait: bool = False


class Cancel(_Body):
    reason: str | None = Field(default=None, max_length=4096)


class Limits(_Body):
    iterations: int | None = Field(default=None, ge=0)
    budget: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    tokens: int | None = Field(default=None, ge=0)
    seconds: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    name: str | None = Field(default=None, description="iterations, budget, tokens or time")
    limit: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class Fork(_Body):
    at: int | None = Field(default=None, ge=1, description="a step of the run's checkpoints")
    input: str | None = Field(default=None, max_length=1_000_000)
    state_update: dict[str, JsonValue] | None = None
    new_run_id: str | None = None
    title: str | None = Field(default=None, max_length=1024)
    run: bool = False


async def load_run(runs: RunStore, run_id: str) -> tuple[RunIndex, RunState | None]:
    """The run's index and latest checkpoint (None before its first checkpoint)."""
    index, _ = await runs.index(run_id)
    try:  # the same roll-forward (and corrupt-checkpoint fallback) as `runs show`
        loaded = await runs.load_latest(run_id)
    except NotFoundError as exc:
        if index.revision == 0:
            return index, None
        if not await _session_exists(runs, index.session_id):
            raise NotFoundError(_orphaned(index)) from exc
        raise
    return loaded.index, loaded.state


async def _session_exists(runs: RunStore, session_id: str) -> bool:
    try:
        await runs.store.get_session(runs.tenant, session_id)
    except NotFoundError:
        return False
    return True


def _orphaned(index: RunIndex) -> str:
    return (
        f"run {index.run_id!r} cannot be read: its session {index.session_id!r}, which "
        "held its checkpoints, was deleted; delete the run (RunStore.delete, or "
        "`statekeeper gc`)"
    )


async def _summaries(
    runs: RunStore, indexes: list[RunIndex], unreadable: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The summaries of ``indexes``; a run that can no longer be read is added to
    ``unreadable`` (as a damaged row: id, error, raw) instead of being hidden."""
    out = []
    for index in indexes:
        try:
            index, state = await load_run(runs, index.run_id)
        except NotFoundError as exc:
            if unreadable is not None and await _index_exists(runs, index.run_id):
                unreadable.append({"id": index.run_id, "error": str(exc), "raw": ""})
            continue  # else deleted meanwhile
        out.append(run_summary(index, state))
    return out


async def _index_exists(runs: RunStore, run_id: str) -> bool:
    try:
        await runs.index(run_id)
    except NotFoundError:
        return False
    return True


async def _children(runs: RunStore, parent: RunIndex, depth: int = 0) -> list[dict[str, Any]]:
    """The summaries of the runs ``parent`` delegated to, each with its own children
    (read from the parents' records, never by listing the tenant's runs)."""
    kids = await children_of(runs, parent)
    found = await _summaries(runs, kids)
    by_id = {kid.run_id: kid for kid in kids}
    for child in found:
        deeper = depth < 32 and child["run_id"] in by_id
        child["children"] = (
            await _children(runs, by_id[child["run_id"]], depth + 1) if deeper else []
        )
    return found


async def detail(runner: Runner, run_id: str) -> dict[str, Any]:
    """The `RunDetail` of a run."""
    index, state = await load_run(runner.runs, run_id)
    events = await runner.store.read_events(runner.tenant, run_id)
    return run_detail(index, state, events, await _children(runner.runs, index))


@router.get("")
async def list_runs(
    caller: Reader,
    context: Context,
    status: str | None = None,
    session_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
) -> dict[str, Any]:
    """Runs, oldest first, with cost and pending approvals."""
    runs = (await context.runner(caller.tenant)).runs
    if cursor is not None:
        validate_id(cursor, "cursor")
    wanted = status_filter(status)
    page = await runs.list(status=wanted, session_id=session_id, after=cursor, limit=limit)
    unreadable: list[dict[str, Any]] = []
    items = await _summaries(runs, page, unreadable)
    return {
        "items": items,
        "next_cursor": page[-1].run_id if len(page) == limit else None,
        "corrupt": context.reported([*page.corrupt, *unreadable]),
    }


@router.get("/{run_id}")
async def show_run(run_id: str, caller: Reader, context: Context) -> dict[str, Any]:
    """One run: limits, metrics, pending calls, errors, timeline and children."""
    return await detail(await context.runner(caller.tenant), run_id)


@router.get("/{run_id}/checkpoints")
async def checkpoints(run_id: str, caller: Reader, context: Context) -> dict[str, Any]:
    """The run's checkpoints, oldest first (fork from any ``step``)."""
    runs = (await context.runner(caller.tenant)).runs
    return {"items": [info.to_json() for info in await runs.history(run_id)]}


@router.get("/{run_id}/events")
async def events(
    run_id: str,
    caller: Reader,
    context: Context,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    stream: str | None = None,
) -> dict[str, Any]:
    """A page of the run's event log, after seq ``after``."""
    runs = (await context.runner(caller.tenant)).runs
    index = await _known(context, runs, run_id)
    page = await context.store.read_events(caller.tenant, run_id, after_seq=after, limit=limit)
    session = index.session_id if index is not None else None
    return {
        "items": [event_json(e, session) for e in page if stream in (None, e.stream)],
        "next_after": page[-1].seq if len(page) == limit else None,
    }


async def _known(context: ServerContext, runs: RunStore, run_id: str) -> RunIndex | None:
    """The run's index; None for a log without one; `NotFoundError` when neither."""
    try:
        return (await runs.index(run_id))[0]
    except NotFoundError:
        if await context.store.read_events(runs.tenant, run_id, limit=1):
            return None
        raise


async def _decide(
    context: ServerContext, caller: Caller, run_id: str, body: Decision, *, approved: bool
) -> dict[str, Any]:
    """Record a decision once: a call that already has one is a `ConflictError`, and of
    two decisions saved at once the session's compare-and-set lets one through."""
    runner = await context.runner(caller.tenant)
    # One span in the run's trace, the loading and saving under it (`decision_span`).
    with decision_span(run_id, body.call_id, approved=approved, by=caller.decided_by) as trace:
        state, index_version, session_version = await runner.runs.load(run_id)
        if trace is not None:
            trace.adopt(state)
        if state.status != AgentStatus.WAITING_FOR_APPROVAL:
            raise ConflictError(f"run {run_id} is {state.status}, not waiting for approval")
        earlier = next((d for d in state.decisions if d.call_id == body.call_id), None)
        if earlier is not None:
            verdict = "approved" if earlier.approved else "rejected"
            raise ConflictError(
                f"tool call {body.call_id!r} of run {run_id} was already {verdict} "
                f"by {earlier.decided_by or 'someone'}"
            )
        decision = record_decision(
            state,
            body.call_id,
            approved=approved,
            always=body.always,
            reason=body.reason,
            decided_by=caller.decided_by,
            arguments=body.arguments,
        )
        await runner.runs.save(state, index_version=index_version, session_version=session_version)
    # The checkpoint keeps the decision until the run settles it; the log keeps it for good.
    payload = {"call_id": body.call_id, "tool": decision.tool, "approved": approved}
    payload |= {"always": body.always, "reason": body.reason, "decided_by": caller.decided_by}
    if decision.edited_arguments is not None:  # approved with edits: what runs instead
        payload["edited_arguments"] = body.arguments
    await EventBus(context.store, caller.tenant).publish(
        run_id, "approval", "approved" if approved else "rejected", payload
    )
    context.hub.poke(caller.tenant, run_id)
    if body.resume and not settle(state).pending:
        await _start_resume(context, caller, run_id, Resume())
    return await detail(runner, run_id)


@router.post("/{run_id}/approve")
async def approve(run_id: str, body: Decision, caller: Operator, context: Context) -> Any:
    """Approve a pending tool call (``always``: every later call of its tool too)."""
    return await _decide(context, caller, run_id, body, approved=True)


@router.post("/{run_id}/reject")
async def reject(run_id: str, body: Decision, caller: Operator, context: Context) -> Any:
    """Reject a pending tool call; the agent sees the rejection as the call's result."""
    return await _decide(context, caller, run_id, body, approved=False)


async def _start_resume(
    context: ServerContext, caller: Caller, run_id: str, body: Resume
) -> dict[str, Any] | None:
    """Resume the run: in the background, or (``wait``) until it stops."""
    runner = await context.runner(caller.tenant, agents=True)
    state = await runner.load(run_id)
    if state.status in FINISHED:
        raise ConflictError(f"run {run_id} is {state.status}; nothing to resume")
    if state.status == AgentStatus.WAITING_FOR_INPUT and not body.input:
        raise InvalidInputError(f'run {run_id} is waiting for input; pass "input" to resume it')
    if not body.take_over:  # a run another live server drives: 409 now, not a 202 that fails
        check_not_held((await runner.runs.index(run_id))[0], runner.owner)
    work = runner.resume(run_id, body.input or (), take_over=body.take_over)
    if not body.wait:
        context.background(work, tenant=caller.tenant, run_id=run_id)
        return None
    try:
        await work
    except StatekeeperError:
        raise
    except Exception:  # noqa: S110  the agent or a tool failed: the run recorded it (ERROR)
        pass
    finally:
        context.hub.poke(caller.tenant, run_id)
    return await detail(runner, run_id)


@router.post(
    "/{run_id}/resume",
    status_code=202,
    responses={200: {"description": "resumed with wait: the run stopped again"}},
)
async def resume(
    run_id: str, caller: Operator, context: Context, response: Response, body: Resume | None = None
) -> Any:
    """Resume a stopped run with the app's agents (202: it goes on in the background)."""
    done = await _start_resume(context, caller, run_id, body or Resume())
    if done is not None:
        response.status_code = 200
        return done
    return await detail(await context.runner(caller.tenant), run_id)


@router.post("/{run_id}/cancel")
async def cancel(
    run_id: str, caller: Operator, context: Context, body: Cancel | None = None
) -> Any:
    """Cancel a run: a stopped one at once, a running one before its next step."""
    runner = await context.runner(caller.tenant)
    await runner.cancel(run_id, (body or Cancel()).reason)
    context.hub.poke(caller.tenant, run_id)
    return await detail(runner, run_id)


_LIMIT_NAMES = {"iterations": "iterations", "budget": "budget", "tokens": "tokens"}
_LIMIT_NAMES |= {"time": "seconds", "seconds": "seconds"}


@router.post("/{run_id}/limits")
async def raise_limits(run_id: str, body: Limits, caller: Operator, context: Context) -> Any:
    """Raise a stopped run's limits (none given: each reached one by its increase)."""
    given: dict[str, Any] = body.model_dump(exclude={"name", "limit"}, exclude_none=True)
    if body.name is not None:
        name = _LIMIT_NAMES.get(body.name)
        if name is None or body.limit is None:
            raise InvalidInputError("name must be iterations, budget, tokens or time, with a limit")
        given[name] = int(body.limit) if name in ("iterations", "tokens") else body.limit
    runner = await context.runner(caller.tenant)
    await runner.raise_limits(run_id, **given)
    context.hub.poke(caller.tenant, run_id)
    return await detail(runner, run_id)


@router.post(
    "/{run_id}/fork",
    status_code=201,
    responses={202: {"description": "forked with run: the fork goes on in the background"}},
)
async def fork(
    run_id: str, body: Fork, caller: Operator, context: Context, response: Response
) -> Any:
    """A new run from a checkpoint of this one (``run``: resumed in the background)."""
    runner = await context.runner(caller.tenant, agents=body.run)
    # A fork to run at once is refused, leaving nothing, when it has no room to step.
    create = runner.create_fork if body.run else runner.runs.fork
    state = await create(
        run_id,
        at=body.at,
        state_update=body.state_update,
        new_run_id=body.new_run_id,
        title=body.title,
    )
    if body.run:
        response.status_code = 202
        await _start_resume(context, caller, state.run_id, Resume(input=body.input))
    return await detail(runner, state.run_id)
