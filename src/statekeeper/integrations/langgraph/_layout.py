"""Where the checkpointer keeps things in a statekeeper store, and how it reads them back.

One statekeeper session per LangGraph thread and checkpoint namespace. Its log holds
three kinds of side entries (roots, so pruning can pick any of them):

- ``lg.checkpoint`` (id ``c:<checkpoint id>:``): the checkpoint without its channel
  values, its metadata, its parent's id, and ``values``: the entry id of each channel's
  value;
- ``lg.blob`` (id ``b:<checkpoint id>:<channel hash>``): one channel's value, written
  when the channel got a new version. A list that grew by appending (``MessagesState``'s
  messages) is stored as a *delta*: only the new items (or the seq of the pending write
  that holds them, ``from``), with the seqs of the blob it extends (``base``) and of the
  first whole value of its chain (``root``). Every so many steps the list is written
  again as *segments* and that step's blob is a *spine* naming them, so chains stay
  short (`_spine`: ids ``s:<checkpoint id>:<channel hash>:<level>``);
- ``lg.write`` (id ``w:<checkpoint id>:<task hash>:<idx>``): a pending write.

The session's ``state`` names the latest checkpoint. A run index (records in
``langgraph.runs``, key ``<run>.<session>``) finds a run's threads for ``delete_for_runs``.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, PendingWrite, writes_sort_key

from statekeeper.errors import InvalidInputError, StoreCorruptError
from statekeeper.integrations.langgraph._values import ValueCodec
from statekeeper.stores.types import Entry

CHECKPOINT, BLOB, WRITE = "lg.checkpoint", "lg.blob", "lg.write"
AGENT_ID = "langgraph"
THREAD_KEY, NS_KEY = "langgraph_thread", "langgraph_ns"
RUNS_NAMESPACE = "langgraph.runs"
_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # no ":" (prefixes) nor "." (run keys)


def key(value: str) -> str:
    """A short id-safe form of ``value``, without ":" or ".": a UUID (LangGraph's
    checkpoint ids) in base 36, a short safe value as it is, else a hash; each with its
    own first letter, so no two values share a key."""
    if len(value) == 36:
        try:
            parsed = uuid.UUID(value)
        except ValueError:
            parsed = None
        if parsed is not None and str(parsed) == value:
            return "u" + _base36(parsed.int)
    if _SAFE.fullmatch(value):
        return "r" + value
    return "h" + hashlib.sha256(value.encode()).hexdigest()[:40]


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
        if not number:
            return out


def _hash(value: str, size: int) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:size]


def session_id(thread_id: str, ns: str) -> str:
    """The statekeeper session of a thread's checkpoint namespace."""
    return "lg." + hashlib.sha256(f"{thread_id}\x00{ns}".encode()).hexdigest()[:40]


# Keys never hold ":", so "c:<key>:" is a prefix of that checkpoint's entry id only.
def checkpoint_entry_id(checkpoint_id: str) -> str:
    return f"c:{key(checkpoint_id)}:"


def blob_entry_id(checkpoint_id: str, channel: str) -> str:
    # Two channels of one checkpoint with one hash would be refused, never mixed up.
    return f"b:{key(checkpoint_id)}:{_hash(channel, 8)}"


def write_entry_id(checkpoint_id: str, task_id: str, idx: int) -> str:
    task = _hash(task_id, 12)
    return f"w:{key(checkpoint_id)}:{task}:{idx if idx >= 0 else f'm{-idx}'}"


def writes_prefix(checkpoint_id: str) -> str:
    return f"w:{key(checkpoint_id)}:"


def run_key(run_id: str, sid: str) -> str:
    return f"{key(run_id)}.{sid}"


def thread_of(config: RunnableConfig) -> tuple[str, str]:
    """The thread id and checkpoint namespace a config names."""
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise InvalidInputError(
            'the config names no thread: pass {"configurable": {"thread_id": "..."}}'
        )
    return str(thread_id), str(configurable.get("checkpoint_ns") or "")


@dataclass
class Reader:
    """Rebuilds values and tuples from entries, resolving delta chains (memoized)."""

    codec: ValueCodec
    entries: dict[str, Entry] = field(default_factory=dict)
    by_seq: dict[int, Entry] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    added: dict[str, list[Any]] = field(default_factory=dict)
    prefixes: dict[str, tuple[list[Any], int]] = field(default_factory=dict)

    def add(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self.entries[entry.id] = entry
            self.by_seq[entry.seq] = entry

    def chain_start(self, blob: Entry) -> int | None:
        """The seq a delta chain starts at (to read it in one range), or None if whole."""
        root = blob.payload.get("root")
        return int(root) if isinstance(root, int) and "base" in blob.payload else None

    def segments_missing(self, blob_ids: Iterable[str]) -> list[str]:
        """The segments the values of these blobs rest on that the reader lacks (their
        chains must be in already)."""
        missing: list[str] = []
        for blob_id in blob_ids:
            blob = self.entries.get(blob_id)
            start = self.by_seq.get(self.chain_start(blob) or -1) if blob else None
            for entry in (blob, start):
                for seg in (entry.payload.get("segs") or []) if entry is not None else ():
                    if seg[0] not in self.entries and seg[0] not in missing:
                        missing.append(seg[0])
        return missing

    def value(self, blob_id: str) -> Any:
        """The value of a blob. A delta chain is followed back to a whole (or already
        built) value, then extended in place, each delta decoded once; every delta on the
        way is a prefix of the result, so a listing builds each chain once."""
        if blob_id in self.values:
            return self.values[blob_id]
        if blob_id in self.prefixes:
            built, end = self.prefixes[blob_id]
            return built[:end]
        entry = self._entry(self.entries.get(blob_id), blob_id)
        chain: list[Entry] = []
        while "base" in entry.payload and not self._known(entry.id):
            chain.append(entry)
            entry = self._entry(self.by_seq.get(entry.payload["base"]), entry.payload["base"])
        if not self._known(entry.id):
            self.values[entry.id] = self._whole(entry)
        if not chain:
            return self.values[entry.id]
        start = self.value(entry.id)
        if not isinstance(start, list):
            raise StoreCorruptError(f"LangGraph delta {chain[-1].id!r} extends no list")
        items = list(start)
        for link in reversed(chain):
            if len(items) != link.payload.get("n"):
                raise StoreCorruptError(f"LangGraph delta {link.id!r} does not fit its base")
            items.extend(self._added(link))
            self.prefixes[link.id] = (items, len(items))
        return items[:]  # the built list stays private: callers may change theirs

    def _whole(self, entry: Entry) -> Any:
        """A value stored whole: as it is, as segments (a spine), or as parts (a segment)."""
        payload = entry.payload
        if "segs" in payload:
            items = [item for seg in payload["segs"] for item in self._list(seg[0])]
        elif "parts" in payload:
            items = [item for part in payload["parts"] for item in self._decoded_list(part)]
        else:
            return self.codec.decode(payload.get("value"))
        if len(items) != payload.get("n"):
            raise StoreCorruptError(f"LangGraph value {entry.id!r} does not hold its items")
        return items

    def _list(self, blob_id: str) -> list[Any]:
        value = self.value(blob_id)
        if not isinstance(value, list):
            raise StoreCorruptError(f"LangGraph segment {blob_id!r} holds no list")
        return value

    def _decoded_list(self, doc: Any) -> list[Any]:
        value = self.codec.decode(doc)
        if not isinstance(value, list):
            raise StoreCorruptError("a LangGraph segment part holds no list")
        return value

    def tail(self, blob_id: str) -> tuple[list[list[Any]], list[tuple[int, dict[str, Any]]]]:
        """The spine a list blob rests on and (items, document) of what each of its tail
        deltas added (a saver that read the thread goes on writing from there)."""
        entry = self.entries[blob_id]
        parts: list[tuple[int, dict[str, Any]]] = []
        while "base" in entry.payload:
            payload = entry.payload
            if "from" in payload:
                write = self._entry(self.by_seq.get(payload["from"]), payload["from"])
                parts.append((len(self._added(entry)), write.payload["value"]))
            else:
                parts.append((len(self._added(entry)), payload["add"]))
            entry = self._entry(self.by_seq.get(payload["base"]), payload["base"])
        parts.reverse()
        if "segs" in entry.payload:
            return list(entry.payload["segs"]), parts
        return [[entry.id, len(self._list(entry.id)), 0, 0]], parts

    def _known(self, blob_id: str) -> bool:
        return blob_id in self.values or blob_id in self.prefixes

    def _added(self, entry: Entry) -> list[Any]:
        """The items a delta adds (decoded once per entry)."""
        if entry.id not in self.added:
            payload = entry.payload
            if "from" in payload:
                write = self._entry(self.by_seq.get(payload["from"]), payload["from"])
                self.added[entry.id] = self.codec.decode(write.payload["value"])
            else:
                self.added[entry.id] = self.codec.decode(payload["add"])
        return self.added[entry.id]

    @staticmethod
    def _entry(entry: Entry | None, name: object) -> Entry:
        if entry is None:
            raise StoreCorruptError(
                f"LangGraph value {name!r} is missing from the store (pruned or deleted "
                "by another process?)"
            )
        return entry

    def to_tuple(
        self, thread_id: str, ns: str, entry: Entry, writes: Sequence[Entry]
    ) -> CheckpointTuple:
        """The `CheckpointTuple` of a checkpoint entry and its pending write entries."""
        doc = entry.payload
        checkpoint = {"id": doc["id"], **self.codec.decode(doc["checkpoint"])}
        checkpoint["channel_values"] = {
            channel: self.value(blob_id) for channel, blob_id in doc["values"].items()
        }
        parent = doc.get("parent")
        return CheckpointTuple(
            config=_config(thread_id, ns, doc["id"]),
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=self.codec.decode(doc["metadata"]),
            parent_config=_config(thread_id, ns, parent) if parent else None,
            pending_writes=self.pending_writes(writes),
        )

    def pending_writes(self, writes: Sequence[Entry]) -> list[PendingWrite]:
        """Writes in `writes_sort_key` order; a later special write replaces an earlier one."""
        latest: dict[tuple[str, int], Entry] = {}
        for entry in sorted(writes, key=lambda e: e.seq):
            latest[(entry.payload["task"], entry.payload["idx"])] = entry
        ordered = sorted(
            latest.values(),
            key=lambda e: writes_sort_key(
                e.payload.get("path", ""), e.payload["task"], e.payload["idx"]
            ),
        )
        return [
            (e.payload["task"], e.payload["ch"], self.codec.decode(e.payload["value"]))
            for e in ordered
        ]


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def writes_by_checkpoint(entries: Iterable[Entry]) -> dict[str, list[Entry]]:
    """The write entries among ``entries``, grouped by the `key` of their checkpoint id."""
    grouped: dict[str, list[Entry]] = {}
    for entry in entries:
        if entry.kind == WRITE:
            grouped.setdefault(entry.id.split(":")[1], []).append(entry)
    return grouped


def matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """True if every key of the filter is in the metadata with an equal value."""
    return not wanted or all(k in metadata and metadata[k] == v for k, v in wanted.items())
