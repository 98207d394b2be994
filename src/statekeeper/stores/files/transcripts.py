"""Transcripts of the plain-files store: appends through the engine, reads and pruning.

A mixin of `FileStore`: each method runs under the session's lock on the store's worker
(`FileStore._in_session`). The engine's token is the transcript's ``gen``.

An append's events (``append_entries(events=...)``) are written to their event log right
after the head is replaced (the append's commit point), still under the session's lock:
two files cannot change in one step, so a crash between the two leaves the entries
without their events, never events without their entries.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from statekeeper.core.messages import utcnow
from statekeeper.errors import NotFoundError
from statekeeper.ids import validate_id
from statekeeper.stores.base import Entry, SessionPatch, SessionRecord
from statekeeper.stores.engine import AppendEngine, EventWrite, Snapshot, Write
from statekeeper.stores.engine_writes import EngineWrites
from statekeeper.stores.files.layout import Layout, read_at
from statekeeper.stores.files.logs import (
    EPOCH,
    entry_line,
    header_line,
    holds_payload,
    new_gen,
    with_payload,
)
from statekeeper.stores.files.records import EventFiles
from statekeeper.stores.files.sessions import SessionCtx, SessionFiles
from statekeeper.stores.rules import (
    apply_patch,
    check_prunable_kind,
    check_read,
    check_rewrites,
    check_tenant_and_id,
    prunable,
)

__all__ = ["FileTranscripts"]

T = TypeVar("T")


class FileTranscripts(EngineWrites):
    """Transcript entries in ``<tenant>/sessions/<id>.jsonl`` (see `statekeeper.stores.files`)."""

    _files: Layout
    _sessions: SessionFiles
    _events: EventFiles
    _engine: AppendEngine

    async def _in_session(self, tenant: str, session_id: str, fn: Callable[[SessionCtx], T]) -> T:
        raise NotImplementedError  # FileStore's

    # -- transcripts ---------------------------------------------------------------------

    def _snapshot(self, ctx: SessionCtx, ids: Sequence[str]) -> Snapshot:
        """The head and stored entries among ``ids``, under the session's lock."""
        fd, index = self._sessions.open_log(ctx, write=False)
        try:
            known = sorted(index.ids[i] for i in ids if i in index.ids)
            found = self._sessions.read_lines(fd, index, known) if fd is not None and known else []
        finally:
            if fd is not None:
                os.close(fd)
        return Snapshot(ctx.head.gen, ctx.head.record, {e.id: e for e in found})

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        """The engine's read primitive."""
        return await self._in_session(tenant, session_id, lambda ctx: self._snapshot(ctx, ids))

    async def commit_head(
        self,
        tenant: str,
        session_id: str,
        base: Snapshot,
        head: SessionRecord,
        writes: Sequence[Write],
        ids: Sequence[str],
        *,
        events: Sequence[EventWrite] = (),
    ) -> Snapshot | None:
        """The engine's write primitive: compare (gen, version) and ids under the lock;
        ``events`` are logged once the head is written (see the module docstring)."""
        sessions = self._sessions

        def log(ctx: SessionCtx) -> None:
            for write in events:
                logged = self._events.append(ctx.tenant, write.log_id, write.drafts, write.texts)
                write.stored(logged[0].seq)

        def commit(ctx: SessionCtx) -> Snapshot | None:
            stored = ctx.head
            if (stored.gen, stored.record.version) != (base.token, base.record.version):
                return self._snapshot(ctx, ids)
            if not writes:
                sessions.save_head(ctx, head, stored.gen, stored.size)
                log(ctx)
                return None
            fd, index = sessions.open_log(ctx, write=True)
            assert fd is not None
            try:
                taken = any(i in index.ids for i in ids)
                if not taken:
                    lines = "".join(entry_line(e, text, side) for e, text, side in writes)
                    end = sessions.write_lines(ctx, fd, index, lines.encode())
                    # The commit point: the head now says the new lines are part of the log.
                    sessions.save_head(ctx, head, stored.gen, end)
            except BaseException:
                sessions.indexes.pop(ctx.key, None)  # it may hold lines never committed
                raise
            finally:
                os.close(fd)
            if taken:
                return self._snapshot(ctx, ids)
            log(ctx)
            return None

        return await self._in_session(tenant, session_id, commit)

    async def read_entries(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        check_tenant_and_id(tenant, session_id)
        check_read(after_seq, until_seq, limit)

        def read(ctx: SessionCtx) -> list[Entry]:
            fd, index = self._sessions.open_log(ctx, write=False)
            if fd is None:
                return []
            try:
                positions = index.positions(after_seq, until_seq, limit)
                return self._sessions.read_lines(fd, index, positions)
            finally:
                os.close(fd)

        return await self._in_session(tenant, session_id, read)

    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        check_tenant_and_id(tenant, session_id)
        validate_id(entry_id, "entry id")

        def get(ctx: SessionCtx) -> Entry:
            fd, index = self._sessions.open_log(ctx, write=False)
            try:
                position = index.ids.get(entry_id)
                if fd is None or position is None:
                    raise NotFoundError(f"entry {entry_id!r} not found in session {session_id!r}")
                return self._sessions.read_lines(fd, index, [position])[0]
            finally:
                if fd is not None:
                    os.close(fd)

        return await self._in_session(tenant, session_id, get)

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        check_tenant_and_id(tenant, session_id)
        check_prunable_kind(kind)

        def prune(ctx: SessionCtx) -> int:
            fd, index = self._sessions.open_log(ctx, write=False)
            if fd is None:
                return 0
            try:
                stubs = [
                    Entry(seq, name, parent, line_kind or "corrupt", EPOCH, {})
                    for seq, name, parent, line_kind in zip(
                        index.seqs, index.names, index.parents, index.kinds, strict=True
                    )
                ]
                doomed = set(prunable(stubs, ctx.head.record, kind, before_seq, id_prefix))
                data = read_at(fd, 0, index.end) if doomed else b""
            finally:
                os.close(fd)
            if not doomed:
                return 0
            gen = new_gen()
            kept = [header_line("transcript", "session", ctx.sid, gen)]
            for stub, start, stop in zip(stubs, index.starts, index.stops, strict=True):
                if stub.seq not in doomed or stub.kind != kind:
                    line = data[start:stop]
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
            log = b"".join(kept)
            # Transcript first, then the head: a crash in between is completed by the next
            # operation (the transcript's gen is not the head's; see SessionFiles).
            self._files.write_atomic(ctx.log_path, log, backup=False)
            self._sessions.indexes.pop(ctx.key, None)
            record = apply_patch(ctx.head.record, SessionPatch(), now=utcnow())
            self._sessions.save_head(ctx, record, gen, len(log))
            return len(doomed)

        async with self._engine.serial(tenant, session_id):
            self._engine.forget(tenant, session_id)
            return await self._in_session(tenant, session_id, prune)

    async def rewrite_entry_payloads(
        self, tenant: str, session_id: str, payloads: Mapping[str, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses).

        The transcript is written again whole, with a new gen, and renamed over the old
        one, then the head names it (same record, same version), as a prune does.
        """
        check_tenant_and_id(tenant, session_id)
        limit = self._engine.max_payload_bytes
        checked = check_rewrites(payloads, events=False, limit=limit)

        def rewrite(ctx: SessionCtx) -> int:
            fd, index = self._sessions.open_log(ctx, write=False)
            if fd is None:
                return 0
            try:
                data = read_at(fd, 0, index.end)
            finally:
                os.close(fd)
            pieces, done, copied = [], 0, 0
            for position in sorted(index.ids[i] for i in checked if i in index.ids):
                start, stop = index.starts[position], index.stops[position]
                expected, text = checked[index.names[position]]
                line = data[start:stop]
                replaced = with_payload(line, text) if holds_payload(line, expected) else None
                if replaced is not None:
                    pieces += [data[copied:start], replaced]
                    copied, done = stop, done + 1
            if not done:
                return 0
            gen = new_gen()
            first = data.find(b"\n") + 1  # the header: a new gen names the new file
            pieces[0] = header_line("transcript", "session", ctx.sid, gen) + pieces[0][first:]
            log = b"".join([*pieces, data[copied:]])
            self._files.write_atomic(ctx.log_path, log, backup=False)
            self._sessions.indexes.pop(ctx.key, None)
            self._sessions.save_head(ctx, ctx.head.record, gen, len(log))
            return done

        async with self._engine.serial(tenant, session_id):
            self._engine.forget(tenant, session_id)
            return await self._in_session(tenant, session_id, rewrite)
