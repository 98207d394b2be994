"""Command lane overhead per task against a bare asyncio.Queue worker, in one process.

20,000 trivial async tasks go through one lane of concurrency 1, in two patterns:
- burst: enqueue them all, then await every result (``CommandLanes.submit``);
- sequential: await each result before enqueueing the next (``CommandLanes.run``).
The baseline puts ``(fn, future)`` pairs on an ``asyncio.Queue`` served by one worker
task that awaits ``fn()`` and sets the future: the least a FIFO lane can do. The lane
also keeps FIFO order, counters, wait tracking, cancellation and idle clean-up.
Target: within 2x of the baseline per task, for both patterns.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from statekeeper.runtime import CommandLanes

TASKS = 20_000
REPEAT = 5
TARGET = 2.0
PATTERNS = ("burst", "sequential")


async def trivial() -> int:
    """The task: as small as an async task gets."""
    return 1


class QueueWorker:
    """The baseline: one worker task serving an asyncio.Queue of (fn, future) pairs."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[Callable[[], Awaitable[Any]], asyncio.Future[Any]]]
        self.queue = asyncio.Queue()
        self.worker = asyncio.get_running_loop().create_task(self.work())

    async def work(self) -> None:
        while True:
            fn, future = await self.queue.get()
            try:
                result = await fn()
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def submit(self, fn: Callable[[], Awaitable[Any]]) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((fn, future))
        return future

    async def close(self) -> None:
        self.worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.worker


async def _lanes(pattern: str) -> float:
    lanes = CommandLanes()
    start = time.perf_counter()
    if pattern == "burst":
        for future in [lanes.submit("main", trivial) for _ in range(TASKS)]:
            await future
    else:
        for _ in range(TASKS):
            await lanes.run("main", trivial)
    elapsed = time.perf_counter() - start
    await lanes.close()
    assert lanes.stats().completed == TASKS
    return elapsed


async def _queue(pattern: str) -> float:
    baseline = QueueWorker()
    start = time.perf_counter()
    if pattern == "burst":
        for future in [baseline.submit(trivial) for _ in range(TASKS)]:
            await future
    else:
        for _ in range(TASKS):
            await baseline.submit(trivial)
    elapsed = time.perf_counter() - start
    await baseline.close()
    return elapsed


async def run() -> dict[str, dict[str, float]]:
    """Best of REPEAT interleaved runs per pattern, in microseconds per task."""
    results: dict[str, dict[str, float]] = {}
    for pattern in PATTERNS:
        lane_times, queue_times = [], []
        for _ in range(REPEAT):
            lane_times.append(await _lanes(pattern))
            queue_times.append(await _queue(pattern))
        results[pattern] = {
            "lanes_us": min(lane_times) / TASKS * 1e6,
            "queue_us": min(queue_times) / TASKS * 1e6,
        }
    return results


def report(results: dict[str, dict[str, float]]) -> list[str]:
    """Print the table and the verdicts; return the missed targets."""
    print(f"{'pattern':<11} {'lanes us':>9} {'queue us':>9} {'ratio':>6}")
    failed = []
    for pattern, r in results.items():
        ratio = r["lanes_us"] / r["queue_us"]
        verdict = "ok" if ratio <= TARGET else "MISSED"
        print(
            f"{pattern:<11} {r['lanes_us']:>9.2f} {r['queue_us']:>9.2f} {ratio:>6.2f}"
            f"  (target <= {TARGET})  {verdict}"
        )
        if ratio > TARGET:
            failed.append(f"lanes {pattern}: per-task overhead / asyncio.Queue worker")
    return failed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
