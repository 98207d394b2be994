"""The append engine's vocabulary: what a backend reads and writes for it.

`Snapshot` (a stored head), `Write` (an entry to store), `EventWrite` (events logged in
the same commit), `Planned` (a change planned against a head) and `HeadBackend`, the two
primitives a backend gives `statekeeper.stores.engine.AppendEngine`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from statekeeper.jsoncodec import loads
from statekeeper.stores.base import Entry, Event, EventDraft, SessionRecord
from statekeeper.stores.rules import from_micros, to_micros

__all__ = ["EventWrite", "HeadBackend", "Planned", "Snapshot", "Write"]


class Snapshot(NamedTuple):
    """A stored head: its token, the record, and stored entries among the ids asked for."""

    token: Hashable
    record: SessionRecord
    existing: dict[str, Entry]


class Write(NamedTuple):
    """A new entry to store: the entry, its payload as JSON text, and its side flag."""

    entry: Entry
    text: str
    side: bool


@dataclass(eq=False, slots=True)
class EventWrite:
    """Events to log in a commit: the log, the drafts and their payloads as JSON text
    (checked). The backend that commits them sets ``logged`` (see `stored`)."""

    log_id: str
    drafts: Sequence[EventDraft]
    texts: Sequence[str]
    logged: list[Event] = field(default_factory=list)

    def stored(self, first_seq: int) -> list[Event]:
        """Record that the events were logged with seqs from ``first_seq`` on; the
        events as a read returns them (times to the microsecond, in UTC)."""
        self.logged = [
            Event(self.log_id, first_seq + i, d.stream, d.kind, from_micros(to_micros(d.ts)), p)
            for i, (d, p) in enumerate(zip(self.drafts, map(loads, self.texts), strict=True))
        ]
        return self.logged


class HeadBackend(Protocol):
    """The primitives a backend gives the engine (see the module docstring)."""

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        """The stored head and stored entries among ``ids``; `NotFoundError` if absent."""
        ...

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
        """Write ``head``, ``writes`` and ``events`` over ``base``; None, or the current
        snapshot."""
        ...


class Planned(NamedTuple):
    """A change planned against a head: the head after it, what it writes, its result
    (an `AppendResult` gets the events of ``events`` once they are logged)."""

    session: SessionRecord
    writes: Sequence[Write] = ()
    result: Any = None
    events: EventWrite | None = None

    def outcome(self) -> Any:
        """The result, once committed."""
        if self.events is None:
            return self.result
        return self.result.model_copy(update={"events": self.events.logged})
