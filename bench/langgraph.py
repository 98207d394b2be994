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
history), so its bytes per step at 10,000 are compared with the step's payload.
"""

from __future__ import annotations

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
from statekeeper.integrations.langgraph.checkpoint import StatekeeperSaver

HISTORIES = (10, 10_000)
BATCHES, BATCH = 3, 4
BUILT = 10_000
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


async def built(folder: Path, page_size: int) -> dict[str, float]:
    """Our thread built step by step to `BUILT` messages: disk / payload, read time."""
    db = folder / f"built-{page_size}.db"
    url = f"sqlite:///{db}?durability=process&page_size={page_size}"
    async with open_store(url) as store:
        thread = Thread(StatekeeperSaver(store), 0, True)
        await thread.step(-1)
        started = time.perf_counter()
        for n in range(BUILT):
            await thread.step(n)
        build_ms = (time.perf_counter() - started) * 1000 / BUILT
        reads = []
        for _ in range(3):
            started = time.perf_counter()
            found = await StatekeeperSaver(store).aget_tuple(thread.config)
            reads.append(time.perf_counter() - started)
        assert found is not None
        assert len(found.checkpoint["channel_values"]["messages"]) == BUILT
    return {
        "disk": _size(db) / _payload(thread.messages),
        "step_ms": build_ms,
        "read_ms": statistics.median(reads) * 1000,
    }


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
    print(
        f"SqliteSaver at {HISTORIES[-1]:,}: disk growth per step / the step's payload "
        f"{big['raw_growth']:.0f}; read of the latest checkpoint {big['raw_read_ms']:.0f} ms"
    )
    verdicts = Verdicts()
    for durability in ("power", "process"):
        ratios = results["speed"][(durability, HISTORIES[-1])]["ratios"]
        speedups = [1 / x for x in ratios]
        verdicts.at_least(f"speedup per step at 10,000 ({durability})", speedups, 100)
    for size, row in results["built"].items():
        verdicts.at_most(f"disk / payload at {BUILT:,} (page_size={size})", row["disk"], 2.0)
    return verdicts.missed
