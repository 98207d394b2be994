"""One store object, many threads and event loops (the `THREADS` capability).

The store is opened on the test's loop (its home loop, which goes on appending). Eight
threads use that same object meanwhile, from loops of their own: one loop per thread
(``new_event_loop`` + ``run_until_complete``), a new loop per call (``asyncio.run``), or
no loop at all (the blocking facade, `statekeeper.sync`). Some callers are cancelled as
their append starts; some close their loop, or end their thread, with an append pending.

Whatever happens: no call takes longer than `CALL_LIMIT` (a hung one fails the test,
naming the thread and what it was doing); every acknowledged batch is stored as it was
acknowledged; every batch is stored whole and contiguous, or not at all; a session's
seqs run 1..n with no gap or duplicate, one chain, counted by its head. The harness is
`statekeeper.testing.spec.threads`.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import pytest

from statekeeper.stores import Store
from statekeeper.stores.base import Entry, SessionRecord
from statekeeper.sync import blocking
from statekeeper.testing.registry import THREADS, needs

from .support import TENANT, new_session
from .thread_calls import (
    abandon_in_closed_loop,
    abandon_in_exited_thread,
    append,
    append_abandoned_by_asyncio_run,
    append_cancelled,
    append_with_timeout,
    spins,
)
from .thread_checks import verify
from .threads import (
    OWN_LOOP,
    PER_CALL,
    Batch,
    Caller,
    Home,
    Ledger,
    home_appends,
    run_callers,
)

CALLERS = 8
"""Threads using the one store object at once."""
ROUNDS = 6
"""Appends each thread makes in the fixed tests."""
SHARED = "shared"
"""The session every thread appends to."""
SEED = int(os.environ.get("STATEKEEPER_TEST_SEED", "20"))
"""The seed of the random choices (``STATEKEEPER_TEST_SEED`` replays a failed run: each
failure message names the seed it ran with)."""
STRESS_SECONDS = 2.0
"""How long the stress test's threads keep going."""
LOOP_MODES = [OWN_LOOP, PER_CALL]
WAYS = ("whole", "wait_for", "cancel", "asyncio.run-left", "closed-loop", "exited-thread")
"""Every way a caller sends an append in the cancellation tests."""


def size_of(n: int) -> int:
    """Entries in a thread's ``n``-th batch: 2, 3 or 4 (a batch is several entries)."""
    return 2 + n % 3


def own_session(caller: Caller, index: int = 0) -> str:
    return f"{caller.name}-own{index}"


def create_own(caller: Caller, store: Store, session_id: str, mode: str) -> None:
    record = SessionRecord(id=session_id, tenant=TENANT)
    caller.call(f"creating {session_id}", partial(store.create_session, record), mode)


def acknowledged(caller: Caller, session_id: str) -> list[Batch]:
    return [b for b in caller.ledger.batches if b.session_id == session_id and b.result is not None]


def check_read(caller: Caller, session_id: str, before: list[Batch], entries: list[Entry]) -> None:
    """Every batch acknowledged before a read is in what it read."""
    ids = {e.id for e in entries}
    missing = [b.key for b in before if not {d.id for d in b.drafts} <= ids]
    if missing:
        caller.ledger.problem(
            f"{caller.name}: reading {session_id} after they were acknowledged, batches "
            f"{missing} are missing"
        )


def read_back(caller: Caller, store: Store, session_id: str, mode: str) -> None:
    """Read a session from the caller's loop: every batch acknowledged before is there."""
    before = acknowledged(caller, session_id)
    read = partial(store.read_entries, TENANT, session_id)
    check_read(caller, session_id, before, caller.call(f"reading {session_id}", read, mode))


def send(caller: Caller, store: Store, batch: Batch, mode: str, rng: random.Random) -> None:
    """Send a batch the way ``batch.how`` says."""
    how = batch.how
    if how == "whole":
        append(caller, store, batch, mode)
    elif how == "wait_for":
        timeout = rng.choice((0.0002, 0.001, 0.003, 0.01))
        append_with_timeout(caller, store, batch, mode, timeout)
    elif how == "cancel":
        append_cancelled(caller, store, batch, mode, spins(rng))
    elif how == "asyncio.run-left":
        append_abandoned_by_asyncio_run(caller, store, batch, spins(rng))
    elif how == "closed-loop":
        abandon_in_closed_loop(caller, store, batch, spins(rng))
    elif how == "exited-thread":
        abandon_in_exited_thread(caller, store, batch, spins(rng))
    else:
        raise AssertionError(f"no way {how!r}")


def callers(ledger: Ledger, body: Callable[[Caller], None]) -> list[Caller]:
    """The threads of a test, each running ``body``, started together."""
    together = threading.Barrier(CALLERS)
    return [Caller(f"t{w}", ledger, body, together) for w in range(CALLERS)]


def from_home(store: Store, *session_ids: str) -> Callable[[Home], Coroutine[Any, Any, None]]:
    """The home loop's part: `ROUNDS` appends alongside the threads, to these sessions."""
    return lambda home: home_appends(home, store, session_ids, ROUNDS)


# -- whole appends -------------------------------------------------------------------------


def append_to_shared(store: Store, mode: str, caller: Caller) -> None:
    for n in range(ROUNDS):
        batch = caller.ledger.batch(f"{caller.name}-{n}", SHARED, size_of(n), "whole")
        append(caller, store, batch, mode)
    read_back(caller, store, SHARED, mode)
    caller.close_loop()


@needs(THREADS)
@pytest.mark.parametrize("mode", LOOP_MODES)
async def test_threads_with_loops_of_their_own_append_to_one_session(
    store: Store, mode: str
) -> None:
    await new_session(store, SHARED)
    ledger = Ledger()
    threads = callers(ledger, partial(append_to_shared, store, mode))
    await run_callers(threads, ledger, from_home(store, SHARED))
    await verify(store, ledger, [SHARED])
    assert sum(b.result is not None for b in ledger.batches) == (CALLERS + 1) * ROUNDS


def append_to_own(store: Store, mode: str, caller: Caller) -> None:
    mine = [own_session(caller, 0), own_session(caller, 1)]
    for session_id in mine:
        create_own(caller, store, session_id, mode)
    for n in range(ROUNDS):
        batch = caller.ledger.batch(f"{caller.name}-{n}", mine[n % 2], size_of(n), "whole")
        append(caller, store, batch, mode)
    for session_id in mine:
        read_back(caller, store, session_id, mode)
    caller.close_loop()


@needs(THREADS)
@pytest.mark.parametrize("mode", LOOP_MODES)
async def test_threads_with_loops_of_their_own_append_to_sessions_of_their_own(
    store: Store, mode: str
) -> None:
    await new_session(store, "home-own")
    ledger = Ledger()
    threads = callers(ledger, partial(append_to_own, store, mode))
    await run_callers(threads, ledger, from_home(store, "home-own"))
    sessions = sorted({b.session_id for b in ledger.batches})
    assert len(sessions) == 2 * CALLERS + 1
    await verify(store, ledger, sessions)
    assert sum(b.result is not None for b in ledger.batches) == (CALLERS + 1) * ROUNDS


# -- cancelled callers, closed loops, exited threads ---------------------------------------


def append_every_way(store: Store, mode: str, caller: Caller) -> None:
    """Each way once (the threads start at different ways), on the shared session or its
    own; then a whole append to each, which must not wait on an abandoned one."""
    w = int(caller.name[1:])
    rng = random.Random(f"{SEED}/{caller.name}")
    mine = own_session(caller)
    create_own(caller, store, mine, mode)
    for n in range(len(WAYS)):
        how = WAYS[(w + n) % len(WAYS)]
        target = SHARED if (w + n) % 2 else mine
        batch = caller.ledger.batch(f"{caller.name}-{n}", target, size_of(n), how)
        send(caller, store, batch, mode, rng)
    for n, target in enumerate((SHARED, mine), start=len(WAYS)):
        batch = caller.ledger.batch(f"{caller.name}-{n}", target, 2, "whole")
        append(caller, store, batch, mode)
        read_back(caller, store, target, mode)
    caller.close_loop()


@needs(THREADS)
@pytest.mark.parametrize("mode", LOOP_MODES)
async def test_cancelled_callers_and_closed_loops_leave_no_batch_torn_or_lost(
    store: Store, mode: str
) -> None:
    await new_session(store, SHARED)
    ledger = Ledger(SEED)
    threads = callers(ledger, partial(append_every_way, store, mode))
    await run_callers(threads, ledger, from_home(store, SHARED))
    await verify(store, ledger, [SHARED, *(f"t{w}-own0" for w in range(CALLERS))])


# -- a seeded mix of everything ------------------------------------------------------------

STRESS_WAYS = (*WAYS, "read", "close-own-loop")
STRESS_WEIGHTS = (4, 2, 2, 1, 1, 1, 2, 1)
STRESS_OPS = 60
"""At most this many operations per thread (the run also ends after `STRESS_SECONDS`)."""


def stress(store: Store, deadline: float, caller: Caller) -> None:
    """Random operations until the deadline; a batch not acknowledged is sometimes sent
    again, whole (the same drafts: stored once, whichever attempt lands)."""
    rng = random.Random(f"{SEED}/{caller.name}")
    mine = own_session(caller)
    create_own(caller, store, mine, rng.choice(LOOP_MODES))
    for n in range(STRESS_OPS):
        if time.monotonic() > deadline:
            break
        mode = rng.choice(LOOP_MODES)
        target = rng.choice((SHARED, mine))
        (how,) = rng.choices(STRESS_WAYS, STRESS_WEIGHTS)
        if how == "read":
            read_back(caller, store, target, mode)
        elif how == "close-own-loop":
            caller.close_loop()
        else:
            batch = caller.ledger.batch(f"{caller.name}-{n}", target, 1 + rng.randrange(4), how)
            send(caller, store, batch, mode, rng)
            if batch.result is None and rng.random() < 0.5:
                batch.how += "+retried"
                append(caller, store, batch, mode)
    for target in (SHARED, mine):
        read_back(caller, store, target, rng.choice(LOOP_MODES))
    caller.close_loop()


@needs(THREADS)
async def test_seeded_stress_of_threads_loops_and_cancellations(store: Store) -> None:
    await new_session(store, SHARED)
    ledger = Ledger(SEED)
    deadline = time.monotonic() + STRESS_SECONDS
    threads = callers(ledger, partial(stress, store, deadline))
    await run_callers(threads, ledger, from_home(store, SHARED))
    await verify(store, ledger, [SHARED, *(f"t{w}-own0" for w in range(CALLERS))])


# -- no loop at all: the blocking facade ---------------------------------------------------


def append_blocking(facade: Any, caller: Caller) -> None:
    """Create, append and read with the blocking facade's calls, from a plain thread."""
    mine = own_session(caller)
    record = SessionRecord(id=mine, tenant=TENANT)
    caller.timed(f"creating {mine}", partial(facade.create_session, record))
    for n in range(ROUNDS):
        target = SHARED if n % 2 else mine
        batch = caller.ledger.batch(f"{caller.name}-{n}", target, size_of(n), "blocking")
        write = partial(facade.append_entries, TENANT, target, batch.drafts, patch=batch.patch)
        batch.result = caller.timed(f"appending {batch.key}", write)
    for session_id in (SHARED, mine):
        before = acknowledged(caller, session_id)
        read = partial(facade.read_entries, TENANT, session_id)
        check_read(caller, session_id, before, caller.timed(f"reading {session_id}", read))


@needs(THREADS)
async def test_the_blocking_facade_serves_plain_threads_at_once(store: Store) -> None:
    await new_session(store, SHARED)
    ledger = Ledger()
    wrapped = blocking.wrap(store)
    threads = callers(ledger, partial(append_blocking, wrapped))
    await run_callers(threads, ledger, from_home(store, SHARED))
    await verify(store, ledger, [SHARED, *(f"t{w}-own0" for w in range(CALLERS))])
    assert sum(b.result is not None for b in ledger.batches) == (CALLERS + 1) * ROUNDS
