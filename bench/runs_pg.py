"""A runner step that calls a tool, on PostgreSQL, against a DBOS durable step.

Our side: a `Runner` on ``open_store("postgresql://...")`` whose scripted agent answers
each step with the same assistant message (~270 B of text and one tool call); the tool
returns a ~2 KB output (the tool output of the realistic mix, `bench.common`). A step
writes the assistant message, the tool's result message, the run's checkpoint and the
step's events (write mode ``step``, the default). The peer: DBOS (``dbos`` 3.x, at its
defaults), a workflow whose ``@DBOS.step()`` does the same work and returns the same
content — the assistant text, the tool call and the tool's output — which DBOS records
durably in its ``operation_outputs`` table before the workflow goes on. Each side has a
fresh database of its own on the same server (DBOS's system database; ours: the store's
default schema), dropped at the end.

- step: the wall time from one step to the next (stamped when the agent, or DBOS's step
  function, is called, so a run's or workflow's start is not counted), the two sides
  taking turns in batches of ``BATCH`` steps (a paused run resumed for ``BATCH`` more;
  a workflow of ``BATCH`` steps), one ratio per pair of batches;
- commits per step: the write transactions of each side alone, counted in its own
  database as the new transaction ids (``xmin``) among the rows of its tables: every
  transaction that inserted a row the steps leave behind (entries, events; DBOS's step
  outputs) counts once, and with ``synchronous_commit=on`` each one waited for its WAL
  flush. (A row updated again later keeps only its last writer: the session's head and
  the run's index record count for at most one each.) Per step: what a drive of
  ``SHORT + COUNTED`` steps adds over a drive of ``SHORT`` (a resumed run, a new
  workflow), so what starting and ending a drive writes is not spread over its steps;
  bytes on disk likewise. Cross-checks, printed: ``pg_stat_wal.wal_sync``
  (WAL flushes; the whole server's, so other clients' count too: the same wait without
  any steps is printed as its floor) read after the side's connections closed (a
  backend reports its WAL statistics by then at the latest), and ``xact_commit`` of the
  side's database (every transaction, read-only ones included);
- bytes per step: growth of the side's tables on disk (``pg_total_relation_size``:
  heap, TOAST and indexes), per step as for the commits; printed beside it, the bytes
  of text each side stored (`_TEXT`: before row overhead and the server's compression).

The server comes from ``STATEKEEPER_BENCH_POSTGRES_URL`` (else
``STATEKEEPER_TEST_POSTGRES_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``);
without a server, or without ``dbos`` installed (the ``dev`` extra), the suite says so
and skips.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.common import Verdicts, spread
from bench.postgres import URL, reachable
from bench.runs import TEXT, calling, tool_output
from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.runs import Respond, Runner, StepInput, Tool
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store

BATCHES, BATCH = 12, 25  # interleaved: BATCHES pairs of BATCH steps (+ 1 warm-up pair)
COUNTED = 400  # steps per side whose commits and bytes are counted
SHORT = 20  # steps of the drive whose counts are taken off (its start and end)
TARGETS = {"step": 1.0, "bytes": 2.0, "commits": 1.0}
"""Upper limits: our step / DBOS's step; our bytes per step / DBOS's; our WAL flushes
per step."""
STAMPS: list[float] = []


def _url(database: str) -> str:
    parts = urlsplit(URL)
    return urlunsplit(parts._replace(path=f"/{database}"))


async def _admin(sql: str, *args: Any) -> list[tuple[Any, ...]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        cursor = await conn.execute(sql.encode(), args or None)
        return await cursor.fetchall() if cursor.description else []


async def _wal_syncs() -> int:
    [(count,)] = await _admin("SELECT wal_sync FROM pg_stat_wal")
    return int(count)


async def _commits(database: str) -> int:
    found = await _admin("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", database)
    return int(found[0][0])


_TEXT = {
    "statekeeper": "SELECT (SELECT coalesce(sum(octet_length(payload)), 0) FROM {s}.entries)"
    " + (SELECT coalesce(sum(octet_length(payload)), 0) FROM {s}.events)",
    "dbos": "SELECT coalesce(sum(octet_length(output)), 0) FROM {s}.operation_outputs",
}
"""The text each side stores for its steps (our entries' and events' JSON; DBOS's
serialized step outputs), before the server's row overhead and compression."""


async def _tables(database: str, schema: str) -> tuple[int, set[str], int]:
    """Bytes on disk of the schema's tables, the transaction ids (``xmin``) of the rows
    they hold (each transaction that wrote a row still there is one of them), and the
    bytes of text the side stored (`_TEXT`)."""
    import psycopg

    query = (
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'"
    )
    xids: set[str] = set()
    async with await psycopg.AsyncConnection.connect(_url(database), autocommit=True) as conn:
        tables = await (await conn.execute(query.encode(), (schema,))).fetchall()
        for table, _ in tables:
            sql = f'SELECT DISTINCT xmin::text FROM "{schema}"."{table}"'
            xids.update(xid for (xid,) in await (await conn.execute(sql.encode())).fetchall())
        text = _TEXT[schema].format(s=f'"{schema}"')
        [(stored,)] = await (await conn.execute(text.encode())).fetchall()
    return sum(int(size) for _, size in tables), xids, int(stored)


def _stamped_step(run: StepInput) -> Respond:
    STAMPS.append(time.perf_counter())
    return Respond([calling(run.state.turn)])


def _step_time() -> float:
    return (STAMPS[-1] - STAMPS[0]) / (len(STAMPS) - 1)


class Ours:
    """A paused run that takes ``count`` more steps each time it is driven."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.store: Store | None = None
        self.runner: Runner | None = None
        self.run_id = ""

    async def open(self) -> None:
        self.store = await open_store(_url(self.database))
        agent = ScriptedAgent("worker", [_stamped_step])
        self.runner = Runner(self.store, "bench", [agent], [Tool("look_up", tool_output)])

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
        self.store = self.runner = None

    async def steps(self, count: int) -> float:
        """Take ``count`` steps; the mean time from one to the next."""
        assert self.runner is not None
        STAMPS.clear()
        if not self.run_id:
            limits = Limits(iterations=IterationFlag(maximum=count, increase_amount=count))
            paused = await self.runner.start("worker", "go", headless=False, limits=limits)
            self.run_id = paused.run_id
        else:
            state = await self.runner.load(self.run_id)
            maximum = state.limits.iterations.current + count
            await self.runner.raise_limits(self.run_id, iterations=maximum)
            await self.runner.resume(self.run_id)
        assert len(STAMPS) == count, (len(STAMPS), count)
        return _step_time()


def _dbos_side(database: str) -> tuple[Callable[[int], Awaitable[float]], Callable[[], None]]:
    """DBOS launched on its own database: (take ``count`` steps in a new workflow and
    return the mean time from one to the next, destroy DBOS)."""
    from dbos import DBOS

    DBOS(config={"name": "sk-bench", "system_database_url": _url(database), "log_level": "ERROR"})

    @DBOS.step()
    async def step(n: int) -> dict[str, Any]:
        STAMPS.append(time.perf_counter())
        message = calling(n)
        call = message.tool_calls[0]
        output = await tool_output({}, None)  # type: ignore[arg-type]
        return {
            "assistant": TEXT,
            "tool_call": {"id": call.id, "name": call.name, "arguments": call.arguments},
            "output": output,
        }

    @DBOS.workflow()
    async def work(count: int) -> int:
        for n in range(count):
            await step(n)
        return count

    DBOS.launch()

    async def steps(count: int) -> float:
        STAMPS.clear()
        await work(count)
        assert len(STAMPS) == count, (len(STAMPS), count)
        return _step_time()

    return steps, DBOS.destroy


async def _counted(
    side: Callable[[int], Awaitable[float]],
    close: Callable[[], Awaitable[None]],
    database: str,
    schema: str,
) -> dict[str, float]:
    """Write transactions and bytes on disk per step: what a drive of ``SHORT +
    COUNTED`` steps adds over one of ``SHORT`` (a drive's own start and end cancel
    out); WAL flushes and transactions per step of the longer drive."""
    added, syncs, commits = [], 0, 0
    for steps in (SHORT, SHORT + COUNTED):
        size, xids, text = await _tables(database, schema)
        if steps > SHORT:
            await asyncio.sleep(1.1)  # earlier statistics reported (at most once a second)
            syncs, commits = await _wal_syncs(), await _commits(database)
        await side(steps)
        after_size, after_xids, after_text = await _tables(database, schema)
        added.append((len(after_xids - xids), after_size - size, after_text - text))
    await close()  # backends report their WAL statistics when they end, at the latest
    await asyncio.sleep(1.1)
    (short_writes, short_bytes, short_text), (long_writes, long_bytes, long_text) = added
    return {
        "text": (long_text - short_text) / COUNTED,
        "writes": (long_writes - short_writes) / COUNTED,
        "wal_syncs": (await _wal_syncs() - syncs) / (SHORT + COUNTED),
        "xacts": (await _commits(database) - commits) / (SHORT + COUNTED),
        "bytes": (long_bytes - short_bytes) / COUNTED,
    }


async def run() -> dict[str, Any] | None:
    """Every measurement, in one process; None (with the reason printed) to skip."""
    why = await reachable()
    if why is None:
        try:
            import dbos  # noqa: F401
        except ImportError:
            why = "dbos is not installed (pip install -e '.[dev]')"
    if why is not None:
        print(f"runs_pg: skipped: {why}")
        return None
    tag = uuid.uuid4().hex[:8]
    ours_db, dbos_db = f"sk_bench_runs_{tag}", f"sk_bench_dbos_{tag}"
    for database in (ours_db, dbos_db):
        await _admin(f'CREATE DATABASE "{database}"')
    destroy: Callable[[], None] | None = None
    try:
        idle_before = await _wal_syncs()
        await asyncio.sleep(2.2)  # the server's own flushes meanwhile: the noise floor
        idle = (await _wal_syncs() - idle_before) / COUNTED

        ours = Ours(ours_db)
        await ours.open()
        await ours.steps(5)  # creates the store's tables and the run
        ours_counted = await _counted(ours.steps, ours.close, ours_db, "statekeeper")

        dbos_steps, destroy = _dbos_side(dbos_db)
        await ours.open()
        ratios, times = [], {"ours": 0.0, "dbos": 0.0}
        for number in range(BATCHES + 1):
            took = {}
            for name in ("ours", "dbos") if number % 2 else ("dbos", "ours"):
                took[name] = await (ours.steps if name == "ours" else dbos_steps)(BATCH)
            if number:  # the first pair warms both up
                ratios.append(took["ours"] / took["dbos"])
                for name in times:
                    times[name] += took[name] / BATCHES
        await ours.close()

        async def end_dbos() -> None:
            nonlocal destroy
            assert destroy is not None
            destroy, done = None, destroy
            done()

        dbos_counted = await _counted(dbos_steps, end_dbos, dbos_db, "dbos")
        return {
            "ratios": ratios,
            "times": times,
            "ours": ours_counted,
            "dbos": dbos_counted,
            "idle_syncs": idle,
        }
    finally:
        if destroy is not None:
            destroy()
        for database in (ours_db, dbos_db):
            await _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def report(results: dict[str, Any] | None) -> list[str]:
    """Print the figures and the verdicts; return the missed targets."""
    if results is None:
        print("runs_pg benchmark: no results (skipped)")
        return []
    times, ours, peer = results["times"], results["ours"], results["dbos"]
    print(
        f"step calling a tool: ours {times['ours'] * 1e3:.2f} ms, DBOS {times['dbos'] * 1e3:.2f}"
        f" ms; ours/DBOS per batch of {BATCH}: {spread(results['ratios'])}"
    )
    print(f"{'per step, ' + str(COUNTED) + ' steps':<28} {'ours':>10} {'DBOS':>10}")
    for key, name in (
        ("writes", "write transactions (xmin)"),
        ("wal_syncs", "WAL flushes (wal_sync)"),
        ("xacts", "transactions (xact_commit)"),
        ("bytes", "bytes on disk"),
        ("text", "bytes of text stored"),
    ):
        print(f"{name:<28} {ours[key]:>10.2f} {peer[key]:>10.2f}")
    print(f"{'(server, no steps: wal_sync)':<28} {results['idle_syncs']:>10.2f}\n")
    verdicts = Verdicts()
    verdicts.at_most("step calling a tool / DBOS step (PG)", results["ratios"], TARGETS["step"])
    verdicts.at_most(
        "bytes per step / DBOS's (PG)", ours["bytes"] / peer["bytes"], TARGETS["bytes"]
    )
    writes = ours["writes"]
    verdicts.at_most("commits per tool step, PG (xmin)", writes, TARGETS["commits"])
    verdicts.info("commits per DBOS step, PG (xmin)", peer["writes"])
    return verdicts.missed


if __name__ == "__main__":
    report(asyncio.run(run()))
