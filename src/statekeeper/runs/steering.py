"""Start and steer: what an operator's follow-up does to a run, in every status.

A follow-up is a user message for a run's conversation. What happens to it depends on
the run's status (the server's ``POST /runs/{id}/followups`` and ``statekeeper runs
followup`` both use `plan_followup`):

- **running** in this process (its runner has a follow-up queue, see `attach_followups`):
  ``steer`` adds the text to the run's input at its next step; ``queue`` keeps it until
  the run stops, then the session's run goes on with it (`continue_session`). A run
  driven by another process cannot be reached: `ConflictError`.
- **paused** or **waiting for input**: the run resumes with the text as its input (the
  mode does not matter: nothing is in progress to steer). At a limit: `ConflictError`
  (raise the limit first).
- **waiting for approval**: `ConflictError`; a message now would land between a tool
  call and its result, so the calls are decided first.
- **finished** (completed, error, cancelled): the run's last checkpoint is forked into a
  new run that goes on with the text (a follow-up question on a finished conversation);
  the original run stays as it is.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import Message
from statekeeper.errors import ConflictError, NotFoundError
from statekeeper.runs.lifecycle import FINISHED
from statekeeper.runs.limiting import LIMIT_KEYWORDS, reached
from statekeeper.runs.results import RunResult
from statekeeper.runs.runner import Runner
from statekeeper.runtime.followups import FollowupMode, FollowupQueue

__all__ = [
    "FollowupPlan",
    "attach_followups",
    "check_session_idle",
    "continue_session",
    "plan_followup",
]

_ALL = 100_000  # runs of one session scanned for its newest


@dataclass
class FollowupPlan:
    """What a follow-up does: ``outcome`` (steered, queued, deduplicated, dropped,
    resumed or forked), the run that takes it, and ``work``: the coroutine that drives
    that run (to await or run in the background), None when the text went to a queue."""

    outcome: str
    run_id: str
    mode: str
    work: Coroutine[Any, Any, RunResult] | None = None
    pending: int = 0


def attach_followups(runner: Runner) -> FollowupQueue:
    """The runner's follow-up queue; one is attached (draining with `continue_session`)
    when its app gave none, so runs it drives can be steered."""
    found = runner.coordination.followups
    if found is not None:
        return found
    queue = FollowupQueue(partial(continue_session, runner))
    coordination = replace(runner.coordination, followups=queue)
    runner.coordination = coordination
    runner.loop.coordination = coordination
    return queue


async def continue_session(runner: Runner, session_id: str, message: Message) -> None:
    """Go on with a queued follow-up once the session's run stopped: the session's newest
    run takes it as `plan_followup` says (resumed, or forked when finished)."""
    runs = await runner.runs.list(session_id=session_id, limit=_ALL)
    if not runs:
        raise NotFoundError(f"session {session_id!r} has no run to go on with a follow-up")
    plan = await plan_followup(runner, runs[-1].run_id, message.text, "queue")
    if plan.work is not None:
        await plan.work


async def check_session_idle(runner: Runner, session_id: str) -> None:
    """`ConflictError` when a run that has not finished uses the session: a new run on it
    would interleave its messages with that run's (send that run a follow-up instead)."""
    runs = await runner.runs.list(session_id=session_id, limit=_ALL)
    live = [index for index in runs if index.status not in FINISHED]
    if live:
        named = ", ".join(f"{i.run_id} ({i.status})" for i in live[:3])
        raise ConflictError(
            f"session {session_id!r} has a run that has not finished: {named}; send it a "
            f"follow-up (`statekeeper runs followup {live[0].run_id} TEXT`, POST "
            f"/api/v1/runs/{live[0].run_id}/followups), or let it finish or cancel it first"
        )


def _mode(mode: str) -> FollowupMode:
    from statekeeper.runtime.followup_types import parse_choice

    return parse_choice(FollowupMode, mode, "mode")


async def plan_followup(runner: Runner, run_id: str, text: str, mode: str) -> FollowupPlan:
    """What the follow-up ``text`` does to the run (see the module docstring). Refusals
    raise before anything is stored; a steered or queued text is in the queue on return."""
    chosen = _mode(mode).value
    state = await runner.load(run_id)
    status = state.status
    if status in (AgentStatus.RUNNING, AgentStatus.INITIALIZING):
        queue = runner.coordination.followups
        if queue is None or queue.active_run(state.session_id) != run_id:
            raise ConflictError(
                f"run {run_id} is {status} in another process: a follow-up reaches only the "
                "process that drives the run; send it to that process (its server's "
                f"POST /api/v1/runs/{run_id}/followups), or wait until the run stops"
            )
        outcome = await queue.submit(state.session_id, Message.user(text), chosen)
        return FollowupPlan(outcome.status.value, run_id, chosen, pending=outcome.pending)
    if status == AgentStatus.WAITING_FOR_APPROVAL:
        raise ConflictError(
            f"run {run_id} is waiting for approval: a message now would land between its "
            "tool call and the call's result; approve or reject the pending call(s) first, "
            "then send the follow-up"
        )
    found = reached(state.limits)
    if found is not None:
        field, flag = found
        raise ConflictError(
            f"run {run_id} is at its {flag.name} limit ({flag.current:g} of "
            f"{flag.maximum or 0:g}): raise it first (`statekeeper runs raise-limit {run_id} "
            f"--{LIMIT_KEYWORDS[field]} N`, or POST /api/v1/runs/{run_id}/limits), then "
            "send the follow-up"
        )
    if status not in FINISHED:
        return FollowupPlan("resumed", run_id, chosen, runner.resume(run_id, text))
    history = await runner.runs.history(run_id)
    usable = [cp for cp in history if not cp.corrupt]
    if not usable:
        raise ConflictError(f"run {run_id} has no readable checkpoint to go on from")
    fork = await runner.runs.fork(run_id, at=usable[-1].step)
    return FollowupPlan("forked", fork.run_id, chosen, runner.resume(fork.run_id, text))
