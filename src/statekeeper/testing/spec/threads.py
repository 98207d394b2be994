"""The harness of the threads tests (`test_threads`): caller threads, the ways they call
the store, the ledger of every batch they sent, and the checks made afterwards.

A caller is a daemon thread (a hung one cannot keep the test process alive) that calls
ONE store object from event loops of its own: one loop for all its calls
(``new_event_loop`` + ``run_until_complete``), or a new one per call (``asyncio.run``),
or none at all (the blocking facade). Every call is timed; the test waits for the callers
with a deadline while its own loop (the store's home loop) keeps running, and fails
naming the callers still stuck and what they were doing, instead of hanging.

Each append is one `Batch` of entries with ids ``<batch>.<i>`` and the payload
``{"batch": key, "i": i}``, so the checks can tell, from the stored entries alone, which
batches landed, whole or not, and whether two were interleaved.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

from statekeeper.stores import Store
from statekeeper.stores.base import AppendResult, EntryDraft, SessionPatch

from .support import TENANT

T = TypeVar("T")


def _no_caret_anchors() -> None:
    """Format tracebacks without parsing their source lines (Python 3.11 and 3.12).

    Two threads building ASTs at once can make one fail with "SystemError: AST
    constructor recursion depth mismatch" (CPython gh-106905: the depth is kept per
    interpreter). Python 3.11+ parses a traceback's lines to place its ``~~~^^^`` carets,
    and pytest formats in the thread where an exception goes unraised or unhandled: when
    a store misbehaves, the callers' threads do that while pytest parses the failed test's
    source in the main thread, and the session crashes (INTERNALERROR) instead of
    reporting the failure. Without the anchors the carets underline whole expressions.
    Installed once, process-wide, by importing this module.
    """
    if not (3, 11) <= sys.version_info < (3, 13):
        return
    anchors = getattr(traceback, "_extract_caret_anchors_from_line_segment", None)
    if anchors is None or getattr(anchors, "_statekeeper", False):
        return

    def no_anchors(segment: str) -> None:
        return None

    no_anchors._statekeeper = True  # type: ignore[attr-defined]
    traceback._extract_caret_anchors_from_line_segment = no_anchors  # type: ignore[attr-defined]


_no_caret_anchors()


def _fail(message: str) -> NoReturn:
    """Fail the test with ``message`` alone, no traceback (nothing of it to show, and
    nothing to parse while the callers' threads may still be reporting errors)."""
    pytest.fail(message, pytrace=False)


CALL_LIMIT = 30.0
"""Seconds one call may take. Every call is timed and a slower one fails the test."""
WAIT_LIMIT = 60.0
"""Seconds the callers of a test may take together: past it the test fails (naming the
callers still stuck) instead of hanging."""
SETTLE_LIMIT = 30.0
"""Seconds the stored sessions may keep changing after the last caller ended (a write
whose caller's loop closed may still land)."""
OWN_LOOP = "own-loop"
"""A caller making all its calls on one event loop of its own (``run_until_complete``)."""
PER_CALL = "asyncio-run"
"""A caller making each call in a new event loop (``asyncio.run``)."""


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The exception handler of the callers' loops: what asyncio reports, logged without
    a traceback (formatting one parses source with `ast` on Python 3.11, which crashes
    pytest when it formats a failure at the same time in the main thread:
    "AST constructor recursion depth mismatch"). A task "destroyed but pending" is not
    reported: the loops closed with an append pending make them on purpose."""
    message = str(context.get("message", ""))
    if message.startswith("Task was destroyed but it is pending"):
        return
    logging.getLogger("asyncio").error("%s: %r", message, context.get("exception"))


async def _quietly(ledger: Ledger, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``await make()`` on a loop of ``asyncio.run``, with `_quiet` as its handler."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_quiet)
    ledger.track(loop)
    return await make()


def new_loop(ledger: Ledger) -> asyncio.AbstractEventLoop:
    """A new event loop for a caller (with `_quiet` as its exception handler)."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_quiet)
    ledger.track(loop)
    return loop


@dataclass(eq=False)
class Batch:
    """One ``append_entries`` call of several entries, and what its caller was told."""

    key: str
    session_id: str
    size: int
    how: str
    """How it was sent: ``whole``, ``wait_for``, ``cancel``, ``closed-loop``, ..."""
    drafts: list[EntryDraft] = field(init=False)
    result: AppendResult | None = None
    """What the store acknowledged (None: the caller was never told it was written)."""

    def __post_init__(self) -> None:
        self.drafts = [
            EntryDraft(id=f"{self.key}.{i}", payload={"batch": self.key, "i": i})
            for i in range(self.size)
        ]

    @property
    def patch(self) -> SessionPatch:
        """Counts the batch's entries in the head, atomically with them."""
        return SessionPatch(add={"message_count": self.size})

    def describe(self) -> str:
        return f"batch {self.key} ({self.how}, {self.size} entries, {self.session_id})"


class Ledger:
    """What every caller of a test sent and saw (thread-safe)."""

    def __init__(self, seed: int | str | None = None) -> None:
        self.seed = seed
        self.batches: list[Batch] = []
        self.problems: list[str] = []
        """Errors raised in callers and wrong things they saw."""
        self.slow: list[str] = []
        """Calls that took longer than `CALL_LIMIT`."""
        self.calls = 0
        self.longest = 0.0
        self.leftovers: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any], str]] = []
        """Loops left open by threads that exited mid-write, with the pending append and
        its batch key (closed when the test ends)."""
        self.stuck: list[str] = []
        """Helper threads that did not end."""
        self.loops: list[asyncio.AbstractEventLoop] = []
        """Every loop the callers ran (to stop those still running when a test fails)."""
        self._lock = threading.Lock()
        self._keys: set[str] = set()

    def batch(self, key: str, session_id: str, size: int, how: str) -> Batch:
        """A new batch (keys are unique in a test)."""
        made = Batch(key, session_id, size, how)
        with self._lock:
            assert key not in self._keys, key
            self._keys.add(key)
            self.batches.append(made)
        return made

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    def failed(self, who: str, what: str, exc: BaseException) -> None:
        """An exception a caller did not expect, with where it was raised.

        Formatted by hand: `traceback.format_exception` parses source lines with `ast`
        on Python 3.11, which is not safe while another thread does too (pytest, in the
        main thread, formatting a failure): "AST constructor recursion depth mismatch".
        """
        frames = traceback.extract_tb(exc.__traceback__)[-4:]
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[::-1])
        self.problem(f"{who}, {what}: {type(exc).__name__}: {exc} (at {where})")

    def timed(self, who: str, what: str, seconds: float) -> None:
        with self._lock:
            self.calls += 1
            self.longest = max(self.longest, seconds)
            if seconds > CALL_LIMIT:
                self.slow.append(f"{who}, {what}: {seconds:.1f} s")

    def context(self) -> str:
        """Said with every failure: the seed and what was sent."""
        hows = Counter(b.how for b in self.batches)
        acked = sum(b.result is not None for b in self.batches)
        seed = "" if self.seed is None else f"seed {self.seed!r}; "
        return (
            f"{seed}{len(self.batches)} batches ({acked} acknowledged; "
            f"{', '.join(f'{n} {h}' for h, n in sorted(hows.items()))}), {self.calls} calls, "
            f"the longest {self.longest:.2f} s"
        )

    def track(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self.loops.append(loop)

    def stop_loops(self) -> None:
        """Stop the callers' loops still running (stuck in a call): once the test has
        failed, their threads end instead of acting on the store in later tests."""
        with self._lock:
            running = [loop for loop in self.loops if loop.is_running()]
        for loop in running:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(loop.stop)

    def never_ended(self, text: str) -> None:
        with self._lock:
            self.stuck.append(text)

    def leave_open(
        self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], key: str
    ) -> None:
        with self._lock:
            self.leftovers.append((loop, task, key))

    def close_leftovers(self, drop: bool = True) -> None:
        """End the appends that exited threads left pending (as the garbage collector
        would, but here and now; unless not ``drop``), then close their loops."""
        while self.leftovers:
            loop, task, key = self.leftovers.pop()
            if drop:
                _drop(self, "the test", key, task)
            if not loop.is_running():
                loop.close()


def _drop(ledger: Ledger, who: str, key: str, task: asyncio.Task[Any]) -> None:
    """Close the coroutine of an append its caller abandoned (``GeneratorExit`` in it, as
    when it is collected): done here, where an error it raises is seen, not in whichever
    thread or later test happens to collect it."""
    if not task.done():
        try:
            task.get_coro().close()
        except BaseException as exc:
            ledger.failed(who, f"closing the abandoned append of {key}", exc)


class Caller(threading.Thread):
    """A daemon thread calling the store from event loops of its own (or from none)."""

    def __init__(
        self,
        name: str,
        ledger: Ledger,
        body: Callable[[Caller], None],
        start_together: threading.Barrier | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)  # a hung caller must not keep us alive
        self.ledger = ledger
        self.body = body
        self.start_together = start_together
        self.doing = "starting"
        self.since = time.monotonic()
        self.loop: asyncio.AbstractEventLoop | None = None
        """Its own loop while it calls in `OWN_LOOP` mode."""

    def run(self) -> None:
        try:
            if self.start_together is not None:
                self.start_together.wait(WAIT_LIMIT)
            self.body(self)
        except BaseException as exc:
            self.ledger.failed(self.name, self.doing, exc)
            if self.loop is not None:  # not left to the garbage collector ("unclosed")
                self.loop.close()
        finally:
            self._set_doing("done")

    def _set_doing(self, what: str) -> None:
        self.doing, self.since = what, time.monotonic()

    def timed(self, what: str, call: Callable[[], T]) -> T:
        """Run ``call`` here, timing it (and naming it if it hangs)."""
        self._set_doing(what)
        started = time.perf_counter()
        try:
            result = call()
        finally:
            self.ledger.timed(self.name, what, time.perf_counter() - started)
        self._set_doing(f"after {what}")  # (an error leaves what raised it named)
        return result

    def call(self, what: str, make: Callable[[], Coroutine[Any, Any, T]], mode: str) -> T:
        """Run the coroutine ``make()`` in ``mode``: on this thread's own loop, or in a
        new one (``asyncio.run``)."""
        if mode == PER_CALL:
            return self.timed(what, lambda: asyncio.run(_quietly(self.ledger, make)))
        if self.loop is None or self.loop.is_closed():
            self.loop = new_loop(self.ledger)
        loop = self.loop
        return self.timed(what, lambda: loop.run_until_complete(make()))

    def close_loop(self) -> None:
        """Close this thread's own loop (as a program ending its loop would)."""
        loop, self.loop = self.loop, None
        if loop is not None and not loop.is_closed():
            self.timed("closing its loop", lambda: _close(loop))

    def helper(self, what: str, target: Callable[[], None]) -> None:
        """Run ``target`` on a short-lived thread of its own and wait for it to end."""

        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self.ledger.failed(f"{self.name}-helper", what, exc)

        thread = threading.Thread(target=run, name=f"{self.name}-helper", daemon=True)
        started = time.perf_counter()
        self._set_doing(what)
        thread.start()
        thread.join(CALL_LIMIT)
        self.ledger.timed(self.name, what, time.perf_counter() - started)
        if thread.is_alive():
            self.ledger.never_ended(f"{self.name}, {what}: its helper thread never ended")
        self._set_doing(f"after {what}")


def _close(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()


class Home:
    """The test's own loop (the store's home loop) appending alongside the threads."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.doing = "starting"
        self.since = time.monotonic()

    async def append(self, store: Store, batch: Batch) -> None:
        what = f"appending {batch.key}"
        self.doing, self.since = what, time.monotonic()
        started = time.perf_counter()
        try:
            batch.result = await _append(store, batch)
        finally:
            self.ledger.timed("the home loop", what, time.perf_counter() - started)
        self.doing = f"after {what}"


async def home_appends(home: Home, store: Store, session_ids: Sequence[str], batches: int) -> None:
    """Append ``batches`` batches from the home loop, round the sessions, a little apart."""
    for n in range(batches):
        target = session_ids[n % len(session_ids)]
        await home.append(store, home.ledger.batch(f"home-{n}", target, 2 + n % 3, "home"))
        await asyncio.sleep(0.002)


async def run_callers(
    callers: Sequence[Caller],
    ledger: Ledger,
    home: Callable[[Home], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Start the callers (and ``home`` on this loop, the store's home loop, which keeps
    running meanwhile), wait for them, and fail, naming the stuck ones, if they are not
    done within `WAIT_LIMIT`; then fail on what they saw go wrong and on calls slower
    than `CALL_LIMIT`."""
    for caller in callers:
        caller.start()
    deadline = time.monotonic() + WAIT_LIMIT
    at_home = Home(ledger)
    homework = asyncio.ensure_future(home(at_home)) if home is not None else None
    await asyncio.to_thread(_join, callers, deadline)
    now = time.monotonic()
    stuck = [f"{c.name}: {c.doing}, for {now - c.since:.1f} s" for c in callers if c.is_alive()]
    if homework is not None:
        await asyncio.wait([homework], timeout=max(0.0, deadline - now))
        if not homework.done():
            stuck.append(f"the home loop: {at_home.doing}, for {now - at_home.since:.1f} s")
            homework.cancel()
        elif (error := homework.exception()) is not None:
            ledger.failed("the home loop", at_home.doing, error)
    stuck += ledger.stuck
    seen = list(ledger.problems)
    if stuck:  # the test fails: what it leaves must not act on stores of later tests
        ledger.stop_loops()  # (the stuck calls end with "Event loop stopped ...")
        await asyncio.to_thread(_join, callers, time.monotonic() + 2.0)
    if stuck or seen or ledger.slow:
        ledger.close_leftovers(drop=False)
    if stuck:
        _fail(
            f"callers did not end within {WAIT_LIMIT:.0f} s ({ledger.context()})"
            + _listed(stuck + seen)
        )
    if ledger.problems:
        _fail(f"({ledger.context()})" + _listed(ledger.problems))
    if ledger.slow:
        _fail(f"calls slower than {CALL_LIMIT:.0f} s ({ledger.context()})" + _listed(ledger.slow))


def _clean_up(ledger: Ledger) -> None:
    """Close the loops exited threads left open, and collect what abandoned appends left
    (their coroutines end now, in this test, instead of in whichever test runs next)."""
    ledger.close_leftovers()
    gc.collect()


def _listed(problems: Sequence[str], limit: int = 40) -> str:
    shown = "\n  ".join(problems[:limit])
    more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
    return f":\n  {shown}{more}"


def _join(threads: Sequence[threading.Thread], deadline: float) -> None:
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


# -- the ways a caller appends -------------------------------------------------------------


def _append(store: Store, batch: Batch) -> Coroutine[Any, Any, AppendResult]:
    return store.append_entries(TENANT, batch.session_id, batch.drafts, patch=batch.patch)
