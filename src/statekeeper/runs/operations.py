"""What an operator does to runs from outside the process running them (the CLI and the
server share it): load the ``--app`` runner factory, kill and steer subagents, and see
session lanes as the runs index records them.

Everything here works from another process than the one running the agents: kill
cancels through the runs index (`Runner.cancel`), steer appends to the child's session
(the running run reads it at its next step), and lanes are shown as the store sees them.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from statekeeper.core.lifecycle import parse_status
from statekeeper.core.messages import Message
from statekeeper.errors import ConflictError, InvalidInputError, NotFoundError, StatekeeperError
from statekeeper.runs.lifecycle import FINISHED
from statekeeper.runs.runner import Runner
from statekeeper.runs.store import RunIndex, RunStore, owner_alive
from statekeeper.runtime.subagents import SubagentEntry, SubagentRegistry
from statekeeper.sessions import SessionManager
from statekeeper.stores.base import Event, Store

__all__ = [
    "OPERATOR_ID",
    "Held",
    "Killed",
    "Lanes",
    "Steered",
    "build_runner",
    "check_no_live_runs",
    "held_json",
    "kill_subagent",
    "lanes_json",
    "lanes_of",
    "load_factory",
    "status_filter",
    "steer_refusal",
    "steer_subagent",
    "timeline",
]

OPERATOR_ID = "statekeeper-cli"
"""The worker id of an operator's subagent registry (it never registers or owns children)."""


def load_factory(spec: str) -> Callable[..., Any]:
    """Import the ``MODULE:ATTR`` runner factory of ``--app`` (the current directory is
    importable); `InvalidInputError` names what is wrong with it."""
    module_name, sep, attr = spec.partition(":")
    if not (module_name and sep and attr):
        raise InvalidInputError(f"{spec!r} is not MODULE:ATTR (e.g. myapp.agents:make_runner)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInputError(f"cannot import {module_name!r} for --app: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidInputError(
                f"module {module_name!r} has no attribute {attr!r} (from --app {spec})"
            ) from None
    if not callable(target):
        raise InvalidInputError(
            f"--app {spec} is not callable; it must be a function (store, tenant) -> Runner"
        )
    try:
        inspect.signature(target).bind(None, None)
    except TypeError:
        raise InvalidInputError(
            f"--app {spec} must take (store, tenant) and return a Runner (see docs/cli.md)"
        ) from None
    except ValueError:
        pass  # no signature to check (some builtins): calling it is checked below
    factory: Callable[..., Any] = target
    return factory


async def build_runner(factory: Callable[..., Any], spec: str, store: Store, tenant: str) -> Runner:
    """Call the ``--app`` factory; its failure, or anything but a Runner, is an
    `InvalidInputError` naming the factory."""
    try:
        made = factory(store, tenant)
        runner = await made if inspect.isawaitable(made) else made
    except StatekeeperError:
        raise
    except Exception as exc:
        raise InvalidInputError(f"--app {spec} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(runner, Runner):
        raise InvalidInputError(
            f"--app {spec} returned {type(runner).__name__}, not a statekeeper Runner"
        )
    return runner


@dataclass
class Killed:
    """What killing a subagent did to its run."""

    before: str | None = None
    """The run's status before the cancel; None when the run is not in the runs index."""
    after: str | None = None
    owner: str | None = None


async def kill_subagent(
    store: Store,
    tenant: str,
    run_id: str,
    killed: Killed,
    *,
    by: str = "statekeeper subagents kill",
) -> SubagentEntry:
    """Cancel a child run (through the runs index) and mark its entry killed."""
    runner = Runner(store, tenant, agents=[])

    async def cancel(child: str) -> None:
        try:
            await runner.runs.index(child)
        except NotFoundError:
            return  # not in the runs index: nothing to cancel, only the entry to mark
        killed.before = str((await runner.load(child)).status)
        state = await runner.cancel(child, f"killed with `{by}`")
        killed.after = str(state.status)
        killed.owner = (await runner.runs.index(child))[0].owner

    registry = SubagentRegistry(store, tenant, owner_id=OPERATOR_ID, kill=cancel)
    return await registry.kill(run_id)


@dataclass
class Steered:
    """Where a steering message went."""

    session_id: str = ""
    seq: int | None = None
    run_status: str | None = None
    """The run's status in the runs index; None when the run is not in it."""


def steer_refusal(run_id: str, status: str) -> str | None:
    """Why a run in ``status`` must not be steered (None: it may be)."""
    if status == "waiting_for_approval":
        return (
            f"run {run_id} is waiting for approval: a message now would land between its "
            "tool call and the call's result; decide the call first (`statekeeper runs "
            "approve|reject`)"
        )
    if status == "waiting_for_input":
        return (
            f"run {run_id} is waiting for input, not running: give it the text with "
            f"`statekeeper runs resume {run_id} --input TEXT --app ...` instead"
        )
    if status in FINISHED:
        return f"run {run_id} is already {status}: no run reads a steering message any more"
    return None


async def steer_subagent(store: Store, tenant: str, run_id: str, text: str) -> Steered:
    """Append a user message to a running child run's session (`ConflictError` for a
    run that must not be steered: waiting for a decision or input, or finished)."""
    steered = Steered()
    # No automatic continuation: the message must land in the session the run reads.
    manager = SessionManager(store, tenant, auto_continue=False)

    async def append(child: str, message: Message) -> None:
        entry = await registry.get(child)
        try:
            steered.run_status = (await RunStore(store, tenant).index(child))[0].status
        except NotFoundError:
            steered.run_status = None  # cannot tell: append anyway
        else:
            refusal = steer_refusal(child, steered.run_status)
            if refusal is not None:
                raise ConflictError(refusal)
        session = await manager.get(entry.child_session_id)
        outcome = await session.append(message, strict=False)
        steered.session_id = outcome.session_id
        steered.seq = outcome.entries[-1].seq if outcome.entries else None

    registry = SubagentRegistry(store, tenant, owner_id=OPERATOR_ID, steer=append)
    await registry.steer(run_id, Message.user(text))
    return steered


@dataclass
class Held:
    index: RunIndex
    alive: bool


@dataclass
class Lanes:
    """The runs index seen as session lanes at one moment."""

    now: datetime
    held: dict[str, list[Held]] = field(default_factory=dict)
    """Lane (``session:<id>``) -> the runs with a live lease on it."""
    expired: list[RunIndex] = field(default_factory=list)
    """Runs whose owner let the lease run out without releasing it."""


def lanes_of(runs: list[RunIndex], now: datetime) -> Lanes:
    found = Lanes(now)
    for index in runs:
        if index.owner is None:
            continue
        if index.lease_until is None or index.lease_until <= now:
            found.expired.append(index)
            continue
        held = Held(index, owner_alive(index.owner))
        found.held.setdefault(f"session:{index.session_id}", []).append(held)
    return found


def held_json(held: Held, now: datetime) -> dict[str, Any]:
    index = held.index
    assert index.lease_until is not None
    return {
        "run_id": index.run_id,
        "status": index.status,
        "agent": index.agent,
        "owner": index.owner,
        "owner_alive": held.alive,
        "lease_until": index.lease_until.isoformat(),
        "lease_left_seconds": round((index.lease_until - now).total_seconds(), 3),
        "updated_at": index.updated_at.isoformat(),
        "since_update_seconds": round((now - index.updated_at).total_seconds(), 3),
        "cancel_requested": index.cancel_requested,
    }


def lanes_json(found: Lanes) -> dict[str, Any]:
    return {
        "lanes": [
            {"lane": lane, "runs": [held_json(h, found.now) for h in items]}
            for lane, items in sorted(found.held.items())
        ],
        "expired_leases": [
            {
                "run_id": index.run_id,
                "lane": f"session:{index.session_id}",
                "status": index.status,
                "owner": index.owner,
                "lease_until": index.lease_until.isoformat() if index.lease_until else None,
            }
            for index in found.expired
        ],
    }


def timeline(events: list[Event]) -> list[dict[str, Any]]:
    """The lifecycle events of a run's log: status changes, start, pause, abort, end."""
    rows = []
    for event in events:
        if event.stream != "lifecycle":
            continue
        payload = {k: v for k, v in event.payload.items() if k not in ("trace_id", "span_id")}
        rows.append({"seq": event.seq, "ts": event.ts.isoformat(), "kind": event.kind, **payload})
    return rows


def status_filter(value: str | None) -> str | None:
    """A run status to filter on, aliases resolved (``waiting`` ...); a name that is no
    built-in status is kept, lower-cased (a custom state of some agent's table)."""
    if value is None:
        return None
    try:
        return str(parse_status(value))
    except InvalidInputError:
        return value.lower()


async def check_no_live_runs(store: Store, tenant: str, session_id: str) -> None:
    """`ConflictError` if a run that has not finished uses the session: deleting it would
    strand the run (a waiting approval could never be decided)."""
    live = [
        index
        for index in await RunStore(store, tenant).list(session_id=session_id, limit=10**9)
        if index.status not in FINISHED
    ]
    if live:
        named = ", ".join(f"{i.run_id} ({i.status})" for i in live[:3])
        more = f" and {len(live) - 3} more" if len(live) > 3 else ""
        raise ConflictError(
            f"session {session_id!r} is used by runs that have not finished: {named}{more}; "
            "cancel or delete them first (statekeeper runs cancel / runs delete), or force it "
            "(--force; force=true over HTTP)"
        )
