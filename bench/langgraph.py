"""The LangGraph checkpointer vs langgraph-checkpoint-sqlite's SqliteSaver, at 10 and
10,000 messages of ``MessagesState`` history.

One step is what LangGraph's loop does per model turn: ``put_writes`` of the node's new
message, then ``put`` of the checkpoint holding the whole message list (one more
message). Both sides get the same messages (the realistic mix of `bench.common`), through
each saver's public API, sides interleaved. SqliteSaver writes the whole list every step;
StatekeeperSaver writes the new message as a delta. Disk: file growth over the measured
steps against the payload they added (LangGraph's serialized bytes of the new messages).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

from bench.common import Verdicts, interleave, message_dict
from statekeeper import open_store
from statekeeper.integrations.langgraph.checkpoint import StatekeeperSaver

HISTORIES = (10, 10_000)
BATCHES, BATCH = 3, 4


def message(n: int) -> BaseMessage:
    return AIMessage(content=message_dict(n)["content"], id=f"m-{n}")


class Side:
    """One saver's thread: the message list and the config of its latest checkpoint."""

    def __init__(self, saver: Any, history: int, is_async: bool) -> None:
        self.saver, self.is_async = saver, is_async
        self.messages = [message(n) for n in range(history)]
        self.config: Any = {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}
        self.version = 0
        self.last: Any = None

    async def step(self, n: int) -> None:
        new = message(1_000_000 + n)
        if self.version:
            await self._call("put_writes", self.config, [("messages", [new])], str(uuid.uuid4()))
            self.messages = [*self.messages, new]
        self.version += 1
        checkpoint = empty_checkpoint()
        version = self.saver.get_next_version(self.last, None)
        self.last = version
        checkpoint["channel_values"] = {"messages": self.messages}
        checkpoint["channel_versions"] = {"messages": version}
        metadata: Any = {"source": "loop", "step": self.version, "parents": {}}
        self.config = await self._call(
            "put", self.config, checkpoint, metadata, {"messages": version}
        )

    async def _call(self, name: str, *args: Any) -> Any:
        if self.is_async:
            return await getattr(self.saver, "a" + name)(*args)
        return getattr(self.saver, name)(*args)


async def measure(history: int, folder: Path, durability: str) -> dict[str, Any]:
    ours_db = folder / f"sk-{history}-{durability}.db"
    raw_db = folder / f"lg-{history}-{durability}.db"
    serde = JsonPlusSerializer()
    async with open_store(f"sqlite:///{ours_db}?durability={durability}") as store:
        with SqliteSaver.from_conn_string(str(raw_db)) as raw_saver:
            ours = Side(StatekeeperSaver(store), history, True)
            raw = Side(raw_saver, history, False)
            await ours.step(-1)  # the history, stored once
            await raw.step(-1)
            sizes = {"ours": _size(ours_db), "raw": _size(raw_db)}
            ratios = await interleave(ours.step, raw.step, BATCHES, BATCH)
            steps = (BATCHES + 1) * BATCH
            added = sum(len(serde.dumps_typed([m])[1]) for m in ours.messages[-steps:])
            grown = {
                "ours": (_size(ours_db) - sizes["ours"]) / added,
                "raw": (_size(raw_db) - sizes["raw"]) / added,
            }
    return {"ratios": ratios, "grown": grown}


def _size(db: Path) -> int:
    return sum(os.path.getsize(p) for p in db.parent.glob(db.name + "*"))


async def run() -> dict[tuple[str, int], dict[str, Any]]:
    """Ours fsyncs every commit by default (``power``); ``process`` is SqliteSaver's level."""
    with tempfile.TemporaryDirectory(prefix="statekeeper-bench-lg-") as folder:
        return {
            (d, h): await measure(h, Path(folder), d)
            for d in ("power", "process")
            for h in HISTORIES
        }


def report(results: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    print(
        f"{'ours durability':>15} {'messages':>8} {'ours ms':>8} {'sqlite ms':>9} {'speedup':>8} {'ours disk/payload':>18} {'sqlite disk/payload':>20}"
    )
    for (durability, history), row in results.items():
        r = row["ratios"]
        print(
            f"{durability:>15} {history:>8} {r.ours_us / 1000:>8.2f} {r.raw_us / 1000:>9.2f} "
            f"{r.raw_us / r.ours_us:>8.1f} {row['grown']['ours']:>18.2f} {row['grown']['raw']:>20.2f}"
        )
    verdicts = Verdicts()
    for durability in ("power", "process"):
        big = results[(durability, HISTORIES[-1])]
        speedups = [1 / x for x in big["ratios"]]
        verdicts.at_least(f"speedup per step at 10,000 ({durability})", speedups, 100)
        verdicts.at_most(
            f"disk growth / payload at 10,000 ({durability})", big["grown"]["ours"], 2.0
        )
    return verdicts.missed
