"""Other OS processes writing to the same data (the `PROCESSES` capability).

Eight processes, started together, append batches to one session, events to one log
and updates to one record. Nothing may be lost, duplicated, interleaved or refused
(SQLite's "database is locked" included), and the session stays one valid chain.
"""

from __future__ import annotations

import asyncio
import os
import sys
from asyncio.subprocess import PIPE, Process
from collections.abc import Sequence
from pathlib import Path

import pytest

import statekeeper
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import Entry, Event
from statekeeper.testing.registry import PROCESSES, Backend, needs

from .appender import KEY, LOG, NAMESPACE, SESSION, TENANT, batch_size
from .support import new_session

WRITERS = 8
APPENDS = 25
WAIT = 120.0
"""Seconds one process may take before the test fails instead of hanging."""
PACKAGE_ROOT = str(Path(statekeeper.__file__).resolve().parents[1])
"""Where this statekeeper is imported from: the writers must run the same code."""
MINE = [(n, i) for n in range(APPENDS) for i in range(batch_size(n))]
"""The (round, index) of every entry one writer appends, in its order."""
TOTAL = WRITERS * len(MINE)


async def spawn(url: str, name: str, imports: Sequence[str]) -> Process:
    """Start one writer, on this very statekeeper (not another installed one)."""
    paths = [PACKAGE_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "statekeeper.testing.spec.appender"),
        *(url, name, str(APPENDS), *imports),
        stdin=PIPE,
        stdout=PIPE,
        stderr=PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
    )


async def run_together(procs: list[Process]) -> list[str]:
    """Let the writers go at once, when all have opened the store; their stderr."""
    for proc in procs:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT)
        if line != b"ready\n":
            _, err = await asyncio.wait_for(proc.communicate(), WAIT)
            pytest.fail(f"a writer did not start: {err.decode()}")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    errors = []
    for proc in procs:
        _, err = await asyncio.wait_for(proc.communicate(), WAIT)
        assert proc.returncode == 0, err.decode()
        errors.append(err.decode())
    return errors


def check_transcript(entries: list[Entry]) -> None:
    assert [e.seq for e in entries] == list(range(1, TOTAL + 1))
    assert [e.parent_seq for e in entries] == [None, *range(1, TOTAL)]  # one valid chain
    expected_ids = [f"p{w}-{n}-{i}" for w in range(WRITERS) for n, i in MINE]
    assert sorted(e.id for e in entries) == sorted(expected_ids)  # none lost or doubled
    for w in range(WRITERS):
        mine = [e for e in entries if e.payload["by"] == f"p{w}"]
        assert [(e.payload["n"], e.payload["i"]) for e in mine] == MINE  # in its own order
        for n in range(APPENDS):  # a batch is contiguous: never interleaved
            seqs = [e.seq for e in mine if e.payload["n"] == n]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def check_events(events: list[Event]) -> None:
    assert [e.seq for e in events] == list(range(1, 2 * WRITERS * APPENDS + 1))
    pairs = list(zip(events[::2], events[1::2], strict=True))
    assert all((a.stream, a.kind) == (b.stream, b.kind) for a, b in pairs)  # batches whole
    for w in range(WRITERS):
        assert [a.kind for a, _ in pairs if a.stream == f"p{w}"] == [str(n) for n in range(APPENDS)]


# No module-level pytestmark: a project may import these tests into a module of its own.
@needs(PROCESSES)
@pytest.mark.slow
async def test_eight_processes_appending_to_one_session_lose_nothing(
    store: Store, store_url: str, store_backend: Backend
) -> None:
    created = await new_session(store, SESSION)
    procs = [await spawn(store_url, f"p{w}", store_backend.imports) for w in range(WRITERS)]
    try:
        errors = await run_together(procs)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert [e for e in errors if "locked" in e] == []  # "database is locked" never surfaces

    entries = await store.read_entries(TENANT, SESSION)
    check_transcript(entries)
    session = await store.get_session(TENANT, SESSION)
    assert (session.head_seq, session.last_seq, session.message_count) == (TOTAL,) * 3
    assert session.version == created.version + WRITERS * APPENDS
    check_events(await store.read_events(TENANT, LOG))
    assert (await store.get_record(TENANT, NAMESPACE, KEY)).version == WRITERS * APPENDS
    async with open_store(store_url) as later:  # as the next process would find it
        assert await later.read_entries(TENANT, SESSION) == entries
        assert await later.get_session(TENANT, SESSION) == session
        # A store that repairs damage when it opens (files://) must have found none.
        assert getattr(later, "recoveries", []) == []
