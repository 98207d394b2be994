"""Markers of what the ``files://`` store lost to damage: ``<id>.lost`` beside the files.

When a session head or a record cannot be read and has no usable backup, the store
moves the damaged files to ``<tenant>/quarantine`` (never deleting them) and writes a
small marker where they were: ``<tenant>/sessions/<id>.lost`` or
``<tenant>/records/<namespace>/<key>.lost``. The marker is what makes the damage stay
visible, on every handle and in every process, as the other backends show a damaged
row: listings report the id in ``corrupt`` and reads raise `StoreCorruptError` naming
it and the quarantined files, until the id is deleted or written again (a new record
value, a new session with that id), which removes the marker. The quarantined files
stay where they are.

A marker is one JSON object: ``{"format": 1, "kind", "subject", "reason", "at",
"quarantined": [paths relative to the root], "recovered_as", "raw"}`` (``raw``: the
start of the damaged file, as listings show it).
"""

from __future__ import annotations

from dataclasses import dataclass

from statekeeper.errors import NotFoundError, StatekeeperError, StoreCorruptError
from statekeeper.jsoncodec import encode_json, loads
from statekeeper.stores.base import CorruptItem
from statekeeper.stores.files.layout import Layout, Recovery, child

__all__ = [
    "LOST_SUFFIX",
    "SESSION_FIX",
    "Lost",
    "read_lost",
    "session_gone",
    "session_not_found",
    "write_lost",
]

LOST_SUFFIX = ".lost"
SESSION_FIX = (
    "read the recovery session, and delete this one (delete_session) to stop this "
    "report, or create it again; the quarantined files are kept"
)
_RAW_SHOWN = 200


@dataclass(frozen=True, slots=True)
class Lost:
    """What a marker says about a session or record lost to damage."""

    subject: str
    """``session <id>`` or ``record <namespace>/<key>``."""
    reason: str
    at: str
    quarantined: tuple[str, ...]
    recovered_as: str | None
    raw: str

    def error(self, fix: str) -> StoreCorruptError:
        """`StoreCorruptError` naming the lost item, its quarantined files and ``fix``."""
        where = ", ".join(self.quarantined) or "nowhere (the files were gone already)"
        saved = (
            f"; its transcript was saved as session {self.recovered_as!r}"
            if self.recovered_as
            else ""
        )
        return StoreCorruptError(
            f"{self.subject} is damaged and could not be restored ({self.reason}; found "
            f"{self.at}); the damaged files were moved to quarantine: {where}{saved}; {fix}"
        )

    def item(self, item_id: str, fix: str) -> CorruptItem:
        """How a listing reports it."""
        return CorruptItem(id=item_id, error=str(self.error(fix)), raw=self.raw)


def write_lost(
    files: Layout, path: str, subject: str, recovery: Recovery, reason: str, raw: bytes
) -> Lost:
    """Write the marker of a lost item at ``path`` (atomically) and return what it says
    (``subject``: the item as messages name it)."""
    lost = Lost(
        subject,
        reason,
        recovery.at.isoformat(),
        recovery.quarantined,
        recovery.recovered_as,
        raw[:_RAW_SHOWN].decode(errors="replace"),
    )
    doc = {
        "format": 1,
        "kind": recovery.kind,
        "subject": lost.subject,
        "reason": lost.reason,
        "at": lost.at,
        "quarantined": list(lost.quarantined),
        "recovered_as": lost.recovered_as,
        "raw": lost.raw,
    }
    files.write_atomic(path, (encode_json(doc) + "\n").encode(), backup=False)
    return lost


def read_lost(files: Layout, path: str, subject: str) -> Lost | None:
    """The marker at ``path``, or None if there is none. A marker that is itself damaged
    still reports the item (with what could be read)."""
    raw = files.read_bytes(path)
    if raw is None:
        return None
    try:
        doc = loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        reason = f"and its marker {files.relative(path)} is unreadable too"
        return Lost(subject, reason, "at an unknown time", (), None, "")
    quarantined = doc.get("quarantined")
    recovered_as = doc.get("recovered_as")
    return Lost(
        subject,
        str(doc.get("reason") or "unknown damage"),
        str(doc.get("at") or "at an unknown time"),
        tuple(str(p) for p in quarantined) if isinstance(quarantined, list) else (),
        recovered_as if isinstance(recovered_as, str) else None,
        str(doc.get("raw") or "")[:_RAW_SHOWN],
    )


def session_gone(files: Layout, tenant: str, session_id: str) -> StatekeeperError:
    """Why a session has no head: `StoreCorruptError` if it was lost to damage (its
    marker is there), else `session_not_found`."""
    folder = files.directory(tenant, "sessions")
    if folder is not None:
        marker = child(folder, f"{session_id}{LOST_SUFFIX}")
        lost = read_lost(files, marker, f"session {session_id!r}")
        if lost is not None:
            return lost.error(SESSION_FIX)
    return session_not_found(files, tenant, session_id)


def session_not_found(files: Layout, tenant: str, session_id: str) -> NotFoundError:
    """`NotFoundError`, naming the recovery session if this id was once lost to damage
    (``recoveries.jsonl`` says so) and deleted since."""
    message = f"session {session_id!r} not found"
    try:
        folder = files.directory(tenant)
        raw = None if folder is None else files.read_bytes(child(folder, "recoveries.jsonl"))
    except (OSError, StatekeeperError):
        raw = None
    for line in (raw or b"").splitlines():
        try:
            doc = loads(line)
        except ValueError:
            continue
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "recovery-session"
            and doc.get("subject") == f"session {session_id}"
        ):
            message = (
                f"session {session_id!r} not found: it was damaged beyond repair on "
                f"{doc.get('at')} and its transcript was saved as session "
                f"{doc.get('recovered_as')!r}"
            )
    return NotFoundError(message)
