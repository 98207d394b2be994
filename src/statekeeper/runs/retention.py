"""Retention: delete the runs and sessions of a tenant that have not changed since a cutoff.

`sweep` is the policy behind ``statekeeper gc``. A run is stale when its index was last
updated before the cutoff, a session when it was last active before it. Nothing that a
kept run or session still depends on is deleted, whatever its age:

- a kept run's session, and the sessions that session was forked from (a fork reads
  its parent's entries, so deleting the parent would break the fork);
- a kept session's fork ancestors, for the same reason;
- a kept run's parent runs (a child run reports back to its parent).

Runs are deleted before sessions: a run without its session cannot be loaded, while a
session without its runs is still a whole conversation, so a sweep that stops half way
leaves nothing broken behind.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from statekeeper.errors import NotFoundError
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.sessions.manager import SessionManager
from statekeeper.stores.base import SessionRecord, Store

__all__ = ["Stale", "Sweep", "sweep"]


@dataclass(frozen=True)
class Stale:
    """A run or a session that has not changed since the cutoff."""

    id: str
    changed_at: datetime
    """A run's last update, a session's last activity."""
    label: str
    """A run's status, a session's title ("" when it has none)."""


@dataclass
class Sweep:
    """What `sweep` deleted, or with ``dry_run`` would delete, and what it kept."""

    before: datetime
    dry_run: bool
    runs: list[Stale] = field(default_factory=list)
    sessions: list[Stale] = field(default_factory=list)
    kept_runs: list[Stale] = field(default_factory=list)
    """Stale runs kept because a newer run descends from them."""
    kept_sessions: list[Stale] = field(default_factory=list)
    """Stale sessions kept because a kept run or session reads their entries."""


async def sweep(
    store: Store,
    tenant: str,
    before: datetime,
    *,
    runs: bool = True,
    sessions: bool = True,
    dry_run: bool = False,
) -> Sweep:
    """Delete the tenant's runs and sessions that have not changed since ``before``.

    Args:
        store: the store to sweep.
        tenant: whose runs and sessions.
        before: the cutoff; an aware datetime.
        runs: whether stale runs are deleted (with their checkpoints and event logs).
        sessions: whether stale sessions are deleted (with their transcripts).
        dry_run: only report what would be deleted.

    Returns:
        The stale runs and sessions deleted (or to delete) and those kept as needed.
        One deleted concurrently by someone else is left out.
    """
    run_store, manager = RunStore(store, tenant), SessionManager(store, tenant)
    indexes = await run_store.list(limit=sys.maxsize)
    records = [record async for record in manager.iter()] if sessions else []
    result = Sweep(before, dry_run)
    if runs:
        result.runs, result.kept_runs = _stale_runs(indexes, before)
    doomed = {stale.id for stale in result.runs}
    if sessions:
        in_use = [index.session_id for index in indexes if index.run_id not in doomed]
        result.sessions, result.kept_sessions = _stale_sessions(records, before, in_use)
    if not dry_run:  # runs first: see the module docstring
        result.runs = [s for s in result.runs if await _deleted(run_store.delete, s.id)]
        result.sessions = [s for s in result.sessions if await _deleted(manager.delete, s.id)]
    return result


def _stale_runs(indexes: list[RunIndex], before: datetime) -> tuple[list[Stale], list[Stale]]:
    """The stale runs to delete, and those to keep because a kept run descends from them."""
    stale = {index.run_id for index in indexes if index.updated_at < before}
    parent_of = {index.run_id: index.parent_run_id for index in indexes}
    needed = _closure(
        (index.parent_run_id for index in indexes if index.run_id not in stale), parent_of
    )
    doomed: list[Stale] = []
    kept: list[Stale] = []
    for index in indexes:
        if index.run_id in stale:
            target = kept if index.run_id in needed else doomed
            target.append(Stale(index.run_id, index.updated_at, index.status))
    return doomed, kept


def _stale_sessions(
    records: list[SessionRecord], before: datetime, in_use: list[str]
) -> tuple[list[Stale], list[Stale]]:
    """The stale sessions to delete, and those to keep because a kept run uses them or a
    kept session was forked from them."""
    stale = {record.id for record in records if record.last_active < before}
    parent_of = {r.id: r.forked_from.session_id if r.forked_from else None for r in records}
    fresh = [record.id for record in records if record.id not in stale]
    needed = _closure([*in_use, *fresh], parent_of)
    doomed: list[Stale] = []
    kept: list[Stale] = []
    for record in records:
        if record.id in stale:
            target = kept if record.id in needed else doomed
            target.append(Stale(record.id, record.last_active, record.title or ""))
    return doomed, kept


def _closure(starts: Iterable[str | None], parent_of: Mapping[str, str | None]) -> set[str]:
    """``starts`` and every id reachable from them through ``parent_of`` (cycle-safe)."""
    found: set[str] = set()
    for start in starts:
        current = start
        while current is not None and current not in found:
            found.add(current)
            current = parent_of.get(current)
    return found


async def _deleted(delete: Callable[[str], Awaitable[None]], item_id: str) -> bool:
    """Delete one item; False when it was already gone (deleted by someone else meanwhile)."""
    try:
        await delete(item_id)
    except NotFoundError:
        return False
    return True
