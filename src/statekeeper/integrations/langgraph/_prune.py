"""Retention for the checkpointer: delete threads or runs, prune, copy a thread."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statekeeper.errors import InvalidInputError, NotFoundError
from statekeeper.integrations.langgraph._layout import (
    BLOB,
    CHECKPOINT,
    RUNS_NAMESPACE,
    WRITE,
    key,
)
from statekeeper.stores.base import Store
from statekeeper.stores.types import Entry, EntryDraft, SessionPatch

if TYPE_CHECKING:
    from statekeeper.integrations.langgraph._ops import CheckpointLog

_CHUNK = 500  # entries per append when copying a thread


async def delete_thread(log: CheckpointLog, thread_id: str) -> None:
    """Delete the sessions of every namespace of a thread."""
    for _, _, sid in await log.sessions(str(thread_id)):
        log.forget(sid)
        with contextlib.suppress(NotFoundError):
            await log.store.delete_session(log.tenant, sid)


async def delete_for_runs(log: CheckpointLog, run_ids: Sequence[str]) -> None:
    """Delete the runs' checkpoints and writes in every thread the run index names."""
    for run_id in {str(r) for r in run_ids}:
        prefix = key(run_id) + "."
        after: str | None = None
        while True:
            records = await log.store.list_records(
                log.tenant, RUNS_NAMESPACE, prefix=prefix, after_key=after, limit=500
            )
            for record in records:
                sid = record.key[len(prefix) :]
                log.forget(sid)
                await collect_garbage(log.store, log.tenant, sid, _not_of_run(run_id))
                with contextlib.suppress(NotFoundError):
                    await log.store.delete_record(log.tenant, RUNS_NAMESPACE, record.key)
            if len(records) < 500:
                break
            after = records[-1].key


def _not_of_run(run_id: str) -> Callable[[dict[str, Any]], bool]:
    def keep(doc: dict[str, Any]) -> bool:
        return doc.get("run") != run_id

    return keep


async def prune(log: CheckpointLog, thread_ids: Sequence[str], strategy: str) -> None:
    """``keep_latest`` per namespace (with the values it needs), or ``delete``."""
    if strategy not in ("keep_latest", "delete"):
        raise InvalidInputError(f"unknown prune strategy {strategy!r}; use keep_latest or delete")
    for thread_id in thread_ids:
        if strategy == "delete":
            await delete_thread(log, thread_id)
            continue
        for _, _, sid in await log.sessions(str(thread_id)):
            log.forget(sid)
            await collect_garbage(log.store, log.tenant, sid, None)


async def copy_thread(log: CheckpointLog, source: str, target: str) -> None:
    """Copy every namespace's log of ``source`` onto ``target`` (and index its runs)."""
    for _, ns, sid in await log.sessions(str(source)):
        target_sid = await log.ensure(str(target), ns)
        log.forget(target_sid)
        for run_id in await copy_entries(log.store, log.tenant, sid, target_sid):
            await log.index_run(run_id, target_sid, str(target), ns)


async def collect_garbage(
    store: Store, tenant: str, sid: str, keep: Callable[[dict[str, Any]], bool] | None
) -> None:
    """Delete the checkpoints ``keep`` refuses (None: all but the latest), their writes,
    and every value no kept checkpoint needs (a kept delta keeps its whole chain)."""
    try:
        record = await store.get_session(tenant, sid)
        entries = await store.read_entries(tenant, sid)
    except NotFoundError:
        return
    checkpoints = [e for e in entries if e.kind == CHECKPOINT]
    if keep is None:
        latest = record.state.get("latest") or max(
            (e.payload["id"] for e in checkpoints), default=None
        )
        kept = {e.payload["id"] for e in checkpoints if e.payload["id"] == latest}
    else:
        kept = {e.payload["id"] for e in checkpoints if keep(e.payload)}
    kept_keys = {key(cid) for cid in kept}
    needed = _needed_values(entries, [e for e in checkpoints if e.payload["id"] in kept])
    doomed = [
        e
        for e in entries
        if (e.kind == CHECKPOINT and e.payload["id"] not in kept)
        or (e.kind == WRITE and e.id.split(":")[1] not in kept_keys and e.id not in needed)
        or (e.kind == BLOB and e.id not in needed)
    ]
    await _delete(store, tenant, sid, entries, doomed)
    latest_kept = max(kept, default=None)
    if record.state.get("latest") != latest_kept:
        state = {"latest": latest_kept} if latest_kept else {}
        await store.update_session(tenant, sid, SessionPatch(set={"state": state}))


def _needed_values(entries: Sequence[Entry], kept: Sequence[Entry]) -> set[str]:
    """The blob ids the kept checkpoints read, with the chains their deltas extend, the
    writes those deltas name and the segments their spines name."""
    by_id = {e.id: e for e in entries}
    by_seq = {e.seq: e for e in entries}
    needed: set[str] = set()
    for checkpoint in kept:
        for blob_id in checkpoint.payload["values"].values():
            current = by_id.get(blob_id)
            while current is not None and current.id not in needed:
                needed.add(current.id)
                named = by_seq.get(current.payload.get("from", -1))
                if named is not None:
                    needed.add(named.id)
                # A spine's segments (and the whole value at its base) are values too.
                needed.update(seg[0] for seg in current.payload.get("segs") or ())
                current = by_seq.get(current.payload.get("base", -1))
    return needed


async def _delete(
    store: Store, tenant: str, sid: str, entries: Sequence[Entry], doomed: Sequence[Entry]
) -> None:
    """One range delete per kind below its oldest kept entry, then one delete per entry."""
    doomed_seqs = {e.seq for e in doomed}
    for kind in (CHECKPOINT, WRITE, BLOB):
        kept = [e.seq for e in entries if e.kind == kind and e.seq not in doomed_seqs]
        floor = min(kept, default=max((e.seq for e in entries), default=0) + 1)
        if any(e.kind == kind and e.seq < floor for e in doomed):
            await store.prune_entries(tenant, sid, kind=kind, before_seq=floor)
        for entry in doomed:
            if entry.kind == kind and entry.seq > floor:
                await store.prune_entries(
                    tenant, sid, kind=kind, before_seq=entry.seq + 1, id_prefix=entry.id
                )


async def copy_entries(store: Store, tenant: str, source: str, target: str) -> set[str]:
    """Append every entry of session ``source`` to ``target`` (delta pointers moved to
    the new seqs) and make the source's latest checkpoint the target's. Returns the run
    ids of the copied checkpoints."""
    try:
        record = await store.get_session(tenant, source)
        entries = await store.read_entries(tenant, source)
    except NotFoundError:
        return set()
    if not entries:
        return set()
    target_record = await store.get_session(tenant, target)
    seqs = {e.seq: target_record.last_seq + i + 1 for i, e in enumerate(entries)}
    drafts = [
        EntryDraft(
            id=e.id,
            kind=e.kind,
            payload=_moved(e.payload, seqs),
            parent=None,
            side=True,
            created_at=e.created_at,
        )
        for e in entries
    ]
    version = target_record.version
    for start in range(0, len(drafts), _CHUNK):
        last = start + _CHUNK >= len(drafts)
        patch = SessionPatch(set={"state": dict(record.state)}) if last else None
        result = await store.append_entries(
            tenant, target, drafts[start : start + _CHUNK], expected_version=version, patch=patch
        )
        version = result.session.version
    return {str(e.payload["run"]) for e in entries if e.kind == CHECKPOINT and e.payload.get("run")}


def _moved(payload: dict[str, Any], seqs: Mapping[int, int]) -> dict[str, Any]:
    """A delta blob's payload with its seqs (base, root, from) in the target log."""
    if "base" not in payload:
        return payload
    moved = {**payload}
    for name in ("base", "root", "from"):
        if name in payload:
            moved[name] = seqs.get(payload[name], payload[name])
    return moved
