"""Where runs live: checkpoints in the session transcript, a small index record per run.

A step's messages and its checkpoint are written in one append (one transaction): the
checkpoint is a *side* entry hanging off the last message, so the transcript position
of a checkpoint is its parent. Nothing of a step is ever stored without the rest; the
step's events may go in the same append too (``save(events=...)``, what a runner in
write mode ``step`` does).

The index record (namespace ``runs``) is a cache for listing and lookup, updated after
the append. If a process dies between the two writes, loading rolls forward: it looks
for newer checkpoint entries of the run after the one the index names.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from statekeeper.codec import StateCodec
from statekeeper.core.messages import Message, utcnow
from statekeeper.core.tokens import DEFAULT_COUNTER, TokenCounter, message_tokens
from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidPayloadError,
    NotFoundError,
    StatekeeperError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id
from statekeeper.runs.history import CheckpointInfo, checkpoint_history, fork_run
from statekeeper.runs.index import (
    RunIndex,
    RunList,
    carry,
    checkpoint_id,
    decode_index,
    read_indexes,
    started_view,
)
from statekeeper.runs.index import check_not_held as check_not_held
from statekeeper.runs.index import index_of as _index_of
from statekeeper.runs.index import owner_alive as owner_alive
from statekeeper.runs.recovery import Loaded, load_latest
from statekeeper.runs.refs import resolve_events
from statekeeper.runs.sealing import CheckpointSeal
from statekeeper.runs.state import RunState
from statekeeper.sessions.manager import SessionManager
from statekeeper.sessions.view import appended_counters, build_view, message_draft
from statekeeper.stores.base import (
    Entry,
    EntryDraft,
    Event,
    EventBatch,
    EventDraft,
    SessionRecord,
    Store,
)

__all__ = ["CHECKPOINT_KIND", "RUNS_NAMESPACE", "Loaded", "RunIndex", "RunStore", "Saved"]

RUNS_NAMESPACE = "runs"
CHILDREN_NAMESPACE = "run-children"
"""Record namespace of each parent's live children (key: the parent's run id; see
`statekeeper.runs.rollup`)."""
_LIST_PAGE = 200
CHECKPOINT_KIND = "checkpoint"


class Saved(BaseModel):
    """Where a checkpoint went."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    state: RunState
    entries: list[Entry]
    session: SessionRecord
    index_version: int
    checkpoint_seq: int
    events: list[Event] = []
    """The events logged with the checkpoint (``save(events=...)``), in seq order."""


class RunStore:
    """Persistence of runs of one tenant."""

    def __init__(
        self,
        store: Store,
        tenant: str,
        *,
        counter: TokenCounter | None = None,
        codec: StateCodec | None = None,
    ) -> None:
        validate_id(tenant, "tenant")
        self.store = store
        self.tenant = tenant
        self.counter = counter or DEFAULT_COUNTER
        self.seal = CheckpointSeal(tenant, codec)
        """Seals stored checkpoints (compression and/or authenticated encryption)."""

    # -- index ---------------------------------------------------------------------------

    async def index(self, run_id: str) -> tuple[RunIndex, int]:
        """The run's index record and its version. `NotFoundError` if unknown."""
        validate_id(run_id, "run id")
        try:
            record = await self.store.get_record(self.tenant, RUNS_NAMESPACE, run_id)
        except NotFoundError:
            raise NotFoundError(f"run {run_id!r} not found") from None
        return decode_index(run_id, record.value), record.version

    async def put_index(self, index: RunIndex, *, expected_version: int | None) -> int:
        """Write the index with compare-and-set; returns the new version."""
        record = await self.store.put_record(
            self.tenant,
            RUNS_NAMESPACE,
            index.run_id,
            index.model_dump(mode="json", exclude={"failed_to_start"}),
            expected_version=expected_version,
        )
        return record.version

    async def create(self, state: RunState, *, owner: str | None = None, ttl: float = 300.0) -> int:
        """Register a new run (before its first checkpoint). `AlreadyExistsError` if taken.

        ``owner`` holds it from the start (for ``ttl`` seconds): until its first
        checkpoint a run no live process holds counts as failed to start (`started_view`).
        """
        session = await self.store.get_session(self.tenant, state.session_id)
        state.transcript_seq = session.head_seq  # where the run starts (see `history`)
        index = _index_of(state, checkpoint_seq=session.last_seq)
        if owner is not None:
            index.owner, index.lease_until = owner, utcnow() + timedelta(seconds=ttl)
        try:
            return await self.put_index(index, expected_version=0)
        except ConflictError:
            raise AlreadyExistsError(f"run {state.run_id!r} already exists") from None

    async def list(
        self,
        *,
        status: str | None = None,
        session_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> RunList:
        """Runs in id order (ids sort by creation time), optionally filtered; index
        records that cannot be read are reported in ``corrupt``, not left out. A run
        whose process died before its first checkpoint is listed as failed to start
        (`started_view`)."""
        out = RunList()
        cursor = after
        while len(out) < limit:
            page = await self.store.list_records(
                self.tenant, RUNS_NAMESPACE, after_key=cursor, limit=_LIST_PAGE
            )
            found = read_indexes(page)
            out.corrupt += found.corrupt
            out += [
                index
                for index in [await self._started(index) for index in found]
                if (status is None or index.status == status)
                and (session_id is None or index.session_id == session_id)
            ]
            if len(page) < _LIST_PAGE:  # the end (damaged rows fill no places)
                break
            cursor = page[-1].key
        del out[limit:]
        return out

    async def _started(self, index: RunIndex) -> RunIndex:
        """``index``, or for a run that seems to have failed to start what loading says:
        its first checkpoint may be there after all, written just before its process
        died (the index is written after the checkpoint)."""
        view = started_view(index)
        if not view.failed_to_start:
            return index
        with contextlib.suppress(StatekeeperError):
            return (await self.load_latest(index.run_id)).index
        return view

    # -- checkpoints ---------------------------------------------------------------------

    async def save(
        self,
        state: RunState,
        messages: Sequence[Message] = (),
        *,
        index_version: int | None,
        session_version: int | None = None,
        owner: str | None = None,
        lease_until: datetime | None = None,
        update_index: bool = True,
        events: EventBatch | None = None,
    ) -> Saved:
        """Append ``messages`` and the checkpoint atomically, then update the index.

        ``state.revision`` is advanced here. ``session_version`` makes the append a
        compare-and-set on the session (for decisions made outside a running runner).
        ``update_index=False`` skips the index write (a running runner writes it only
        when its status or lease changes: `load` finds the newest checkpoint past the
        index anyway; `index_saved` writes it later). ``events`` are logged in the same
        append (`Saved.events`).
        """
        tokens = [message_tokens(m, self.counter) for m in messages]
        state.revision += 1
        state.updated_at = utcnow()
        drafts = [message_draft(m, n) for m, n in zip(messages, tokens, strict=True)]
        drafts.append(
            EntryDraft(
                id=checkpoint_id(state.run_id, state.revision),
                kind=CHECKPOINT_KIND,
                payload=self.seal.seal(state),
                side=True,
            )
        )
        patch = appended_counters(len(messages), sum(tokens))
        try:
            result = await self.store.append_entries(
                self.tenant,
                state.session_id,
                drafts,
                expected_version=session_version,
                patch=patch,
                events=events,
            )
        except BaseException:
            state.revision -= 1
            raise
        checkpoint = result.entries[-1]
        state.transcript_seq = checkpoint.parent_seq or 0
        version = index_version or 0
        if update_index:
            version = await self.index_saved(
                state, checkpoint.seq, index_version, owner=owner, lease_until=lease_until
            )
        return Saved(
            state=state,
            entries=result.entries[:-1],
            session=result.session,
            index_version=version,
            checkpoint_seq=checkpoint.seq,
            events=result.events,
        )

    async def index_saved(
        self,
        state: RunState,
        checkpoint_seq: int,
        index_version: int | None,
        *,
        owner: str | None,
        lease_until: datetime | None,
    ) -> int:
        """Point the run's index at its checkpoint at ``checkpoint_seq`` (a write of its
        own, after the append: the index is a cache); the index's new version."""
        index = _index_of(state, checkpoint_seq=checkpoint_seq)
        index.owner, index.lease_until = owner, lease_until
        return await self._put_keeping_cancel(index, index_version)

    async def _put_keeping_cancel(self, index: RunIndex, expected_version: int | None) -> int:
        """Write ``index``; when others wrote meanwhile (a reader rolling it forward, a
        cancel request, a decision's checkpoint) keep what they wrote, and never point
        the index back at an older checkpoint than the one it names."""
        for _ in range(10):
            try:
                return await self.put_index(index, expected_version=expected_version)
            except ConflictError:
                current, expected_version = await self.index(index.run_id)
                if current.checkpoint_seq > index.checkpoint_seq:
                    return expected_version  # a newer checkpoint is indexed: it stands
                carry(index, current)
        raise ConflictError(f"run {index.run_id!r} kept changing; could not index it")

    async def release(
        self, state: RunState, *, owner: str | None, checkpoint_seq: int | None
    ) -> None:
        """Bring the index up to ``state`` (if it was checkpointed at ``checkpoint_seq``)
        and drop ``owner``'s lease. Compare-and-set, keeping others' cancel requests."""
        for _ in range(10):
            index, version = await self.index(state.run_id)
            if checkpoint_seq is not None and checkpoint_seq >= index.checkpoint_seq:
                fresh = carry(_index_of(state, checkpoint_seq=checkpoint_seq), index)
                fresh.owner, fresh.lease_until = index.owner, index.lease_until
                index = fresh
            if index.owner == owner:
                index.owner = index.lease_until = None
            try:
                await self.put_index(index, expected_version=version)
                return
            except ConflictError:
                continue
        raise ConflictError(f"run {state.run_id!r} kept changing; could not release it")

    async def load(self, run_id: str) -> tuple[RunState, int, int]:
        """The run's latest checkpoint, its index version and the session version."""
        loaded = await self.load_latest(run_id)
        return loaded.state, loaded.index_version, loaded.session_version

    async def load_latest(self, run_id: str) -> Loaded:
        """The run's newest intact checkpoint, with the index rolled forward to it.

        Corrupt checkpoints newer than it are skipped (`Loaded.skipped`) and reported
        once in the run's event log; `CheckpointCorruptError` if nothing intact is left
        (see `statekeeper.runs.recovery`).
        """
        return await load_latest(self, run_id)

    def decode(self, entry: Entry, run_id: str) -> RunState:
        """The run state in a checkpoint entry of ``run_id`` (opened with the seal)."""
        return RunState.from_data(self.seal.open(entry.payload, run_id))

    async def roll_forward(
        self, index: RunIndex, version: int, state: RunState, checkpoint_seq: int
    ) -> tuple[RunIndex, int]:
        """Bring the index up to ``state``, keeping its lease and cancel flag; best effort
        (the index is a cache: if someone else wrote it meanwhile, theirs stays)."""
        fresh = carry(_index_of(state, checkpoint_seq=checkpoint_seq), index)
        fresh.owner, fresh.lease_until = index.owner, index.lease_until
        try:
            return fresh, await self.put_index(fresh, expected_version=version)
        except ConflictError:
            return await self.index(state.run_id)

    async def events(self, run_id: str) -> builtins.list[Event]:
        """The run's event log, with the text its events name filled in from the
        session (`statekeeper.runs.refs`)."""
        index, _ = await self.index(run_id)
        events = await self.store.read_events(self.tenant, run_id)
        return await resolve_events(self.store, self.tenant, index.session_id, events)

    # -- time travel ---------------------------------------------------------------------

    async def history(self, run_id: str) -> builtins.list[CheckpointInfo]:
        """The run's checkpoints, oldest first: step, status, turn, time, what each added."""
        return await checkpoint_history(self, run_id)

    async def fork(
        self,
        run_id: str,
        *,
        at: int | None = None,
        state_update: Mapping[str, Any] | None = None,
        new_run_id: str | None = None,
        title: str | None = None,
    ) -> RunState:
        """A new run from checkpoint ``at`` of ``run_id`` (a ``step`` of `history`; None:
        the newest one not finished), on a session forked there (nothing is copied).

        ``state_update`` sets run state fields of the new run (metadata, limits ...). The
        new run is stopped (PAUSED where the original was running): resume it, with new
        input if you like (`Runner.fork` does both). See `statekeeper.runs.history`.
        """
        return await fork_run(
            self, run_id, at=at, state_update=state_update, new_run_id=new_run_id, title=title
        )

    async def request_cancel(self, run_id: str) -> RunIndex:
        """Flag the run for cancellation; a running runner stops before its next step."""
        for _ in range(10):
            index, version = await self.index(run_id)
            index.cancel_requested = True
            try:
                await self.put_index(index, expected_version=version)
                return index
            except ConflictError:
                continue
        raise ConflictError(f"run {run_id!r} kept changing; retry the cancel")

    async def claim(
        self, run_id: str, owner: str, *, ttl: float = 300.0, take_over: bool = False
    ) -> int:
        """Take the run's lease for ``owner``.

        Another owner's unexpired lease raises `ConflictError`, unless that owner is a
        process on this host that no longer exists, or ``take_over`` is set.
        """
        index, version = await self.index(run_id)
        if not take_over:
            check_not_held(index, owner)
        index.owner, index.lease_until = owner, utcnow() + timedelta(seconds=ttl)
        return await self.put_index(index, expected_version=version)

    # -- moving runs between stores -------------------------------------------------------

    async def export(self, run_id: str) -> str:
        """A self-contained JSON snapshot: the checkpoint, the messages the run sees and
        its event log (so inspection's model responses and timeline survive the move)."""
        state, _, _ = await self.load(run_id)
        manager = SessionManager(self.store, self.tenant, max_messages=None)
        record = await self.store.get_session(self.tenant, state.session_id)
        branch = await manager.load_branch(record, state.transcript_seq)
        events = await self.store.read_events(self.tenant, run_id)
        return state.to_json(
            items=build_view(branch).messages,
            events=[
                {"stream": e.stream, "kind": e.kind, "ts": e.ts.isoformat(), "payload": e.payload}
                for e in events
            ],
        )

    async def import_(
        self, snapshot: str | bytes, *, run_id: str | None = None, session_id: str | None = None
    ) -> RunState:
        """Recreate an exported run here: a new session holding its messages, and the run.

        Ids default to the exported ones; pass new ones if they are taken here.
        """
        state = RunState.from_json(snapshot)
        items = state.messages()
        events = _event_drafts(state.events or [])
        state.items = None
        state.events = None
        state.tenant = self.tenant
        state.run_id = validate_id(run_id, "run id") if run_id else state.run_id
        state.session_id = validate_id(session_id, "session id") if session_id else state.session_id
        state.revision = 0
        try:
            await self.index(state.run_id)
        except NotFoundError:
            pass
        else:
            raise AlreadyExistsError(f"run {state.run_id!r} already exists; pass a new run_id")
        await self.store.create_session(
            SessionRecord(id=state.session_id, tenant=self.tenant, agent_id=state.agent)
        )
        try:
            index_version = await self.create(state)
            await self.save(state, items, index_version=index_version)
            if events:
                await self.store.append_events(self.tenant, state.run_id, events)
        except BaseException:
            await self._undo_import(state)
            raise
        return state

    async def _undo_import(self, state: RunState) -> None:
        """Remove what a failed `import_` created (its run index, then its new session)."""
        with contextlib.suppress(StatekeeperError):
            await self.store.delete_event_log(self.tenant, state.run_id)
        with contextlib.suppress(StatekeeperError):
            await self.store.delete_record(self.tenant, RUNS_NAMESPACE, state.run_id)
        with contextlib.suppress(StatekeeperError):
            await self.store.delete_session(self.tenant, state.session_id)

    # -- retention -----------------------------------------------------------------------

    async def delete(self, run_id: str) -> None:
        """Delete the run's index, events and checkpoints (its messages stay in the session).
        A damaged index is deleted too (its checkpoints, found through it, then stay)."""
        try:
            index: RunIndex | None = (await self.index(run_id))[0]
        except StoreCorruptError:
            index = None
        with contextlib.suppress(NotFoundError):  # the session may be gone already
            if index is not None:
                await self.store.prune_entries(
                    self.tenant,
                    index.session_id,
                    kind=CHECKPOINT_KIND,
                    before_seq=2**62,
                    id_prefix=f"{run_id}.c",
                )
        await self.store.delete_event_log(self.tenant, run_id)
        with contextlib.suppress(NotFoundError):  # its children's reservations, if any
            await self.store.delete_record(self.tenant, CHILDREN_NAMESPACE, run_id)
        await self.store.delete_record(self.tenant, RUNS_NAMESPACE, run_id)

    async def delete_before(self, when: datetime) -> builtins.list[str]:
        """Delete runs last updated before ``when``; returns their ids."""
        doomed = [r.run_id for r in await self.list(limit=10**9) if r.updated_at < when]
        for run_id in doomed:
            await self.delete(run_id)
        return doomed

    async def prune_checkpoints(self, run_id: str) -> int:
        """Delete every checkpoint of the run's session older than the run's latest one."""
        index, _ = await self.index(run_id)
        return await self.store.prune_entries(
            self.tenant,
            index.session_id,
            kind=CHECKPOINT_KIND,
            before_seq=index.checkpoint_seq,
            id_prefix=f"{run_id}.c",
        )


def _event_drafts(raw: builtins.list[dict[str, Any]]) -> builtins.list[EventDraft]:
    """The exported events as drafts to append, or `InvalidPayloadError` naming the bad one."""
    try:
        return [EventDraft.model_validate(item) for item in raw]
    except ValidationError as exc:
        raise InvalidPayloadError(
            f"the snapshot's events are not valid ({exc.errors()[0]['msg']}); export the run again"
        ) from exc
