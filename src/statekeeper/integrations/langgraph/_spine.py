"""Bounded reads of long lists: the segments a delta chain rests on.

A list that grows by appending is stored as deltas (`_layout`). Left alone, the chain from
the latest delta back to the list's first whole value grows with the thread, and a saver
that has not seen the thread (another process) reads all of it. So every `TAIL` steps
the saver writes a *segment*: an ``lg.blob`` (id ``s:<checkpoint>:<channel>:<level>``,
payload ``{"v": 2, "ch", "n": items, "parts": [value documents]}``) holding the items
those steps added, and that step's blob is a *spine*: ``{"v": 2, "ch", "n": items,
"segs": [[id, items, level, bytes], ...]}``, the entries that hold the whole list, in order. The
next deltas rest on the spine (their ``root``). When `FANOUT` segments of one level end
the spine, they are merged into one of the next level: their stored parts are fetched and
joined, never decoded. The first whole value of a list is the spine's base (level 0,
never merged), so a thread written before segments existed carries on from its chain.

A cold read of the latest value reads its chain back to the spine (fewer than `TAIL`
steps, one range read) and the spine's segments (fewer than `FANOUT` per level), where
level ``L`` holds ``TAIL * FANOUT ** (L - 1)`` steps; no merge makes a segment larger than
`SEGMENT_BYTES` (those segments stay, so past that size a read takes one more segment
per few MB of history, which it decodes anyway). The price: each item is written again
once per level it reaches, in one step every ``TAIL * FANOUT ** (L - 1)`` (messages of
~1 KB: 1,024 steps make a 1 MB level 2 segment, and level 3 would pass the cap).
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from statekeeper.errors import NotFoundError
from statekeeper.integrations.langgraph._values import ValueCodec
from statekeeper.jsoncodec import encode_json
from statekeeper.stores.types import EntryDraft

# Chosen by measurement (bench.langgraph, docs/integrations/langgraph-checkpointer.md): a
# tail is one range read, cheap even at 128 steps; each segment is a read of its own.
TAIL = 128  # steps of deltas before they are written again as one segment
FANOUT = 8  # segments of one level merged into one of the next
FIXED = 0  # the level of what is never merged: a whole value, segments grown too large
SEGMENT_BYTES = 4 << 20  # no merge makes a segment larger, nor above a quarter of the
# store's largest entry (16 MB by default; sealing adds a third)
VERSION = 2  # the layout of spines and segments (deltas and whole values: version 1)

Fetch = Callable[[str], Awaitable[dict[str, Any]]]


@dataclass(slots=True)
class Tip:
    """The newest value this saver wrote (or read) for a list channel: the base of deltas.

    ``segs``: the spine under it; ``parts``: the documents of the items its tail (the
    deltas since the spine) added, one per step; ``written``: the segments stored with
    it (sent again by a retried put, which the store then ignores).
    """

    blob_id: str
    seq: int
    root: int
    items: list[Any]
    payload: dict[str, Any]
    segs: list[list[Any]] = field(default_factory=list)
    parts: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    written: list[EntryDraft] = field(default_factory=list)


@dataclass(slots=True)
class Planned:
    """A channel's new blob payload, the segments to store before it, and the tail after."""

    payload: dict[str, Any]
    segs: list[list[Any]]
    parts: list[tuple[int, dict[str, Any]]]
    segments: list[EntryDraft]


def segment_id(blob_id: str, level: int) -> str:
    """The id of the level ``level`` segment written with blob ``b:<key>:<hash>``."""
    return "s" + blob_id[1:] + f":{level}"


def is_segment(entry_id: str) -> bool:
    return entry_id.startswith("s:")


def extends(items: list[Any], value: list[Any]) -> bool:
    """True if ``value`` starts with ``items`` (same objects, or equal ones)."""
    if len(value) < len(items):
        return False
    if all(map(operator.is_, items, value)):  # LangGraph's reducers keep the same objects
        return True
    return all(a is b or a == b for a, b in zip(items, value, strict=False))


async def plan(
    codec: ValueCodec,
    blob_id: str,
    channel: str,
    value: Any,
    tip: Tip | None,
    written: Sequence[tuple[int, Any]],
    fetch: Fetch,
    cap: int = SEGMENT_BYTES,
) -> Planned:
    """A channel value's blob: a delta on ``tip`` if the value extends it (a spine and
    its segments every `TAIL` steps), else whole.

    ``written``: the (entry seq, stored value) of the parent checkpoint's writes to the
    channel. When the delta is exactly the one write (a node that returned its new
    messages), the delta names that write instead of storing the messages again. No
    merge makes a segment of more than ``cap`` bytes.
    """
    if tip is not None and type(value) is list and extends(tip.items, value):
        added = codec.encode(value[len(tip.items) :])
        doc = {"ch": channel, "base": tip.seq, "root": tip.root, "n": len(tip.items)}
        if len(written) == 1 and written[0][1] == added:
            doc["from"] = written[0][0]
        else:
            doc["add"] = added
        parts = [*tip.parts, (len(value) - len(tip.items), added)]
        if len(parts) < TAIL or not tip.segs:
            return Planned(doc, tip.segs, parts, [])
        return await _compact(codec, blob_id, channel, value, tip.segs, parts, fetch, cap)
    whole = {"ch": channel, "value": codec.encode(value)}
    segs = [[blob_id, len(value), FIXED, 0]] if type(value) is list else []
    return Planned(whole, segs, [], [])


async def _compact(
    codec: ValueCodec,
    blob_id: str,
    channel: str,
    value: list[Any],
    segs: list[list[Any]],
    parts: list[tuple[int, dict[str, Any]]],
    fetch: Fetch,
    cap: int,
) -> Planned:
    """The tail as level 1 segments, full levels merged upward, and the spine on them."""
    made: dict[str, dict[str, Any]] = {}
    segs = list(segs)
    for index, (count, size, group) in enumerate(_packs(parts, cap)):
        seg_id = segment_id(blob_id, 1) + (f"-{index}" if index else "")
        made[seg_id] = _segment(channel, count, group)
        segs.append([seg_id, count, 1, size])
    while len(segs) >= FANOUT and _same_level(segs[-FANOUT:]):
        children, level = segs[-FANOUT:], int(segs[-1][2]) + 1
        size = sum(int(c[3]) for c in children)
        if size > cap:  # too large to merge: these stay as they are, for good
            segs[-FANOUT:] = [[c[0], c[1], FIXED, c[3]] for c in children]
            break
        start = sum(int(s[1]) for s in segs[:-FANOUT])
        joined: list[dict[str, Any]] = []
        for child_id, count, _, _ in children:
            payload = made.pop(child_id, None)
            if payload is None:
                try:
                    payload = await fetch(child_id)
                except NotFoundError:  # pruned meanwhile: the items are here anyway
                    payload = _segment(channel, count, [codec.encode(value[start : start + count])])
            joined.extend(payload["parts"])
            start += count
        count = sum(int(c[1]) for c in children)
        made[segment_id(blob_id, level)] = _segment(channel, count, joined)
        segs[-FANOUT:] = [[segment_id(blob_id, level), count, level, size]]
    drafts = [
        EntryDraft(id=i, kind="lg.blob", payload=p, parent=None, side=True) for i, p in made.items()
    ]
    spine = {"v": VERSION, "ch": channel, "n": len(value), "segs": segs}
    return Planned(spine, segs, [], drafts)


def _packs(
    parts: list[tuple[int, dict[str, Any]]], cap: int
) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """The parts in order, in groups of at most ``cap`` bytes of JSON (a part larger than
    that alone): (items, bytes, documents) per group."""
    groups: list[tuple[int, int, list[dict[str, Any]]]] = []
    count, size = 0, 0
    docs: list[dict[str, Any]] = []
    for items, doc in parts:
        doc_size = len(encode_json(doc))
        if docs and size + doc_size > cap:
            groups.append((count, size, docs))
            count, size, docs = 0, 0, []
        count, size = count + items, size + doc_size
        docs.append(doc)
    groups.append((count, size, docs))
    return groups


def _same_level(segs: list[list[Any]]) -> bool:
    level = segs[-1][2]
    return level != FIXED and all(s[2] == level for s in segs)


def _segment(channel: str, count: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"v": VERSION, "ch": channel, "n": count, "parts": join(parts)}


def join(parts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documents with each run of plain message lists (or JSON lists) made one."""
    out: list[dict[str, Any]] = []
    kinds: list[str | None] = []
    for part in parts:
        kind = _list_kind(part)
        if kind is not None and kinds and kinds[-1] == kind:
            out[-1][kind].extend(part[kind])
            continue
        out.append({kind: list(part[kind])} if kind is not None else part)
        kinds.append(kind)
    return out


def _list_kind(part: dict[str, Any]) -> str | None:
    if len(part) != 1:
        return None
    kind = next(iter(part))
    return kind if kind in ("msgs", "json") and type(part[kind]) is list else None
