"""Finding a run's newest intact checkpoint, skipping corrupt ones (and saying so).

A checkpoint is corrupt when its stored row cannot be decoded (the store reads it back
as a ``corrupt`` entry) or when it decodes but is not a valid run state of that run. A
corrupt checkpoint is never silently used and never hides the intact ones before it:
loading skips it, goes back to the newest checkpoint that is intact, and reports what it
skipped (`SkippedCheckpoint`). Only when no intact checkpoint is left does loading fail,
with `CheckpointCorruptError`.

A checkpoint that cannot be opened for another reason (a sealed one and no codec, a
wrong key, a schema newer than this library) is not corrupt: that error is raised as is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from statekeeper.codec import StateTamperedError, WrongKeyError
from statekeeper.errors import (
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
    StoreCorruptError,
)
from statekeeper.runs.index import FAILED_TO_START, RunIndex, started_view
from statekeeper.runs.state import ErrorDetails, RunState, TraceState
from statekeeper.stores.base import Entry, EntryKind, EventDraft, Store

__all__ = [
    "CORRUPT_EVENT_TYPE",
    "CheckpointCorruptError",
    "CheckpointReader",
    "Loaded",
    "Scan",
    "SkippedCheckpoint",
    "failed_start",
    "is_checkpoint_of",
    "load_latest",
    "problem_of",
    "report_skipped",
    "revision_of",
]

CHECKPOINT_KIND = "checkpoint"
_PAGE = 64  # entries read at a time, back from the session's end
CORRUPT_EVENT_TYPE = "checkpoint_corrupt"
"""``payload["type"]`` of the ``error/error`` event that reports a skipped checkpoint."""


class CheckpointReader(Protocol):
    """What loading needs of a `RunStore` (which this module does not import)."""

    store: Store
    tenant: str

    async def index(self, run_id: str) -> tuple[RunIndex, int]: ...

    def decode(self, entry: Entry, run_id: str) -> RunState: ...

    async def roll_forward(
        self, index: RunIndex, version: int, state: RunState, checkpoint_seq: int
    ) -> tuple[RunIndex, int]: ...


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint loading skipped because it is corrupt."""

    id: str
    """The checkpoint's entry id (``<run>.c<revision>``)."""
    seq: int
    """Its position in the session's entries."""
    reason: str
    """Why it could not be used."""


class CheckpointCorruptError(StoreCorruptError):
    """Every checkpoint of a run that could be loaded is corrupt: nothing intact is left.

    ``skipped`` lists them, newest first.
    """

    def __init__(self, run_id: str, skipped: Sequence[SkippedCheckpoint]) -> None:
        named = "; ".join(f"{s.id} (entry {s.seq}): {s.reason}" for s in skipped[:5])
        super().__init__(
            f"run {run_id!r} cannot be loaded: its checkpoints are corrupt and no intact one "
            f"is left ({named}). Restore the store from a backup, or import an export of the "
            f"run (RunStore.import_ / `statekeeper runs import`); delete the broken run with "
            f"RunStore.delete"
        )
        self.run_id = run_id
        self.skipped = list(skipped)


@dataclass
class Scan:
    """A search for a run's newest intact checkpoint, newest entries first."""

    run_id: str
    decode: Callable[[Entry], RunState]
    at_seq: int | None = None
    """Where the run's index says its checkpoint is (see `is_checkpoint_of`)."""
    entry: Entry | None = None
    """The newest intact checkpoint, once found."""
    state: RunState | None = None
    """Its state."""
    skipped: list[SkippedCheckpoint] = field(default_factory=list)
    """Corrupt checkpoints newer than it, newest first."""
    top_revision: int = 0
    """The highest revision of any checkpoint looked at (intact or not): a run loaded
    from an older checkpoint writes its next one past it, under a fresh id."""

    def look(self, entries: Sequence[Entry]) -> bool:
        """Look through ``entries`` (older than any looked at before); True once found."""
        mine = [e for e in entries if is_checkpoint_of(e, self.run_id, at_seq=self.at_seq)]
        revisions = (revision_of(e.id, self.run_id) or 0 for e in mine)
        self.top_revision = max(self.top_revision, *revisions, 0)
        for entry in reversed(mine):
            problem = problem_of(entry, self.run_id, self.decode)
            if isinstance(problem, RunState):
                self.entry, self.state = entry, problem
                return True
            self.skipped.append(SkippedCheckpoint(entry.id, entry.seq, problem))
        return False


@dataclass(frozen=True)
class Loaded:
    """A run's newest intact checkpoint, as `RunStore.load_latest` found it."""

    state: RunState
    index: RunIndex
    """The run's index record, rolled forward to ``state``."""
    index_version: int
    session_version: int
    checkpoint_id: str
    checkpoint_seq: int
    skipped: list[SkippedCheckpoint]
    """Corrupt checkpoints newer than this one, newest first (empty when all is well).

    A run that failed to start (``index.failed_to_start``) has no checkpoint:
    ``checkpoint_id`` is empty and ``state`` is `failed_start`'s view."""


_LOOKS = 8  # reads of a run racing its runner's index writes before the last is kept


async def load_latest(runs: CheckpointReader, run_id: str) -> Loaded:
    """See `RunStore.load_latest`.

    Read again when rolling the index forward lost to a write indexing a newer
    checkpoint: the index and the checkpoint given always go together (a run view said
    ``waiting_for_approval`` with the pending call of the checkpoint before)."""
    for _ in range(_LOOKS - 1):
        loaded = await _load_once(runs, run_id)
        if loaded.index.checkpoint_seq <= loaded.checkpoint_seq:
            return loaded
    return await _load_once(runs, run_id)


async def _load_once(runs: CheckpointReader, run_id: str) -> Loaded:
    index, version = await runs.index(run_id)
    at_seq = index.checkpoint_seq if index.revision else None
    scan = Scan(run_id, lambda e: runs.decode(e, run_id), at_seq=at_seq)
    since = max(index.checkpoint_seq - 1, 0)
    read, tenant, session_id = runs.store.read_entries, runs.tenant, index.session_id
    session = await runs.store.get_session(tenant, session_id)
    # Normally the newest checkpoint is at or after the one the index names, and among
    # the session's last entries (a running run's index is written only now and then):
    # read back from the end a page at a time, so a stale index costs no long scan.
    # Older entries are read only when nothing intact is there.
    top, found = session.last_seq, False
    while not found and top > since:
        low = max(since, top - _PAGE)
        found = scan.look(await read(tenant, session_id, after_seq=low, until_seq=top))
        top = low
    if not found and since and index.revision:
        scan.look(await read(tenant, session_id, until_seq=since))
    if scan.entry is None or scan.state is None:
        if scan.skipped:
            raise CheckpointCorruptError(run_id, scan.skipped)
        if index.revision == 0:  # registered, never checkpointed
            view = started_view(index)
            if not view.failed_to_start:  # a live process is still starting it
                raise NotFoundError(f"run {run_id!r} has no checkpoint yet")
            state = failed_start(view, tenant, owner=index.owner)
            return Loaded(state, view, version, session.version, "", index.checkpoint_seq, [])
        raise StoreCorruptError(
            f"run {run_id!r}: checkpoint {index.checkpoint_seq} is missing from session "
            f"{session_id!r}"
        )
    state, entry = scan.state, scan.entry
    state.transcript_seq = entry.parent_seq or 0
    state.cancel_requested = state.cancel_requested or index.cancel_requested
    state.absorb_child_usage(index.child_usage)  # delegated children's reports
    if scan.skipped:  # the next checkpoint must not reuse a skipped one's id
        state.revision = max(state.revision, scan.top_revision, index.revision)
    if entry.seq != index.checkpoint_seq or index.revision != state.revision:
        index, version = await runs.roll_forward(index, version, state, entry.seq)
    if scan.skipped:
        await report_skipped(runs.store, tenant, state, entry.id, scan.skipped)
    return Loaded(state, index, version, session.version, entry.id, entry.seq, scan.skipped)


def failed_start(index: RunIndex, tenant: str, *, owner: str | None = None) -> RunState:
    """The state shown for a run that failed to start (`started_view`): what its index
    knows, status ``error`` (``cancelled`` once cancelled), revision 0, and an error
    of type ``FailedToStart`` saying what happened (``owner``: the process that held
    it). Nothing of it is stored: if the process that started it writes a checkpoint
    after all, that is what loads."""
    starter = f"process {owner}" if owner else "the process that started it"
    message = (
        f"run {index.run_id} failed to start: {starter} stopped before the run's first "
        f"checkpoint, so nothing of the run was saved. Start a new run, and delete this "
        f"one (RunStore.delete, or `statekeeper runs delete {index.run_id}`)"
    )
    return RunState(
        run_id=index.run_id,
        group_id=index.group_id,
        tenant=tenant,
        session_id=index.session_id,
        agent=index.agent,
        status=index.status,
        headless=index.headless,
        error=ErrorDetails(type=FAILED_TO_START, message=message, at=index.updated_at),
        trace=TraceState(trace_id=f"trace_{index.run_id}"),
        cancel_requested=index.cancel_requested,
        created_at=index.created_at,
        updated_at=index.updated_at,
    )


async def report_skipped(
    store: Store,
    tenant: str,
    state: RunState,
    loaded: str,
    skipped: Sequence[SkippedCheckpoint],
) -> None:
    """Log an ``error/error`` event per skipped checkpoint not reported before."""
    reported = {
        event.payload.get("checkpoint")
        for event in await store.read_events(tenant, state.run_id)
        if event.stream == "error" and event.payload.get("type") == CORRUPT_EVENT_TYPE
    }
    events = [_corrupt_event(state, loaded, item) for item in skipped if item.id not in reported]
    if events:
        await store.append_events(tenant, state.run_id, events)


def _corrupt_event(state: RunState, loaded: str, item: SkippedCheckpoint) -> EventDraft:
    message = (
        f"checkpoint {item.id} (entry {item.seq}) of run {state.run_id} is corrupt "
        f"({item.reason}); the run was loaded from checkpoint {loaded} (turn {state.turn})"
    )
    payload = {
        "message": message[:2000],
        "type": CORRUPT_EVENT_TYPE,
        "checkpoint": item.id,
        "seq": item.seq,
        "loaded": loaded,
        "turn": state.turn,
        "trace_id": state.trace.trace_id,
    }
    return EventDraft(stream="error", kind="error", payload=payload)


def revision_of(entry_id: str, run_id: str) -> int | None:
    """The revision in a checkpoint id ``<run>.c<revision>``, None if it is not one."""
    prefix = f"{run_id}.c"
    tail = entry_id[len(prefix) :] if entry_id.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def is_checkpoint_of(entry: Entry, run_id: str, *, at_seq: int | None = None) -> bool:
    """Whether ``entry`` is (or, undecodable, was) a checkpoint of ``run_id``.

    An undecodable row counts when its id names the run, or when it sits at ``at_seq``
    (where the run's index says its checkpoint is: the row's id may be lost too).
    """
    if entry.kind == CHECKPOINT_KIND:
        return entry.payload.get("run_id") == run_id
    if entry.kind == EntryKind.CORRUPT:
        return revision_of(entry.id, run_id) is not None or entry.seq == at_seq
    return False


def problem_of(entry: Entry, run_id: str, decode: Callable[[Entry], RunState]) -> RunState | str:
    """The state in a checkpoint ``entry`` of ``run_id``, or why it is corrupt.

    Errors that are not the checkpoint's fault (a wrong key, no codec) are raised."""
    if entry.kind == EntryKind.CORRUPT:
        return f"the stored row cannot be decoded: {entry.payload.get('error', 'unknown')}"
    try:
        state = decode(entry)
    except WrongKeyError:
        raise  # the key is wrong, not the checkpoint
    except (InvalidPayloadError, StateTamperedError) as exc:
        return str(exc)
    except InvalidInputError:
        raise  # e.g. a sealed checkpoint and no codec: a setup error, not corruption
    except (ValueError, TypeError, KeyError) as exc:  # undecodable sealed bytes
        return f"{type(exc).__name__}: {exc}"
    if state.run_id != run_id:
        return f"it holds the state of run {state.run_id!r}"
    return state
