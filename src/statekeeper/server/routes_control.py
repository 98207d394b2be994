"""Start and steer: the app's agents, starting a run with input, and follow-ups.

These need the server's ``--app`` (without one they answer 422 naming it, as resume
does). A started run and a resumed or forked one go on in the background (202).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits, TimeFlag, TokenFlag
from statekeeper.errors import NotFoundError
from statekeeper.ids import new_id
from statekeeper.runs.loop import find_agent
from statekeeper.runs.runner import Runner
from statekeeper.runs.steering import attach_followups, check_session_idle, plan_followup
from statekeeper.server.auth import Context, Operator, Reader
from statekeeper.server.routes_runs import detail

__all__ = ["router"]

router = APIRouter(tags=["control"])
_STARTING = 500  # at most this many yields of the loop waiting for a new run's index


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartLimits(_Body):
    iterations: int | None = Field(default=None, ge=1)
    budget: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    tokens: int | None = Field(default=None, ge=1)
    seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class Start(_Body):
    agent: str = Field(min_length=1, max_length=256, description="one of GET /agents")
    input: str = Field(min_length=1, max_length=1_000_000)
    title: str | None = Field(default=None, max_length=1024)
    session_id: str | None = Field(default=None, description="a session to run on (else new)")
    limits: StartLimits | None = None


class Followup(_Body):
    text: str = Field(min_length=1, max_length=1_000_000)
    mode: Literal["steer", "queue"] = Field(
        default="steer",
        description="steer: into the running run's next step; queue: after it stops",
    )


def _limits(runner: Runner, given: StartLimits | None) -> Limits | None:
    if given is None:
        return None
    limits = runner.policy.limits_for(None)
    if given.iterations is not None:
        limits.iterations = IterationFlag(maximum=given.iterations)
    if given.budget is not None:
        limits.budget = BudgetFlag(maximum=given.budget)
    if given.tokens is not None:
        limits.tokens = TokenFlag(maximum=given.tokens)
    if given.seconds is not None:
        limits.time = TimeFlag(maximum=given.seconds)
    return limits


@router.get("/agents")
async def agents(caller: Reader, context: Context) -> dict[str, Any]:
    """The agents of the server's ``--app``: what ``POST /runs`` can start; ``owner`` is
    the lease owner of the runs this server drives (the runs it can steer)."""
    runner = await context.runner(caller.tenant, agents=True)
    items = [
        {"name": name, "description": _describe(agent)} for name, agent in runner.agents.items()
    ]
    return {"items": sorted(items, key=lambda item: item["name"]), "owner": runner.owner}


def _describe(agent: Any) -> str | None:
    text = getattr(agent, "description", None)
    return text if isinstance(text, str) and text else None


async def _await(work: asyncio.Future[Any]) -> Any:
    return await work


@router.post("/runs", status_code=202)
async def start_run(body: Start, caller: Operator, context: Context) -> Any:
    """Start a run of an agent with input; it goes on in the background (202)."""
    runner = await context.runner(caller.tenant, agents=True)
    attach_followups(runner)
    find_agent(runner.agents, body.agent)
    if body.session_id is not None:
        await runner.sessions.get(body.session_id)  # a missing session: 404 before anything
        await check_session_idle(runner, body.session_id)
    run_id = new_id("run")
    task = asyncio.ensure_future(
        runner.start(
            body.agent,
            body.input,
            session_id=body.session_id,
            title=body.title,
            limits=_limits(runner, body.limits),
            run_id=run_id,
        )
    )
    context.background(_await(task), tenant=caller.tenant, run_id=run_id)
    # The run is answered once it is registered: a refusal before that (the input's
    # guardrail, say) is this request's error.
    for _ in range(_STARTING):
        try:
            await runner.runs.index(run_id)
            break
        except NotFoundError:
            if task.done():
                task.result()  # raises what refused the run
                break
            await asyncio.wait({task}, timeout=0.01)
    context.hub.poke(caller.tenant, run_id)
    return await detail(runner, run_id)


@router.post("/runs/{run_id}/followups", status_code=202)
async def followup(
    run_id: str, body: Followup, caller: Operator, context: Context, response: Response
) -> dict[str, Any]:
    """Send a follow-up to a run: steer or queue it while it runs; a stopped run resumes
    with it; a finished one is forked into a new run that goes on with it."""
    runner = await context.runner(caller.tenant, agents=True)
    attach_followups(runner)
    plan = await plan_followup(runner, run_id, body.text, body.mode)
    if plan.work is not None:
        context.background(plan.work, tenant=caller.tenant, run_id=plan.run_id)
    context.hub.poke(caller.tenant, run_id)
    if plan.outcome in ("deduplicated", "dropped"):
        response.status_code = 200
    return {
        "outcome": plan.outcome,
        "mode": plan.mode,
        "run_id": plan.run_id,
        "pending": plan.pending,
        "run": await detail(runner, plan.run_id),
    }
