"""The ways a caller thread of the threads tests (`test_threads.py`) appends a batch:
awaited, with a timeout, cancelled, or abandoned with its loop or thread."""

from __future__ import annotations

import asyncio
import contextlib
import random
from functools import partial

from statekeeper.stores import Store
from statekeeper.stores.base import AppendResult

from .threads import Batch, Caller, _append, _drop, _quietly, new_loop


def append(caller: Caller, store: Store, batch: Batch, mode: str) -> None:
    """Append the batch and wait for the store's answer."""
    batch.result = caller.call(f"appending {batch.key}", partial(_append, store, batch), mode)


def append_with_timeout(
    caller: Caller, store: Store, batch: Batch, mode: str, timeout: float
) -> None:
    """Append under ``asyncio.wait_for`` with a tiny timeout: often cancelled mid-write."""

    async def attempt() -> None:
        with contextlib.suppress(TimeoutError):  # cancelled: told nothing
            batch.result = await asyncio.wait_for(_append(store, batch), timeout)

    caller.call(f"appending {batch.key} within {timeout * 1000:.1f} ms", attempt, mode)


def append_cancelled(caller: Caller, store: Store, batch: Batch, mode: str, spins: int) -> None:
    """Start the append as a task and cancel it after ``spins`` loop iterations."""

    async def attempt() -> None:
        task = asyncio.ensure_future(_append(store, batch))
        for _ in range(spins):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # told nothing
            batch.result = await task

    caller.call(f"appending {batch.key}, cancelled after {spins} spins", attempt, mode)


def append_abandoned_by_asyncio_run(caller: Caller, store: Store, batch: Batch, spins: int) -> None:
    """``asyncio.run`` of a function that starts the append as a task and returns after
    ``spins`` iterations: ``asyncio.run`` cancels the task and closes its loop."""
    started: list[asyncio.Task[AppendResult]] = []

    async def leave() -> None:
        started.append(asyncio.ensure_future(_append(store, batch)))
        for _ in range(spins):
            await asyncio.sleep(0)

    caller.timed(
        f"appending {batch.key}, left after {spins} spins",
        lambda: asyncio.run(_quietly(caller.ledger, leave)),
    )
    _note_outcome(caller, batch, started[0])


def _start_and_leave(caller: Caller, store: Store, batch: Batch, spins: int, close: bool) -> None:
    """Start the append as a task in a new loop, run the loop ``spins`` times, then close
    the loop without awaiting the task (whose coroutine is then closed, as the garbage
    collector would), or (``close=False``) just leave it open, with the task pending."""
    loop = new_loop(caller.ledger)
    task = loop.create_task(_append(store, batch))
    try:
        for spin in range(max(1, spins)):  # started at least (else: "never awaited")
            loop.run_until_complete(asyncio.sleep(0 if spin % 4 else 0.001))
        _note_outcome(caller, batch, task)
    finally:
        if close:
            loop.close()
            _drop(caller.ledger, caller.name, batch.key, task)
        else:
            caller.ledger.leave_open(loop, task, batch.key)


def abandon_in_closed_loop(caller: Caller, store: Store, batch: Batch, spins: int) -> None:
    """Start the append in a loop of its own that is closed with the append pending."""
    caller.timed(
        f"appending {batch.key} in a loop closed after {spins} spins",
        lambda: _start_and_leave(caller, store, batch, spins, close=True),
    )


def abandon_in_exited_thread(caller: Caller, store: Store, batch: Batch, spins: int) -> None:
    """Start the append on a thread that runs its loop briefly and exits (the loop is
    left open, never run again)."""
    caller.helper(
        f"appending {batch.key} on a thread exiting after {spins} spins",
        lambda: _start_and_leave(caller, store, batch, spins, close=False),
    )


def _note_outcome(caller: Caller, batch: Batch, task: asyncio.Future[AppendResult]) -> None:
    """A task that ended before its caller left: its answer (an error is a problem)."""
    if not task.done() or task.cancelled():
        return
    error = task.exception()
    if error is None:
        batch.result = task.result()
    else:
        caller.ledger.failed(caller.name, f"appending {batch.key}", error)


# -- afterwards ----------------------------------------------------------------------------


def spins(rng: random.Random) -> int:
    """How many loop iterations a caller lets an append run before it leaves: mostly
    few (cancelled or abandoned as it starts), sometimes enough to finish."""
    return rng.choice((0, 1, 1, 2, 3, 5, 8, 13, 40))
