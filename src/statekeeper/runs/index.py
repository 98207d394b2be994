"""`RunIndex`: the small, listable record of a run (namespace ``runs``).

A cache for listing and lookup, kept by `statekeeper.runs.store.RunStore`: loading
rolls forward past it to the newest checkpoint (see ``docs/runs.md``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, ValidationError

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import utcnow
from statekeeper.core.metrics import Metrics
from statekeeper.errors import ConflictError, StoreCorruptError
from statekeeper.runs.state import FAILED_TO_START, RunState
from statekeeper.stores.base import CorruptItem, VersionedRecord

__all__ = [
    "FAILED_TO_START",
    "RunIndex",
    "RunList",
    "carry",
    "check_not_held",
    "checkpoint_id",
    "decode_index",
    "held",
    "index_of",
    "owner_alive",
    "read_indexes",
    "started_view",
]


class RunIndex(BaseModel):
    """The small, listable record of a run."""

    model_config = ConfigDict(extra="forbid")
    run_id: str
    session_id: str
    agent: str
    status: str
    turn: int = 0
    revision: int = 0
    checkpoint_seq: int = 0
    group_id: str | None = None
    parent_run_id: str | None = None
    headless: bool = True
    cancel_requested: bool = False
    child_usage: dict[str, Metrics] = Field(default_factory=dict)
    """What delegated children reported they used (see `statekeeper.runs.rollup`)."""
    owner: str | None = None
    lease_until: AwareDatetime | None = None
    created_at: AwareDatetime = Field(default_factory=utcnow)
    updated_at: AwareDatetime = Field(default_factory=utcnow)
    failed_to_start: bool = False
    """Derived, never stored: the run was registered but never checkpointed, and no live
    process holds it any more (see `started_view`); ``status`` then says ``error``
    (``cancelled`` once a cancel was requested)."""


_ENDED = frozenset({AgentStatus.COMPLETED, AgentStatus.CANCELLED, AgentStatus.ERROR})
"""Statuses an index of a run with no checkpoint never has unless written so on purpose."""


def owner_alive(owner: str | None) -> bool:
    """False only when ``owner`` ("host:pid:...") is a process of this host that is gone."""
    if owner is None:
        return False
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return True  # cannot tell from here: trust the lease
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def held(index: RunIndex, owner: str | None = None) -> bool:
    """Whether a live process other than ``owner`` holds the run's lease."""
    now = utcnow()
    leased = index.owner not in (None, owner) and index.lease_until and index.lease_until > now
    return bool(leased) and owner_alive(index.owner)


def check_not_held(index: RunIndex, owner: str | None) -> None:
    """`ConflictError` if a live process other than ``owner`` holds the run's lease."""
    if held(index, owner):
        raise ConflictError(
            f"run {index.run_id!r} is being run by {index.owner} until {index.lease_until:%H:%M:%S}"
        )


def started_view(index: RunIndex) -> RunIndex:
    """``index`` as readers should see it: a run registered but never checkpointed
    (revision 0) that no live process holds any more failed to start (its process died
    before the first checkpoint) and is shown ``error``, or ``cancelled`` once a cancel
    was requested, with ``failed_to_start`` set and no lease. A run still being started
    is as is."""
    if index.revision != 0 or index.status in _ENDED or index.failed_to_start or held(index):
        return index
    status = AgentStatus.CANCELLED if index.cancel_requested else AgentStatus.ERROR
    # The lease of a dead process is no one's: the view does not say it is running.
    update = {"status": str(status), "failed_to_start": True, "owner": None, "lease_until": None}
    return index.model_copy(update=update)


def index_of(state: RunState, *, checkpoint_seq: int) -> RunIndex:
    """The index record of ``state``, checkpointed at ``checkpoint_seq`` (no lease)."""
    return RunIndex(
        run_id=state.run_id,
        session_id=state.session_id,
        agent=state.agent,
        status=state.status,
        turn=state.turn,
        revision=state.revision,
        checkpoint_seq=checkpoint_seq,
        group_id=state.group_id,
        parent_run_id=state.delegation.parent_run_id if state.delegation else None,
        headless=state.headless,
        cancel_requested=state.cancel_requested,
        child_usage=state.child_usage,
        created_at=state.created_at,
        updated_at=state.updated_at,
    )


def checkpoint_id(run_id: str, revision: int) -> str:
    """The entry id of a run's checkpoint: unique, so a retried write is idempotent."""
    return f"{run_id}.c{revision}"


def carry(index: RunIndex, current: RunIndex) -> RunIndex:
    """``index`` keeping what others wrote into ``current``, the stored record: a cancel
    request, and the usage reports of delegated children (the stored ones are newest)."""
    index.cancel_requested = index.cancel_requested or current.cancel_requested
    index.child_usage = {**index.child_usage, **current.child_usage}
    return index


def decode_index(run_id: str, value: JsonValue) -> RunIndex:
    """A stored run index; `StoreCorruptError` naming the run and the fix if it is not one."""
    try:
        return RunIndex.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "index"
        raise StoreCorruptError(
            f"the index of run {run_id!r} is not a run index ({where}: {first['msg']}); "
            f"delete it (`statekeeper runs delete {run_id}`, or RunStore.delete); the "
            "run's checkpoints stay in its session's transcript"
        ) from exc


class RunList(list[RunIndex]):
    """What `RunStore.list` returns: the runs (a list), and ``corrupt``: the index records
    that could not be read (each with the error naming the fix), never silently left out."""

    def __init__(self, runs: Iterable[RunIndex] = (), corrupt: Iterable[CorruptItem] = ()):
        super().__init__(runs)
        self.corrupt: list[CorruptItem] = list(corrupt)


def read_indexes(records: Sequence[VersionedRecord]) -> RunList:
    """The run indexes among listed records; those that cannot be read (and those the
    listing reported damaged) in ``corrupt``."""
    out = RunList(corrupt=list(getattr(records, "corrupt", [])))
    for record in records:
        try:
            out.append(decode_index(record.key, record.value))
        except StoreCorruptError as exc:
            out.corrupt.append(CorruptItem(id=record.key, error=str(exc)))
    return out
