"""Where the checkpointer keeps things in a statekeeper store, and how it reads them back.

One statekeeper session per LangGraph thread and checkpoint namespace. Its log holds
three kinds of side entries (roots, so pruning can pick any of them):

- ``lg.checkpoint`` (id ``c:<checkpoint id>:``): the checkpoint without its channel
  values, its metadata, its parent's id, and ``values``: the entry id of each channel's
  value;
- ``lg.blob`` (id ``b:<checkpoint id>:<channel hash>``): one channel's value, written
  when the channel got a new version. A list that grew by appending (``MessagesState``'s
  messages) is stored as a *delta*: only the new items, with the id and seq of the blob
  it extends (``base``) and of the first full value of its chain (``root``);
- ``lg.write`` (id ``w:<checkpoint id>:<task hash>:<idx>``): a pending write.

The session's ``state`` names the latest checkpoint. A run index (records in
``langgraph.runs``, key ``<run>.<session>``) finds a run's threads for ``delete_for_runs``.
"""

from __future__ import annotations

import hashlib
import re
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
_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def key(value: str) -> str:
    """``value`` if it is a short id-safe string without dots, else a hash of it."""
    if _SAFE.fullmatch(value) and value[0] not in "_-":
        return value
    return "h" + hashlib.sha256(value.encode()).hexdigest()[:40]


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def session_id(thread_id: str, ns: str) -> str:
    """The statekeeper session of a thread's checkpoint namespace."""
    return "lg." + hashlib.sha256(f"{thread_id}\x00{ns}".encode()).hexdigest()[:40]


# Keys never hold ":", so "c:<key>:" is a prefix of that checkpoint's entry id only.
def checkpoint_entry_id(checkpoint_id: str) -> str:
    return f"c:{key(checkpoint_id)}:"


def blob_entry_id(checkpoint_id: str, channel: str) -> str:
    return f"b:{key(checkpoint_id)}:{_hash(channel)}"


def write_entry_id(checkpoint_id: str, task_id: str, idx: int) -> str:
    return f"w:{key(checkpoint_id)}:{_hash(task_id)}:{idx if idx >= 0 else f'm{-idx}'}"


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


@dataclass(slots=True)
class Tip:
    """The newest value this saver wrote (or read) for a list channel: the base of deltas."""

    blob_id: str
    seq: int
    root: int
    items: list[Any]
    payload: dict[str, Any]


def extends(items: list[Any], value: list[Any]) -> bool:
    """True if ``value`` starts with ``items`` (same objects, or equal ones)."""
    if len(value) < len(items):
        return False
    return all(a is b or a == b for a, b in zip(items, value, strict=False))


def blob_payload(
    codec: ValueCodec, channel: str, value: Any, tip: Tip | None
) -> dict[str, Any]:
    """A channel value's blob: a delta on ``tip`` if the value extends it, else whole."""
    if tip is not None and type(value) is list and extends(tip.items, value):
        return {
            "ch": channel,
            "base": [tip.blob_id, tip.seq],
            "root": tip.root,
            "n": len(tip.items),
            "add": codec.encode(value[len(tip.items) :]),
        }
    return {"ch": channel, "value": codec.encode(value)}


@dataclass
class Reader:
    """Rebuilds values and tuples from entries, resolving delta chains (memoized)."""

    codec: ValueCodec
    entries: dict[str, Entry] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    def add(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self.entries[entry.id] = entry

    def chain_start(self, blob: Entry) -> int | None:
        """The seq a delta chain starts at (to read it in one range), or None if whole."""
        root = blob.payload.get("root")
        return int(root) if isinstance(root, int) else None

    def value(self, blob_id: str) -> Any:
        """The value of a blob (a delta chain is followed back to its first whole value)."""
        if blob_id in self.values:
            return self.values[blob_id]
        chain: list[Entry] = []
        current = blob_id
        while current not in self.values:
            entry = self.entries.get(current)
            if entry is None:
                raise StoreCorruptError(
                    f"LangGraph value {current!r} is missing from the store (pruned or "
                    "deleted by another process?)"
                )
            chain.append(entry)
            if "base" not in entry.payload:
                break
            current = entry.payload["base"][0]
        for entry in reversed(chain):
            self.values[entry.id] = self._apply(entry)
        return self.values[blob_id]

    def _apply(self, entry: Entry) -> Any:
        payload = entry.payload
        if "base" not in payload:
            return self.codec.decode(payload.get("value"))
        base = self.values[payload["base"][0]]
        if not isinstance(base, list) or len(base) != payload.get("n"):
            raise StoreCorruptError(f"LangGraph delta {entry.id!r} does not fit its base")
        return [*base, *self.codec.decode(payload["add"])]

    def to_tuple(
        self, thread_id: str, ns: str, entry: Entry, writes: Sequence[Entry]
    ) -> CheckpointTuple:
        """The `CheckpointTuple` of a checkpoint entry and its pending write entries."""
        doc = entry.payload
        checkpoint = dict(self.codec.decode(doc["checkpoint"]))
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
            key=lambda e: writes_sort_key(e.payload["path"], e.payload["task"], e.payload["idx"]),
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
    """The write entries among ``entries``, grouped by the checkpoint they belong to."""
    grouped: dict[str, list[Entry]] = {}
    for entry in entries:
        if entry.kind == WRITE:
            grouped.setdefault(entry.payload["cp"], []).append(entry)
    return grouped


def matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """True if every key of the filter is in the metadata with an equal value."""
    return not wanted or all(
        k in metadata and metadata[k] == v for k, v in wanted.items()
    )
