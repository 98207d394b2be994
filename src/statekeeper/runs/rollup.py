"""Delegated spend: a tree of runs cannot outspend its root.

A child run starts with its parent's metrics (the snapshot), so its ``metrics`` are the
total and ``local_metrics`` (total minus snapshot) are its own, as in the reference
systems. Its budget and token limits count its own usage.

**Reservations.** A parent's live children are kept in one versioned record of their
own (namespace ``run-children``, key = the parent's run id): each child with the budget
and tokens it reserved when it started. A new child's budget and token limits are capped
by the parent's room minus what its live siblings reserved and have not spent yet
(`reserve`), and the reservation is written with compare-and-set on that record, so
children started at the same moment, in one process or several, never share the same
room: the loser of a race reads again and sees the winner's reservation. With no room
left the child is refused (`LimitReachedError`, nothing written).

**Roll-up.** Whenever a child stops (finished, paused, waiting), it reports its own usage
so far to the parent's index record (`report_usage`: compare-and-set, the whole usage
each time, so a repeated report adds nothing); a finished child then releases its
reservation (report first, release second: a reader that reads the record before the
index never misses both). The parent absorbs the reports into its metrics
(`RunState.absorb_child_usage`) when it is loaded and before each of its steps.

**Recovery.** A child that crashed after its last checkpoint but before its report is
still in the parent's record: `settle_children` (run when the parent is loaded or
resumed through the runner, and before it delegates again) reports the usage of every
child that is not being driven, and releases those that finished, exactly once. A
reservation whose child run never came to exist (the process delegating died before
creating it) or was deleted is released `ABANDONED_AFTER` it was made.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from statekeeper.core.limits import BudgetFlag, ControlFlag, Limits, TokenFlag
from statekeeper.core.messages import utcnow
from statekeeper.core.metrics import COST_DIGITS, Metrics
from statekeeper.errors import (
    ConflictError,
    LimitReachedError,
    NotFoundError,
    StatekeeperError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id
from statekeeper.runs.lifecycle import FINISHED
from statekeeper.runs.state import RunState
from statekeeper.runs.store import CHILDREN_NAMESPACE, RunIndex, RunStore, check_not_held

__all__ = [
    "ABANDONED_AFTER",
    "CHILDREN_NAMESPACE",
    "LiveChildren",
    "Reserved",
    "child_limits",
    "children_of",
    "current_parent",
    "live_children",
    "release",
    "report_usage",
    "reserve",
    "settle_children",
]


_ATTEMPTS = 20

ABANDONED_AFTER: Final = timedelta(minutes=10)
"""A reservation whose child run was never created (or was deleted) is released when the
parent's children are settled this long after it was made."""
_KINDS: dict[str, type[ControlFlag]] = {"budget": BudgetFlag, "tokens": TokenFlag}


class Reserved(BaseModel):
    """What one live child reserved of its parent's room (None: that limit is not capped)."""

    model_config = ConfigDict(extra="forbid")
    budget: float | None = None
    tokens: int | None = None
    at: AwareDatetime | None = None
    """When it was reserved (a child never created is released `ABANDONED_AFTER` it)."""


class LiveChildren(BaseModel):
    """A parent's children that started and have not been released yet."""

    model_config = ConfigDict(extra="forbid")
    children: dict[str, Reserved] = Field(default_factory=dict)


async def live_children(runs: RunStore, parent_id: str) -> tuple[LiveChildren, int]:
    """The parent's live children and the record's version (0: none ever recorded)."""
    validate_id(parent_id, "run id")
    try:
        record = await runs.store.get_record(runs.tenant, CHILDREN_NAMESPACE, parent_id)
    except NotFoundError:
        return LiveChildren(), 0
    try:
        return LiveChildren.model_validate(record.value), record.version
    except ValidationError as exc:
        raise StoreCorruptError(
            f"the live-children record of run {parent_id!r} is damaged ({exc.errors()[0]['msg']}); "
            f"delete record {CHILDREN_NAMESPACE}/{parent_id} (its children's reservations go)"
        ) from exc


async def children_of(runs: RunStore, parent: RunIndex) -> list[RunIndex]:
    """The runs ``parent`` delegated to, in id (creation) order, read without listing
    the tenant's runs: every child is in the parent's live-children record from before
    it exists until it reported (then in the index's ``child_usage``)."""
    live, _ = await live_children(runs, parent.run_id)
    found = []
    for child_id in sorted({*parent.child_usage, *live.children}):
        try:
            child, _ = await runs.index(child_id)
        except NotFoundError:  # deleted, or a reservation whose run never came to be
            continue
        if child.parent_run_id == parent.run_id:
            found.append(child)
    return found


async def _put(runs: RunStore, parent_id: str, live: LiveChildren, version: int) -> None:
    value = live.model_dump(mode="json")
    await runs.store.put_record(
        runs.tenant, CHILDREN_NAMESPACE, parent_id, value, expected_version=version
    )


async def current_parent(runs: RunStore, parent: RunState) -> RunState:
    """A copy of ``parent`` with the usage its children reported since it was read."""
    fresh = parent.copy_state()
    try:
        index, _ = await runs.index(parent.run_id)
    except NotFoundError:
        return fresh  # not stored here (an imported or hand-made state)
    fresh.absorb_child_usage(index.child_usage)
    return fresh


def _spent(usage: Metrics | None, field: str) -> float:
    if usage is None:
        return 0.0
    return usage.accumulated_cost if field == "budget" else float(usage.usage.total)


def _held(parent: RunState, live: LiveChildren, field: str) -> float:
    """What live children reserved of ``field`` and have not reported spending yet (what
    they reported is in the parent's metrics already)."""
    total = 0.0
    for child, reserved in live.children.items():
        amount = getattr(reserved, field)
        if amount is not None:
            total += max(amount - _spent(parent.child_usage.get(child), field), 0.0)
    return round(total, COST_DIGITS)


def child_limits(
    parent: RunState, limits: Limits, live: LiveChildren | None = None
) -> tuple[Limits, Reserved]:
    """``limits`` of a new child of ``parent`` (changed in place) with budget and tokens
    capped by the parent's room minus what ``live`` children hold, and what it reserves.

    `LimitReachedError` (naming the fix) when nothing is left of a capped limit.
    """
    reserved: dict[str, float] = {}
    for field, kind in _KINDS.items():
        theirs: ControlFlag | None = getattr(parent.limits, field)
        room = None if theirs is None else theirs.remaining
        if theirs is None or room is None:
            continue
        held = _held(parent, live, field) if live is not None else 0.0
        left: float = round(room - held, COST_DIGITS)
        if kind.integral:
            left = int(left)  # whole tokens
        if left <= 0:
            raise _no_room(parent, field, theirs, held)
        mine: ControlFlag | None = getattr(limits, field)
        if mine is None:
            mine = kind(maximum=left)
            setattr(limits, field, mine)
        elif mine.maximum is None or mine.maximum > left:
            mine.maximum = left
        assert mine.maximum is not None
        reserved[field] = mine.maximum
    budget, tokens = reserved.get("budget"), reserved.get("tokens")
    tokens_reserved = None if tokens is None else int(tokens)
    return limits, Reserved(budget=budget, tokens=tokens_reserved, at=utcnow())


def _no_room(parent: RunState, field: str, flag: ControlFlag, held: float) -> LimitReachedError:
    run_id, keyword = parent.run_id, field  # `raise_limits` takes budget= and tokens=
    hint = (
        f"run {run_id} has no {field} left for another delegated run (used "
        f"{flag.current:g} of {flag.maximum or 0:g}; its live children hold {held:g}), so "
        f"nothing was started; raise its limit (runner.raise_limits({run_id!r}, "
        f"{keyword}=...)), or wait for a child to end (or cancel one), then delegate again"
    )
    return LimitReachedError(flag.name, flag.current + held, flag.maximum or 0.0, hint=hint)


async def reserve(
    runs: RunStore, parent: RunState, child_id: str, limits: Limits
) -> tuple[RunState, Limits]:
    """Reserve a new child's room: the parent as it is now (children's reports absorbed)
    and the child's capped limits (`child_limits`), recorded with compare-and-set."""
    for _ in range(_ATTEMPTS):
        # The record first, the index second: a child ending in between has reported
        # (index) before it released (record), so its usage counts either way.
        live, version = await live_children(runs, parent.run_id)
        fresh = await current_parent(runs, parent)
        capped, reserved = child_limits(fresh, limits.model_copy(deep=True), live)
        live.children = {**live.children, child_id: reserved}
        try:
            await _put(runs, parent.run_id, live, version)
        except ConflictError:
            continue  # a sibling reserved (or ended) meanwhile: read again
        return fresh, capped
    raise ConflictError(
        f"the children of run {parent.run_id!r} kept changing; delegate again to retry"
    )


async def release(runs: RunStore, parent_id: str, child_id: str) -> None:
    """Give back what a child reserved (nothing if it holds nothing)."""
    for _ in range(_ATTEMPTS):
        live, version = await live_children(runs, parent_id)
        if child_id not in live.children:
            return
        live.children = {k: v for k, v in live.children.items() if k != child_id}
        try:
            await _put(runs, parent_id, live, version)
            return
        except ConflictError:
            continue
    raise ConflictError(f"the children of run {parent_id!r} kept changing; could not release")


async def report_usage(runs: RunStore, child: RunState) -> None:
    """Report a delegated run's own usage so far to its parent (nothing for a root run);
    a finished child then releases its reservation."""
    parent_id = child.delegation.parent_run_id if child.delegation else None
    if parent_id is None:
        return
    await _report(runs, parent_id, child)
    if child.status in FINISHED:
        await release(runs, parent_id, child.run_id)


async def _report(runs: RunStore, parent_id: str, child: RunState) -> None:
    usage = child.local_metrics
    for _ in range(10):
        try:
            index, version = await runs.index(parent_id)
        except NotFoundError:
            return  # the parent was deleted, or lives in another store
        before = index.child_usage.get(child.run_id)
        if before == usage or (before is not None and before.calls > usage.calls):
            return  # reported already, or a newer report is there
        index.child_usage = {**index.child_usage, child.run_id: usage}
        try:
            await runs.put_index(index, expected_version=version)
            return
        except ConflictError:
            continue
    raise ConflictError(f"run {parent_id!r} kept changing; could not report {child.run_id}")


async def settle_children(
    runs: RunStore,
    parent_id: str,
    track: Callable[[RunState], Awaitable[None]] | None = None,
) -> list[str]:
    """Report the usage of the parent's live children that are not being driven (a
    crash may have lost their report) and release those that finished; the ids
    released. Idempotent: a report is a child's whole usage, a release happens once.
    ``track`` is given each such child's state (to bring its registry entry up to it)."""
    live, _ = await live_children(runs, parent_id)
    released: list[str] = []
    for child_id, reserved in live.children.items():
        try:
            index, _ = await runs.index(child_id)
        except NotFoundError:
            # Not created yet (its delegate is starting it), or never will be: the
            # process delegating died first, or the run was deleted since.
            if reserved.at is None or reserved.at < utcnow() - ABANDONED_AFTER:
                await release(runs, parent_id, child_id)
                released.append(child_id)
            continue
        try:
            check_not_held(index, None)
            state = (await runs.load(child_id))[0]
        except (ConflictError, NotFoundError):
            continue  # being driven, or never checkpointed
        except StatekeeperError:
            continue  # unreadable: its own load names the fix; the reservation stays
        await report_usage(runs, state)
        if track is not None:
            await track(state)
        if state.status in FINISHED:
            released.append(child_id)
    return released
