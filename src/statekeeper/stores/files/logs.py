"""JSONL formats of the ``files://`` store: transcript and event lines, and their indexes.

A transcript ``<tenant>/sessions/<id>.jsonl`` starts with a header line and then holds one
entry per line, keys in this order (so an index can read them without parsing payloads)::

    {"statekeeper":"transcript","format":1,"session":"s1","gen":"9f2c0a41b7d3"}
    {"seq":1,"id":"e1","parent_seq":null,"kind":"message","created_at":"...","payload":{...}}
    {"seq":2,"id":"c1","parent_seq":1,"kind":"checkpoint","side":true,"created_at":...}

Which lines count is decided by the session's head (``<id>.json``): it records the log's
``gen`` (a random name for this file's life; a prune writes a new file with a new gen)
and how many ``bytes`` of it are committed. An append writes its lines after the
committed end and then replaces the head, so a crash leaves either the old head (the new
lines are ignored, and cut off by the next append) or the new head (all the lines are
there): an append is all or nothing, and a torn line is never parsed.

An event log ``<tenant>/events/<log>.jsonl`` has no head: its header line, then one event
per line. All lines of a batch but the last carry ``"more":true``; lines after the last
line without it are an unfinished batch and do not count, so a batch is all or nothing.

A line that cannot be decoded is reported as a ``corrupt`` entry (or an ``error/corrupt``
event) in its place, and the valid lines around it are served.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from statekeeper.jsoncodec import encode_json, loads
from statekeeper.stores.base import Entry, Event
from statekeeper.stores.rules import corrupt_entry

__all__ = [
    "EPOCH",
    "EventIndex",
    "LogIndex",
    "entry_line",
    "event_line",
    "header_line",
    "holds_payload",
    "new_gen",
    "parse_entry",
    "parse_event",
    "parse_header",
    "remember",
    "with_payload",
]

K = TypeVar("K")
V = TypeVar("V")
INDEXES_KEPT = 256
"""Transcripts (and event logs) whose line index a store keeps in memory."""


def remember(cache: OrderedDict[K, V], key: K, value: V, limit: int = INDEXES_KEPT) -> V:
    """Put ``value`` in an LRU ``cache`` holding at most ``limit`` items."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)
    return value


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The created_at of a corrupt entry whose own timestamp cannot be read."""

_ENTRY = re.compile(
    rb'\{"seq":(\d+),"id":"([A-Za-z0-9._:@-]+)","parent_seq":(null|\d+),'
    rb'"kind":("(?:[^"\\]|\\.)*")(,"side":true)?,'
)
_EVENT = re.compile(rb'\{"seq":(\d+)(,"more":true)?,')
_SEQ = re.compile(rb'"seq":(\d+)')
_ID = re.compile(rb'"id":"([A-Za-z0-9._:@-]+)"')


def new_gen() -> str:
    """A random name for a new log file's life."""
    return os.urandom(6).hex()


def header_line(kind: str, owner_key: str, owner: str, gen: str) -> bytes:
    """The first line of a JSONL file."""
    return (
        f'{{"statekeeper":"{kind}","format":1,"{owner_key}":"{owner}","gen":"{gen}"}}\n'
    ).encode()


def parse_header(line: bytes, kind: str) -> str | None:
    """The gen of a header line, or None if ``line`` is not a valid header of ``kind``."""
    try:
        doc = loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("statekeeper") != kind:
        return None
    gen = doc.get("gen")
    return gen if isinstance(gen, str) else None


def entry_line(entry: Entry, payload_text: str, side: bool) -> str:
    """One transcript line (ids are validated, so they need no escaping)."""
    parent = "null" if entry.parent_seq is None else str(entry.parent_seq)
    side_part = ',"side":true' if side else ""
    return (
        f'{{"seq":{entry.seq},"id":"{entry.id}","parent_seq":{parent},'
        f'"kind":{encode_json(entry.kind)}{side_part},'
        f'"created_at":"{entry.created_at.isoformat()}","payload":{payload_text}}}\n'
    )


def holds_payload(line: bytes, expected: Any) -> bool:
    """Whether an entry or event line's payload is ``expected`` (a rewrite's guard)."""
    try:
        doc = loads(line)
    except ValueError:
        return False
    return isinstance(doc, dict) and "payload" in doc and bool(doc["payload"] == expected)


def with_payload(line: bytes, payload_text: str) -> bytes | None:
    """An entry or event line with another payload (everything else byte for byte), or
    None if the line has no payload where the writers put it: last. Nothing before it can
    hold ``,"payload":`` (a quote inside a JSON string is escaped)."""
    cut = line.find(b',"payload":')
    if cut < 0 or not line.endswith(b"}\n"):
        return None
    return line[:cut] + b',"payload":' + payload_text.encode() + b"}\n"


def event_line(
    seq: int, stream: str, kind: str, ts: datetime, payload_text: str, more: bool
) -> str:
    """One event line."""
    more_part = ',"more":true' if more else ""
    return (
        f'{{"seq":{seq}{more_part},"stream":{encode_json(stream)},'
        f'"kind":{encode_json(kind)},"ts":"{ts.isoformat()}","payload":{payload_text}}}\n'
    )


def _aware(value: Any) -> datetime:
    stamp = datetime.fromisoformat(value)
    if stamp.tzinfo is None:
        raise ValueError("timestamp has no timezone")
    return stamp


def parse_entry(raw: bytes, seq: int, entry_id: str | None, parent: int | None) -> Entry:
    """The entry a line holds, or a ``corrupt`` entry standing in for it."""
    try:
        doc = loads(raw)
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        payload = doc["payload"]
        if not isinstance(payload, dict):
            raise ValueError(f"payload is not a JSON object but {type(payload).__name__}")
        line_seq, line_id, line_parent, kind = (
            doc["seq"],
            doc["id"],
            doc["parent_seq"],
            doc["kind"],
        )
        if (
            type(line_seq) is not int
            or not isinstance(line_id, str)
            or not isinstance(kind, str)
            or not (line_parent is None or type(line_parent) is int)
        ):
            raise ValueError("seq, id, parent_seq or kind has the wrong type")
        return Entry(line_seq, line_id, line_parent, kind, _aware(doc["created_at"]), payload)
    except (ValueError, KeyError, TypeError) as exc:
        text = raw.decode("utf-8", errors="replace")
        return corrupt_entry(seq, entry_id or f"corrupt-{seq}", parent, EPOCH, text, str(exc))


def parse_event(raw: bytes, log_id: str, seq: int) -> Event:
    """The event a line holds, or an ``error/corrupt`` event standing in for it."""
    try:
        doc = loads(raw)
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        payload, stream, kind = doc["payload"], doc["stream"], doc["kind"]
        if not isinstance(payload, dict) or not isinstance(stream, str):
            raise ValueError("payload or stream has the wrong type")
        if not isinstance(kind, str):
            raise ValueError("kind has the wrong type")
        return Event(log_id, seq, stream, kind, _aware(doc["ts"]), payload)
    except (ValueError, KeyError, TypeError) as exc:
        text = raw.decode("utf-8", errors="replace")
        return Event(
            log_id,
            seq,
            "error",
            "corrupt",
            EPOCH,
            {"error": f"corrupt event: {exc}", "raw": text[:200]},
        )


def _guess_seq(line: bytes, previous: int) -> int:
    found = _SEQ.search(line)
    return int(found.group(1)) if found and int(found.group(1)) > previous else previous + 1


@dataclass
class LogIndex:
    """Where each committed line of one transcript file is, by seq and by id.

    Built once per file and extended as the file grows, so an append or a page read costs
    the same at any history length.
    """

    gen: str | None
    file_id: tuple[int, int]
    """(st_dev, st_ino) of the file indexed: another file means another index."""
    end: int = 0
    """Bytes scanned so far (always a committed position)."""
    header_gen: str | None = None
    header_damaged: bool = False
    seqs: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    """Entry ids (``corrupt-<seq>`` for a line whose id cannot be read)."""
    starts: list[int] = field(default_factory=list)
    stops: list[int] = field(default_factory=list)
    parents: list[int | None] = field(default_factory=list)
    kinds: list[str | None] = field(default_factory=list)
    """None for a line that cannot be read (a corrupt entry)."""
    sides: list[bool] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    ordered: bool = True

    def scan(self, data: bytes, base: int) -> None:
        """Index the lines of ``data``, the file's bytes from ``base`` (== ``self.end``)."""
        position = 0
        size = len(data)
        while position < size:
            stop = data.find(b"\n", position)
            stop = size if stop < 0 else stop + 1
            line = data[position:stop].rstrip(b"\n")
            start = base + position
            position = stop
            if not line.strip():
                continue
            if start == 0 and not line.startswith(b'{"seq":'):
                self.header_gen = parse_header(line, "transcript")
                self.header_damaged = self.header_gen is None
                continue
            self._add(line, start, base + stop)
        self.end = base + size

    def _add(self, line: bytes, start: int, stop: int) -> None:
        previous = self.seqs[-1] if self.seqs else 0
        found = _ENTRY.match(line)
        kind: str | None
        if found:
            seq, entry_id = int(found.group(1)), found.group(2).decode()
            parent = None if found.group(3) == b"null" else int(found.group(3))
            raw_kind = found.group(4)
            kind = raw_kind[1:-1].decode() if b"\\" not in raw_kind else loads(raw_kind)
            side = found.group(5) is not None
        else:  # written by hand in another key order, or damaged
            entry = parse_entry(line, _guess_seq(line, previous), None, None)
            seq, parent, side = entry.seq, entry.parent_seq, False
            if entry.kind == "corrupt" and entry.id.startswith("corrupt-"):
                found_id = _ID.search(line)
                entry_id = found_id.group(1).decode() if found_id else entry.id
                kind = None
            else:
                entry_id, kind = entry.id, entry.kind
        if seq <= previous:
            self.ordered = False
        position = len(self.seqs)
        self.seqs.append(seq)
        self.names.append(entry_id)
        self.starts.append(start)
        self.stops.append(stop)
        self.parents.append(parent)
        self.kinds.append(kind)
        self.sides.append(side)
        self.ids.setdefault(entry_id, position)

    def positions(self, after_seq: int, until_seq: int | None, limit: int | None) -> list[int]:
        """Positions of the lines with ``after_seq < seq <= until_seq``, in order."""
        last = until_seq if until_seq is not None else 2**62
        if self.ordered:
            first = bisect.bisect_right(self.seqs, after_seq)
            stop = bisect.bisect_right(self.seqs, last)
            chosen = range(first, max(first, stop))
            if limit is not None:
                chosen = chosen[:limit]
            return list(chosen)
        picked = [i for i, seq in enumerate(self.seqs) if after_seq < seq <= last]
        return picked if limit is None else picked[:limit]

    def last_seq(self) -> int:
        """The highest seq indexed (0: none)."""
        return max(self.seqs) if self.seqs else 0


@dataclass
class EventIndex:
    """Where each committed event of one event log file is."""

    gen: str | None
    file_id: tuple[int, int]
    end: int = 0
    """End of the last committed line scanned (lines of an unfinished batch come after)."""
    header_damaged: bool = False
    seqs: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    stops: list[int] = field(default_factory=list)

    def scan(self, data: bytes, base: int) -> None:
        """Index the committed lines of ``data`` (the file's bytes from ``base``)."""
        position = 0
        size = len(data)
        pending: list[tuple[int, int, int]] = []
        while position < size:
            newline = data.find(b"\n", position)
            if newline < 0:
                break  # a torn last line: not committed
            stop = newline + 1
            line = data[position:newline]
            start = base + position
            position = stop
            if not line.strip():
                if not pending:
                    self.end = base + stop
                continue
            if start == 0 and not line.startswith(b'{"seq":'):
                self.gen = parse_header(line, "events")
                self.header_damaged = self.gen is None
                self.end = base + stop
                continue
            previous = pending[-1][0] if pending else (self.seqs[-1] if self.seqs else 0)
            found = _EVENT.match(line)
            seq = int(found.group(1)) if found else _guess_seq(line, previous)
            pending.append((seq, start, base + stop))
            if found and found.group(2):
                continue  # more lines of this batch follow
            for seq_, start_, stop_ in pending:
                self.seqs.append(seq_)
                self.starts.append(start_)
                self.stops.append(stop_)
            pending.clear()
            self.end = base + stop

    def positions(self, after_seq: int, limit: int | None) -> list[int]:
        """Positions of the events with ``seq > after_seq``, in order."""
        first = bisect.bisect_right(self.seqs, after_seq)
        chosen = range(first, len(self.seqs))
        if limit is not None:
            chosen = chosen[:limit]
        return list(chosen)

    def last_seq(self) -> int:
        """The highest seq (0: none)."""
        return self.seqs[-1] if self.seqs else 0
