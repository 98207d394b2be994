"""`StatekeeperSession` side by side with the SDK's own ``SQLiteSession``: the same
operations on both, the same observable results (ordering, limits, settings limit, pop
on empty, clear, isolation by session id, reopening by id in another process)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from agents import SQLiteSession

from statekeeper.integrations.openai_agents import StatekeeperSession
from statekeeper.stores import Store
from statekeeper.testing.registry import BACKENDS, new_context

HERE = Path(__file__).parent
IDS = ("alpha", "beta")
LIMITS = (None, 0, -1, 1, 2, 5, 1000)


class Pair:
    """One SQLiteSession and one StatekeeperSession per session id, driven together."""

    def __init__(self, store: Store, db: Path, settings: dict[str, Any] | None = None) -> None:
        self.ours = {sid: StatekeeperSession(sid, store, session_settings=settings) for sid in IDS}
        self.theirs = {sid: SQLiteSession(sid, db, session_settings=settings) for sid in IDS}
        self.log: list[str] = []

    async def both(self, sid: str, op: str, *args: Any) -> Any:
        """Run ``op`` on both sessions of ``sid``; assert the results are equal."""
        self.log.append(f"{sid}.{op}{args}")
        theirs = await getattr(self.theirs[sid], op)(*args)
        ours = await getattr(self.ours[sid], op)(*args)
        assert json.dumps(ours) == json.dumps(theirs), "\n".join(self.log[-12:])
        return ours

    async def same_everywhere(self) -> None:
        for sid in IDS:
            for limit in LIMITS:
                await self.both(sid, "get_items", limit)

    def close(self) -> None:
        for session in self.theirs.values():
            session.close()


@pytest.fixture
async def pair(store: Store, tmp_path: Path) -> AsyncIterator[Pair]:
    made = Pair(store, tmp_path / "sdk.db")
    yield made
    made.close()


def item(n: int) -> dict[str, Any]:
    kinds: list[Callable[[int], dict[str, Any]]] = [
        lambda n: {"role": "user", "content": f"turn {n}"},
        lambda n: {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"},
        lambda n: {"type": "function_call_output", "call_id": f"c{n}", "output": str(n)},
        lambda n: {"id": f"rs_{n}", "type": "reasoning", "summary": []},
    ]
    return kinds[n % len(kinds)](n)


async def test_a_scripted_sequence_matches(pair: Pair) -> None:
    for sid in IDS:
        assert await pair.both(sid, "pop_item") is None  # pop on a session never written
        await pair.both(sid, "clear_session")
    await pair.same_everywhere()
    await pair.both("alpha", "add_items", [item(0), item(1), item(2)])
    await pair.both("beta", "add_items", [item(10)])
    await pair.both("alpha", "add_items", [])
    await pair.same_everywhere()
    await pair.both("alpha", "pop_item")
    await pair.both("alpha", "add_items", [item(3), item(4)])
    await pair.same_everywhere()
    await pair.both("beta", "clear_session")
    await pair.same_everywhere()
    for _ in range(5):
        await pair.both("alpha", "pop_item")  # past empty: None, as SQLiteSession
    await pair.same_everywhere()
    await pair.both("beta", "add_items", [item(11)])
    await pair.same_everywhere()


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_sequences_match(pair: Pair, seed: int) -> None:
    rng = random.Random(seed)
    n = 0
    for _ in range(150):
        sid = rng.choice(IDS)
        roll = rng.random()
        if roll < 0.45:
            size = rng.choice([0, 1, 1, 2, 5])
            await pair.both(sid, "add_items", [item(n + k) for k in range(size)])
            n += size
        elif roll < 0.7:
            await pair.both(sid, "get_items", rng.choice(LIMITS))
        elif roll < 0.95:
            await pair.both(sid, "pop_item")
        else:
            await pair.both(sid, "clear_session")
    await pair.same_everywhere()


async def test_the_settings_limit_matches(store: Store, tmp_path: Path) -> None:
    for settings in ({"limit": 3}, {"limit": 0}, {"limit": -2}, {"limit": None}):
        pair = Pair(store, tmp_path / f"sdk{settings['limit']}.db", settings)
        try:
            await pair.both("alpha", "clear_session")
            await pair.both("alpha", "add_items", [item(k) for k in range(6)])
            await pair.same_everywhere()
            await pair.both("alpha", "get_items")  # the settings' limit
            await pair.both("alpha", "get_items", 1)  # an explicit one wins
        finally:
            pair.close()


async def run_python(*argv: str) -> str:
    """Run python in another process (this statekeeper and the test helpers importable)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@asynccontextmanager
async def store_with_url(name: str, tmp_path: Path) -> AsyncIterator[tuple[Store, str]]:
    """A fresh store of a backend, and the URL another process opens it with."""
    backend = BACKENDS[name]
    assert backend.url is not None
    context = new_context(backend, tmp_path)
    async with backend.open(context) as store:
        yield store, backend.url(context)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "files", "redis", "postgres"])
async def test_another_process_reopens_by_id_and_sees_the_same(
    backend: str, tmp_path: Path
) -> None:
    db = tmp_path / "sdk.db"
    async with store_with_url(backend, tmp_path) as (store, url):
        pair = Pair(store, db)
        try:
            await pair.both("alpha", "add_items", [item(k) for k in range(7)])
            await pair.both("alpha", "pop_item")
            await pair.both("beta", "add_items", [item(20)])
        finally:
            pair.close()
        limits = ("", "3")  # no limit, and a limit
        script = (
            "import asyncio, json, sys\nfrom agents import SQLiteSession\n"
            "s = SQLiteSession('alpha', sys.argv[1])\n"
            "for a in sys.argv[2:]:\n"
            "    print(json.dumps(asyncio.run(s.get_items(int(a) if a else None))))\n"
            "s.close()\n"
        )
        ours, theirs = await asyncio.gather(
            run_python(str(HERE / "oai_app.py"), url, "items", "alpha", "default", *limits),
            run_python("-c", script, str(db), *limits),
        )
        read = [[json.loads(line) for line in out.splitlines()] for out in (ours, theirs)]
        assert read[0] == read[1]
        assert [len(items) for items in read[0]] == [6, 3]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "files", "redis", "postgres"])
async def test_two_processes_adding_at_once_lose_nothing(backend: str, tmp_path: Path) -> None:
    async with store_with_url(backend, tmp_path) as (store, url):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                str(HERE / "oai_app.py"),
                url,
                "add",
                "shared",
                "default",
                w,
                "30",
                env=env,
                stderr=asyncio.subprocess.PIPE,
            )
            for w in ("p1", "p2")
        ]
        for proc in procs:
            _, err = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, err.decode()
        items = await StatekeeperSession("shared", store).get_items()
        assert len(items) == 2 * 30 * 3
        for start in range(0, len(items), 3):  # batches whole
            batch = items[start : start + 3]
            assert [(x["by"], x["n"], x["i"]) for x in batch] == [  # type: ignore[typeddict-item]
                (batch[0]["by"], batch[0]["n"], i)
                for i in range(3)  # type: ignore[typeddict-item]
            ]
        for writer in ("p1", "p2"):
            mine = [x["n"] for x in items[::3] if x["by"] == writer]  # type: ignore[typeddict-item]
            assert mine == list(range(30))
