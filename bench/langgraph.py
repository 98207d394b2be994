"""The LangGraph checkpointer vs langgraph-checkpoint-sqlite's SqliteSaver, with
``MessagesState`` histories of 10 and 10,000 messages.

A step is what LangGraph's loop stores per model turn: ``put_writes`` of the node's new
message, then ``put`` of the next checkpoint, whose ``messages`` holds the whole list. Both
savers get the same messages (the realistic mix of `bench.common`: ~400 B turns and ~2 KB
tool outputs), through their public APIs, sides interleaved. SqliteSaver (SQLite,
``synchronous=FULL``: it fsyncs every commit, as our default ``power`` durability does)
writes the whole list every step; StatekeeperSaver writes the new message once, and a
delta naming it.

Disk: our thread is built step by step to 10,000 messages and its file compared with the
payload (LangGraph's own serialized bytes of the messages, what any saver stores at the
least). SqliteSaver cannot be built that way (the file grows with the square of the
history), so its bytes per step at 10,000 are compared with the step's payload. Ours
also reports the JSON it stores per step over the last ``TAIL * FANOUT`` steps: one whole
cycle of segments (every ``TAIL`` steps) and merges (every ``TAIL * FANOUT``).

Cold reads: ``get_state`` of a thread grown step by step to 1,000 and 10,000 messages,
by a graph on a new saver over a new store handle, as another process would (`cold`).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph

from bench.common import Ratios, Verdicts, interleave, message_dict
from statekeeper import open_store
from statekeeper.errors import NotFoundError
from statekeeper.integrations.langgraph import _spine
from statekeeper.integrations.langgraph._layout import session_id
from statekeeper.integrations.langgraph.checkpoint import StatekeeperSaver
from statekeeper.jsoncodec import encode_json

HISTORIES = (10, 10_000)
BATCHES, BATCH = 3, 4
BUILT = 10_000
CYCLE = _spine.TAIL * _spine.FANOUT  # steps between two merges into a level 2 segment
COLD = (1_000, 10_000)
COLD_BATCHES, COLD_BATCH = 16, 3  # an even count: as many batches start with either side
SERDE = JsonPlusSerializer()


def message(n: int) -> BaseMessage:
    return AIMessage(content=message_dict(n)["content"], id=f"m-{n}")


class Thread:
    """One saver's thread: its message list and the config of its latest checkpoint."""

    def __init__(self, saver: Any, history: int, is_async: bool) -> None:
        self.saver, self.is_async = saver, is_async
        self.messages = [message(n) for n in range(history)]
        self.config: Any = {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}
        self.version: Any = None

    async def step(self, n: int) -> None:
        """Store one model turn (the first call stores the history as it is)."""
        if self.version is not None:
            new = message(1_000_000 + n)
            await self._call("put_writes", self.config, [("messages", [new])], str(uuid.uuid4()))
            self.messages = [*self.messages, new]
        self.version = self.saver.get_next_version(self.version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": self.messages}
        checkpoint["channel_versions"] = {"messages": self.version}
        metadata: Any = {"source": "loop", "step": n, "parents": {}}
        self.config = await self._call(
            "put", self.config, checkpoint, metadata, {"messages": self.version}
        )

    async def _call(self, name: str, *args: Any) -> Any:
        if self.is_async:
            return await getattr(self.saver, "a" + name)(*args)
        return getattr(self.saver, name)(*args)


def _size(db: Path) -> int:
    """The database with its journal files."""
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def _payload(messages: list[BaseMessage]) -> int:
    return sum(len(SERDE.dumps_typed([m])[1]) for m in messages)


async def speed(history: int, folder: Path, durability: str) -> dict[str, Any]:
    """Per-step time, interleaved, and SqliteSaver's bytes per step against the payload."""
    ours_db = folder / f"sk-{history}-{durability}.db"
    raw_db = folder / f"lg-{history}-{durability}.db"
    async with open_store(f"sqlite:///{ours_db}?durability={durability}") as store:
        with SqliteSaver.from_conn_string(str(raw_db)) as raw_saver:
            ours = Thread(StatekeeperSaver(store), history, True)
            raw = Thread(raw_saver, history, False)
            await ours.step(-1)
            await raw.step(-1)
            before = _size(raw_db)
            ratios = await interleave(ours.step, raw.step, BATCHES, BATCH)
            added = _payload(raw.messages[history:])
            raw_growth = (_size(raw_db) - before) / added
            started = time.perf_counter()
            raw_saver.get_tuple(raw.config)
            raw_read = time.perf_counter() - started
    return {"ratios": ratios, "raw_growth": raw_growth, "raw_read_ms": raw_read * 1000}


def _chat(checkpointer: Any) -> Any:
    """A MessagesState graph whose scripted model answers every message."""

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [message(2_000_000 + len(state["messages"]))]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_edge(START, "model")
    return builder.compile(checkpointer=checkpointer)


async def turns(history: int, folder: Path) -> Ratios:
    """A whole turn through LangGraph (``ainvoke`` / ``invoke`` of one user message): the
    read of the thread, then three checkpoints (input, start, model) and their writes."""
    async with open_store(f"sqlite:///{folder / f'turn-sk-{history}.db'}") as store:
        with SqliteSaver.from_conn_string(str(folder / f"turn-lg-{history}.db")) as raw_saver:
            ours, raw = _chat(StatekeeperSaver(store)), _chat(raw_saver)
            config: Any = {"configurable": {"thread_id": "bench"}}
            seed = {"messages": [message(n) for n in range(history)]}
            await ours.aupdate_state(config, seed)
            raw.update_state(config, seed)

            async def ours_turn(n: int) -> None:
                await ours.ainvoke({"messages": [HumanMessage(f"q{n}", id=f"q{n}")]}, config)

            async def raw_turn(n: int) -> None:
                raw.invoke({"messages": [HumanMessage(f"q{n}", id=f"q{n}")]}, config)

            return await interleave(ours_turn, raw_turn, BATCHES, 2)


async def built(folder: Path, page_size: int, steps: int = BUILT) -> dict[str, Any]:
    """Our thread built step by step to ``steps`` messages: disk / payload, the bytes a
    step adds averaged over the last `CYCLE` steps (a whole cycle of segments and
    merges), read time (a new saver on the same handle, as the previous bench did)."""
    db = folder / f"built-{page_size}-{steps}.db"
    url = f"sqlite:///{db}?durability=process&page_size={page_size}"
    async with open_store(url) as store:
        thread = Thread(StatekeeperSaver(store), 0, True)
        await thread.step(-1)
        window, cycle_start = min(CYCLE, steps), 0
        started = time.perf_counter()
        for n in range(steps):
            if n == steps - window:
                cycle_start = await _stored(store, thread)
            await thread.step(n)
        build_ms = (time.perf_counter() - started) * 1000 / steps
        stored = await _stored(store, thread) - cycle_start
        reads = []
        for _ in range(3):
            started = time.perf_counter()
            found = await StatekeeperSaver(store).aget_tuple(thread.config)
            reads.append(time.perf_counter() - started)
        assert found is not None
        assert len(found.checkpoint["channel_values"]["messages"]) == steps
    step_payload = _payload(thread.messages[-window:]) / window
    return {
        "db": db,
        "config": thread.config,
        "messages": thread.messages,
        "disk": _size(db) / _payload(thread.messages),
        "step_ms": build_ms,
        "read_ms": statistics.median(reads) * 1000,
        "cycle_stored": stored / window,
        "step_payload": step_payload,
    }


async def _stored(store: Any, thread: Thread) -> int:
    """The JSON bytes of every entry of the thread so far."""
    sid = session_id(thread.config["configurable"]["thread_id"], "")
    return sum(len(encode_json(e.payload)) for e in await store.read_entries("default", sid))


async def cold(steps: int, folder: Path, ours_built: dict[str, Any]) -> tuple[Ratios, list[float]]:
    """``get_state`` of a thread grown step by step to ``steps`` messages, through a graph
    on a new saver over a new store handle (what another process does), sides
    interleaved; handles are opened (and graphs compiled) before the timing, and have
    made one call each.

    SqliteSaver reads the latest checkpoint's row (the whole list) and its writes, however
    the thread grew; growing its thread step by step would store ``steps ** 2 / 2``
    messages (50 million at 10,000), so its thread gets the list as it stands at
    ``steps``, then 3 steps (``synchronous=FULL`` set, though a read does not sync)."""
    raw_db = folder / f"cold-lg-{steps}.db"
    with SqliteSaver.from_conn_string(str(raw_db)) as raw_saver:
        raw = Thread(raw_saver, 0, False)
        raw.messages = list(ours_built["messages"][:-3])
        await raw.step(-1)
        for n in range(3):
            await raw.step(n)
    count = (COLD_BATCHES + 1) * COLD_BATCH
    async with contextlib.AsyncExitStack() as stack:
        # Each read's saver is dropped after it (what it remembers goes with it), as the
        # process it stands for would end: many savers kept alive would leave their lists
        # for the collector to scan, on whichever side it happens to run.
        ours_graphs: dict[int, Any] = {}
        raw_graphs: dict[int, Any] = {}
        for n in range(count):
            # Each handle has made one call, as in a process that is up: our store starts
            # its worker thread there, SqliteSaver creates its tables if missing.
            store = await stack.enter_async_context(open_store(f"sqlite:///{ours_built['db']}"))
            with contextlib.suppress(NotFoundError):
                await store.get_session("default", "warm-up")
            ours_graphs[n] = _chat(StatekeeperSaver(store))
            saver = stack.enter_context(SqliteSaver.from_conn_string(str(raw_db)))
            saver.conn.execute("PRAGMA synchronous=FULL")
            saver.setup()
            raw_graphs[n] = _chat(saver)
        ours_config = {"configurable": dict(ours_built["config"]["configurable"])}
        raw_config = {"configurable": dict(raw.config["configurable"])}
        for c in (ours_config, raw_config):  # the latest, as get_state of a thread reads
            c["configurable"].pop("checkpoint_id", None)

        cpu: dict[str, dict[int, float]] = {"ours": {}, "raw": {}}

        async def ours_read(n: int) -> None:
            started = time.process_time()
            state = await ours_graphs.pop(n).aget_state(ours_config)
            cpu["ours"][n] = time.process_time() - started
            assert len(state.values["messages"]) == steps

        async def raw_read(n: int) -> None:
            started = time.process_time()
            state = raw_graphs.pop(n).get_state(raw_config)
            cpu["raw"][n] = time.process_time() - started
            assert len(state.values["messages"]) == steps

        # What the bench holds (the lists built, the handles) is frozen: a full collection
        # would scan it on whichever side happens to allocate then, 100+ ms either way.
        gc.collect()
        gc.freeze()
        try:
            ratios = await interleave(ours_read, raw_read, COLD_BATCHES, COLD_BATCH)
        finally:
            gc.unfreeze()
    # The same batches in CPU time of the process (both sides' threads): steadier than
    # wall time while other jobs load the machine.
    batches = [range(b * COLD_BATCH, (b + 1) * COLD_BATCH) for b in range(1, COLD_BATCHES + 1)]
    return ratios, [
        sum(cpu["ours"][n] for n in b) / max(sum(cpu["raw"][n] for n in b), 1e-9) for b in batches
    ]


async def run() -> dict[str, Any]:
    """Every measurement, in one process."""
    with tempfile.TemporaryDirectory(prefix="statekeeper-bench-lg-") as name:
        folder = Path(name)
        results: dict[str, Any] = {
            "speed": {
                (d, h): await speed(h, folder, d) for d in ("power", "process") for h in HISTORIES
            }
        }
        results["turns"] = {h: await turns(h, folder) for h in HISTORIES}
        results["built"] = {size: await built(folder, size) for size in (4096, 16384)}
        threads = {BUILT: results["built"][4096]}
        for steps in COLD:
            if steps not in threads:
                threads[steps] = await built(folder, 4096, steps)
        results["cold"] = {steps: await cold(steps, folder, threads[steps]) for steps in COLD}
    return results


def report(results: dict[str, Any]) -> list[str]:
    """Print the tables and the verdicts; return the missed targets."""
    print(f"{'ours':>8} {'messages':>8} {'ours ms':>8} {'sqlite ms':>9} {'speedup':>16}")
    for (durability, history), row in results["speed"].items():
        r = row["ratios"]
        speedups = sorted(1 / x for x in r)
        print(
            f"{durability:>8} {history:>8} {r.ours_us / 1000:>8.2f} {r.raw_us / 1000:>9.2f} "
            f"{statistics.median(speedups):>6.1f} [{speedups[0]:.1f}-{speedups[-1]:.1f}]"
        )
    for history, ratios in results["turns"].items():
        speedups = sorted(1 / x for x in ratios)
        print(
            f"a turn through LangGraph at {history:,}: ours {ratios.ours_us / 1000:.1f} ms, "
            f"SqliteSaver {ratios.raw_us / 1000:.1f} ms, speedup "
            f"{statistics.median(speedups):.1f} [{speedups[0]:.1f}-{speedups[-1]:.1f}]"
        )
    print(f"\nour thread built step by step to {BUILT:,} messages (durability=process):")
    for size, row in results["built"].items():
        print(
            f"  page_size={size:<6} disk/payload {row['disk']:.2f}  mean step "
            f"{row['step_ms']:.2f} ms  read of the latest checkpoint {row['read_ms']:.0f} ms"
        )
    big = results["speed"][("power", HISTORIES[-1])]
    row = results["built"][4096]
    print(
        f"stored per step over the last {CYCLE:,} steps (a whole cycle of segments and "
        f"merges): {row['cycle_stored']:,.0f} B of JSON, "
        f"{row['cycle_stored'] / row['step_payload']:.1f}x the message's payload"
    )
    print(
        f"SqliteSaver at {HISTORIES[-1]:,}: disk growth per step / the step's payload "
        f"{big['raw_growth']:.0f} ({big['raw_growth'] / row['disk']:,.0f}x ours, whose "
        f"disk / payload is {row['disk']:.2f}); read of the latest checkpoint "
        f"{big['raw_read_ms']:.0f} ms"
    )
    for steps, (ratios, _) in results["cold"].items():
        print(
            f"cold get_state of a thread grown step by step to {steps:,}: ours "
            f"{ratios.ours_us / 1000:.0f} ms, SqliteSaver {ratios.raw_us / 1000:.0f} ms"
        )
    verdicts = Verdicts()
    for durability in ("power", "process"):
        ratios = results["speed"][(durability, HISTORIES[-1])]["ratios"]
        speedups = [1 / x for x in ratios]
        verdicts.at_least(f"speedup per step at 10,000 ({durability})", speedups, 100)
    for size, row in results["built"].items():
        verdicts.at_most(f"disk / payload at {BUILT:,} (page_size={size})", row["disk"], 2.0)
    for steps, (ratios, cpu) in results["cold"].items():
        verdicts.at_most(f"cold get_state at {steps:,} steps, ours/SqliteSaver", ratios, 1.0)
        verdicts.info("  the same in CPU time of the process", cpu)
    return verdicts.missed
