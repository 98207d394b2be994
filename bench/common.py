"""Helpers the suites share: the message mix, interleaved timing, and the verdict lines.

- `message_dict` / `as_message`: the n-th message of the realistic mix (two ~400 B chat
  turns, then a ~2 KB tool output), as the plain dict the raw side stores with
  ``json.dumps`` and as the `Message` our side appends (the same ones `bench.sessions`
  uses); `payload_bytes`: the bytes of their JSON, what storage is compared with.
- `interleave`: ours and raw take turns in batches, each batch gives one ratio.
- `spread`, `Verdicts`: "median [min-max]" and the "met / MISSED" lines of a report.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from bench.sessions import as_message, message_dict

__all__ = [
    "Ratios",
    "Verdicts",
    "as_message",
    "interleave",
    "message_dict",
    "payload_bytes",
    "spread",
]

Op = Callable[[int], Awaitable[object]]
"""One timed operation: called with the operation's number (0, 1, 2 ... over all batches)."""


def payload_bytes(dicts: Iterable[dict[str, str]]) -> int:
    """Bytes of the messages' JSON: what either side has to store at the least."""
    return sum(len(json.dumps(d).encode()) for d in dicts)


class Ratios(list[float]):
    """Per-batch ratios (ours time / raw time), with the mean time of one operation."""

    ours_us: float = 0.0
    raw_us: float = 0.0


async def interleave(
    ours: Op, raw: Op, batches: int, batch_size: int, *, warmup: int = 1
) -> Ratios:
    """Run ``batches`` batches of ``batch_size`` operations on each side, taking turns.

    Batch ``b`` times ``ours(n)`` for its ``batch_size`` numbers ``n``, then ``raw(n)``
    for the same numbers (every other batch raw goes first, so neither side always runs
    right after the other's writes). Both sides get the same numbers, so they handle the
    same messages. Returns one ratio per batch; ``warmup`` batches run first and do not
    count (their numbers come before the measured ones).
    """
    ratios = Ratios()
    totals = {"ours": 0.0, "raw": 0.0}
    sides = {"ours": ours, "raw": raw}
    for batch in range(-warmup, batches):
        numbers = range((batch + warmup) * batch_size, (batch + warmup + 1) * batch_size)
        took = {}
        for side in ("ours", "raw") if batch % 2 == 0 else ("raw", "ours"):
            op = sides[side]
            started = time.perf_counter()
            for n in numbers:
                await op(n)
            took[side] = time.perf_counter() - started
        if batch >= 0:
            ratios.append(took["ours"] / took["raw"])
            totals["ours"] += took["ours"]
            totals["raw"] += took["raw"]
    count = batches * batch_size
    ratios.ours_us = totals["ours"] / count * 1e6
    ratios.raw_us = totals["raw"] / count * 1e6
    return ratios


def spread(values: list[float]) -> str:
    """``median [min-max]`` of the values."""
    return f"{statistics.median(values):5.2f} [{min(values):.2f}-{max(values):.2f}]"


class Verdicts:
    """Prints one line per target (value, limit, met / MISSED) and keeps the missed ones."""

    WIDTH = 44

    def __init__(self) -> None:
        self.missed: list[str] = []

    def at_most(self, name: str, values: float | list[float], limit: float) -> bool:
        """Target: the (median) value is at most ``limit``."""
        return self._check(name, values, limit, "<=")

    def at_least(self, name: str, values: float | list[float], limit: float) -> bool:
        """Target: the (median) value is at least ``limit``."""
        return self._check(name, values, limit, ">=")

    def info(self, name: str, values: float | list[float]) -> None:
        """A figure without a target."""
        print(f"{name:<{self.WIDTH}} {_shown(values)}")

    def _check(self, name: str, values: float | list[float], limit: float, op: str) -> bool:
        value = statistics.median(values) if isinstance(values, list) else values
        met = value <= limit if op == "<=" else value >= limit
        print(
            f"{name:<{self.WIDTH}} {_shown(values)}  (target {op} {limit:.3g})  "
            f"{'met' if met else 'MISSED'}"
        )
        if not met:
            self.missed.append(name)
        return met


def _shown(values: float | list[float]) -> str:
    if isinstance(values, list):
        return f"{spread(values):>20}"
    return f"{values:>20.2f}"


async def reachable(url: str, default_port: int, what: str = "") -> str | None:
    """None if a server answers at the URL's host and port, else why not (``what``
    names the server in the reason: "no PostgreSQL server at ...")."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
    except (OSError, TimeoutError) as exc:
        server = f"{what} server" if what else "server"
        return f"no {server} at {host}:{port} ({exc.__class__.__name__})"
    writer.close()
    await writer.wait_closed()
    return None
