"""Delegated spend: a tree of runs cannot outspend its root.

A child run starts with its parent's metrics (the snapshot), so its ``metrics`` are the
total and ``local_metrics`` (total minus snapshot) are its own, as in the reference
systems. Its budget and token limits count its own usage and are capped by what the
parent had left when it started (`child_limits`).

Whenever a child stops (finished, paused, waiting), it reports its own usage so far to
the parent's index record (`report_usage`: compare-and-set, the whole usage each time,
so a repeated report adds nothing). The parent absorbs the reports into its metrics
(`RunState.absorb_child_usage`) when it is loaded and before each of its steps, so the
parent's totals include its children and its limits stop it — in this process or
another. Children started at the same time each get the room left when they started;
their reports then stop the parent.
"""

from __future__ import annotations

from statekeeper.core.limits import BudgetFlag, ControlFlag, Limits, TokenFlag
from statekeeper.errors import ConflictError, NotFoundError
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunStore

__all__ = ["child_limits", "current_parent", "report_usage"]


async def current_parent(runs: RunStore, parent: RunState) -> RunState:
    """A copy of ``parent`` with the usage its children reported since it was read."""
    fresh = parent.copy_state()
    try:
        index, _ = await runs.index(parent.run_id)
    except NotFoundError:
        return fresh  # not stored here (an imported or hand-made state)
    fresh.absorb_child_usage(index.child_usage)
    return fresh


def child_limits(parent: RunState, limits: Limits) -> Limits:
    """``limits`` of a child of ``parent``: budget and tokens capped by the parent's room."""
    kinds: dict[str, type[ControlFlag]] = {"budget": BudgetFlag, "tokens": TokenFlag}
    for field, kind in kinds.items():
        theirs: ControlFlag | None = getattr(parent.limits, field)
        room = None if theirs is None else theirs.remaining
        if room is None:
            continue
        mine: ControlFlag | None = getattr(limits, field)
        if mine is None:
            setattr(limits, field, kind(maximum=room))
        elif mine.maximum is None or mine.maximum > room:
            mine.maximum = room
    return limits


async def report_usage(runs: RunStore, child: RunState) -> None:
    """Report a delegated run's own usage so far to its parent (nothing for a root run)."""
    parent_id = child.delegation.parent_run_id if child.delegation else None
    if parent_id is None:
        return
    usage = child.local_metrics
    for _ in range(10):
        try:
            index, version = await runs.index(parent_id)
        except NotFoundError:
            return  # the parent was deleted, or lives in another store
        if index.child_usage.get(child.run_id) == usage:
            return
        index.child_usage = {**index.child_usage, child.run_id: usage}
        try:
            await runs.put_index(index, expected_version=version)
            return
        except ConflictError:
            continue
    raise ConflictError(f"run {parent_id!r} kept changing; could not report {child.run_id}")
