"""Run checkpoints: per-step cost and bytes at 10, 1,000 and 10,000 steps, and resume.

- step: the mean wall time from one agent step to the next (a trivial scripted agent,
  so the time is the runner's own work plus the checkpoint write) over ``MEASURED``
  steps of a run that already has N steps;
- bytes/step: JSON bytes of the entries one step writes (its message + its checkpoint);
- resume: loading a paused 10,000-step run and taking its next step, against loading the
  same session's messages (``Session.messages()``), in the same process;
- commits/step: how many transactions a runner step (its messages, checkpoint and
  events) commits with durability ``power``, where each commit is one fsync of the WAL
  (``synchronous=FULL``). Counted from the outside, by reading the database's WAL file
  with the documented format (https://sqlite.org/fileformat2.html#walformat): every
  frame carries the WAL's salts and a running checksum, and the frame that commits a
  transaction has a non-zero "database size after commit" field. The agent reads the WAL
  at every step, so each interval between two steps holds exactly one step's commits; an
  interval in which the WAL restarted (new salts, after a checkpoint) is dropped. The
  store itself keeps SQLite's automatic checkpoint off (it checkpoints in the
  background, which never adds frames). The figure is the mean over ``COUNTED`` steps,
  so the run index written every 64 checkpoints counts for its share.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import struct
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from bench.common import Verdicts, message_dict, spread
from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.runs import Respond, Runner, StepInput, Tool, ToolContext
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store

HISTORIES = (10, 1_000, 10_000)
MEASURED = 200
COUNTED = 200  # steps whose commits are counted
COMMITS_TARGET = 1.0  # commits (= WAL fsyncs with durability power) per runner step
TEXT = "Checked the next record; it matches the ledger and needs no change. " * 4


STAMPS: list[float] = []


def _work(run: StepInput) -> Respond:
    STAMPS.append(time.perf_counter())
    return Respond([Message.assistant(TEXT)])


def _runner(store: Store) -> Runner:
    return Runner(store, "bench", [ScriptedAgent("worker", [_work])])


async def measure(history: int, folder: Path) -> dict[str, float]:
    """One row: steps of a run at ``history`` steps, and (for the largest) resume."""
    store = await open_store(f"sqlite:///{folder / f'runs-{history}.db'}")
    try:
        runner = _runner(store)
        limits = Limits(iterations=IterationFlag(maximum=history, increase_amount=MEASURED))
        # raise_limits adds increase_amount: MEASURED steps first, then 1 per resume below
        paused = await runner.start("worker", "go", headless=False, limits=limits)
        run_id, session_id = paused.run_id, paused.state.session_id
        before = (await store.get_session("bench", session_id)).last_seq

        await runner.raise_limits(run_id)
        STAMPS.clear()
        await runner.resume(run_id)  # runs MEASURED steps, then pauses
        # Step to step: one checkpointed step each, without the resume's one-off load.
        step = (STAMPS[-1] - STAMPS[0]) / (len(STAMPS) - 1)

        written = await store.read_entries("bench", session_id, after_seq=before)
        step_bytes = sum(len(json.dumps(e.payload).encode()) for e in written) / MEASURED

        state = await runner.load(run_id)
        state.limits.iterations.increase_amount = 1
        await runner.runs.save(state, index_version=None)

        sessions = SessionManager(store, "bench", max_messages=None)
        session = await sessions.get(session_id)
        load = min([await _timed(session.messages()) for _ in range(3)])

        resumes = []
        for _ in range(3):  # each resume takes one more step, then pauses again
            await runner.raise_limits(run_id)
            resumes.append(await _timed(runner.resume(run_id)))
        resume = min(resumes)
    finally:
        await store.close()
    return {
        "step_us": step * 1e6,
        "bytes": step_bytes,
        "load_ms": load * 1e3,
        "resume_ms": resume * 1e3,
    }


async def growth(folder: Path, batches: int = 12, batch: int = 25) -> list[float]:
    """Step time at 10,000 steps over step time at 10, one ratio per pair of batches.

    Two runs (one paused at 10 steps, one at 10,000) take ``batch`` steps in turns, the
    order alternating, so disk and machine drift hit both alike.
    """
    runs = []
    for history in (HISTORIES[0], HISTORIES[-1]):
        store = await open_store(f"sqlite:///{folder / f'growth-{history}.db'}")
        runner = _runner(store)
        limits = Limits(iterations=IterationFlag(maximum=history, increase_amount=batch))
        paused = await runner.start("worker", "go", headless=False, limits=limits)
        runs.append((store, runner, paused.run_id))
    ratios = []
    try:
        for number in range(batches + 1):
            times = {}
            for index in (0, 1) if number % 2 else (1, 0):
                _, runner, run_id = runs[index]
                await runner.raise_limits(run_id)
                STAMPS.clear()
                await runner.resume(run_id)  # `batch` steps, then pauses
                times[index] = (STAMPS[-1] - STAMPS[0]) / (len(STAMPS) - 1)
            if number:  # the first pair warms both up
                ratios.append(times[1] / times[0])
    finally:
        for store, _, _ in runs:
            await store.close()
    return ratios


async def _timed(awaitable: object) -> float:
    start = time.perf_counter()
    await awaitable  # type: ignore[misc]
    return time.perf_counter() - start


class WalCommits:
    """Counts the transactions committed to a SQLite database, by reading its WAL file.

    Reads the file the way SQLite recovers it (https://sqlite.org/fileformat2.html):
    a 32-byte header (magic, version, page size, checkpoint number, two salts, checksum),
    then frames of a 24-byte header (page number, database size in pages after commit, or
    0 if the frame does not commit, the header's salts, the running checksum) and a page.
    A frame is valid only if its salts match the header's and its checksum continues the
    chain; frames past the first invalid one are leftovers of an earlier WAL. Parsing is
    incremental: each `read` continues after the last valid frame of the last one.
    """

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + "-wal")
        self.header = b""
        self.salts = (0, 0)
        self.commits = 0
        self._page_size = 0
        self._big_endian = False
        self._sums = (0, 0)
        self._offset = 32

    def read(self) -> tuple[tuple[int, int], int]:
        """The WAL's salts (new ones each time it restarts) and its commits so far."""
        try:
            wal = self.path.open("rb")
        except FileNotFoundError:
            return (0, 0), 0
        with wal:
            header = wal.read(32)
            if len(header) < 32:  # empty (truncated by a checkpoint) or not written yet
                self.header, self.salts, self.commits = b"", (0, 0), 0
                return self.salts, self.commits
            if header != self.header:
                self._start(header)
            wal.seek(self._offset)
            frame_size = 24 + self._page_size
            while len(frame := wal.read(frame_size)) == frame_size:
                _, size, salt1, salt2, sum1, sum2 = struct.unpack(">6I", frame[:24])
                if (salt1, salt2) != self.salts:
                    break
                sums = _checksum(frame[:8] + frame[24:], self._sums, self._big_endian)
                if sums != (sum1, sum2):
                    break  # not written completely yet (or a leftover): stop here
                self._sums, self._offset = sums, self._offset + frame_size
                self.commits += size != 0
        return self.salts, self.commits

    def _start(self, header: bytes) -> None:
        magic, version, page_size, _, salt1, salt2, sum1, sum2 = struct.unpack(">8I", header)
        if magic not in (0x377F0682, 0x377F0683) or version != 3007000:
            raise ValueError(f"{self.path} is not a SQLite WAL file")
        self._big_endian = magic == 0x377F0683
        if _checksum(header[:24], (0, 0), self._big_endian) != (sum1, sum2):
            raise ValueError(f"{self.path}: bad WAL header checksum")
        self.header, self.salts, self.commits = header, (salt1, salt2), 0
        self._page_size = page_size if page_size != 1 else 65536
        self._sums, self._offset = (sum1, sum2), 32


def _checksum(data: bytes, sums: tuple[int, int], big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (32-bit words, taken in pairs), continuing ``sums``."""
    words = array("I", data)
    assert words.itemsize == 4, "array('I') must hold 32-bit words"
    if big_endian != (struct.pack("=I", 1) == struct.pack(">I", 1)):
        words.byteswap()
    s0, s1 = sums
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


async def tool_output(arguments: dict[str, Any], ctx: ToolContext) -> str:
    """The tool of the tool-calling steps: a ~2 KB output (the mix's tool output)."""
    return message_dict(2)["content"]


def calling(n: int) -> Message:
    """The assistant message of a tool-calling step: the text and one call."""
    call = ToolCallBlock(id=f"call-{n}", name="look_up", arguments=json.dumps({"record": n}))
    return Message.assistant(TEXT, tool_calls=[call])


async def commits(folder: Path, *, tool: bool = False) -> dict[str, Any]:
    """Commits of each of ``COUNTED`` runner steps with durability ``power`` (``tool``:
    each step calls a tool)."""
    path = folder / f"commits{'-tool' if tool else ''}.db"
    wal = WalCommits(path)
    readings: list[tuple[tuple[int, int], int]] = []

    def work(run: StepInput) -> Respond:
        readings.append(wal.read())
        return Respond([calling(run.state.turn) if tool else Message.assistant(TEXT)])

    async with open_store(f"sqlite:///{path}", durability="power") as store:
        tools = [Tool("look_up", tool_output)]
        runner = Runner(store, "bench", [ScriptedAgent("worker", [work])], tools)
        limits = Limits(iterations=IterationFlag(maximum=COUNTED + 1))
        await runner.start("worker", "go", headless=False, limits=limits)  # pauses
    per_step, dropped = [], 0
    for (salts, before), (salts_after, after) in itertools.pairwise(readings):
        if salts != salts_after:
            dropped += 1  # the WAL restarted in between: this interval cannot be counted
        else:
            per_step.append(after - before)
    return {"per_step": per_step, "dropped": dropped}


async def run() -> dict[str, Any]:
    """Every measurement, in one process."""
    with tempfile.TemporaryDirectory(prefix="statekeeper-bench-runs-") as folder:
        return {
            "rows": [(h, await measure(h, Path(folder))) for h in HISTORIES],
            "growth": await growth(Path(folder)),
            "commits": await commits(Path(folder)),
            "tool_commits": await commits(Path(folder), tool=True),
        }


def report(results: dict[str, Any]) -> list[str]:
    """Print the table and verdicts; return the missed targets."""
    rows: list[tuple[int, dict[str, float]]] = results["rows"]
    print(f"{'steps':>7} {'step us':>9} {'bytes/step':>10} {'load ms':>8} {'resume ms':>9}")
    for history, r in rows:
        print(
            f"{history:>7} {r['step_us']:>9.1f} {r['bytes']:>10.0f} "
            f"{r['load_ms']:>8.2f} {r['resume_ms']:>9.2f}"
        )
    small, large = rows[0][1], rows[-1][1]
    print()
    for key, what in (("commits", "step"), ("tool_commits", "step calling a tool")):
        counted = results[key]
        steps = counted["per_step"]
        print(
            f"commits per runner {what} (durability power), {len(steps)} steps"
            f" ({counted['dropped']} dropped: WAL restarted): mean {statistics.mean(steps):.3f},"
            f" min {min(steps)}, max {max(steps)}"
        )
    print()
    growth: list[float] = results["growth"]
    print(f"step at 10k / step at 10, interleaved batches: {spread(growth)}")
    verdicts = Verdicts()
    verdicts.at_most("step at 10k / step at 10", statistics.median(growth), 1.5)
    verdicts.at_most("bytes/step at 10k / at 10", large["bytes"] / small["bytes"], 1.1)
    verdicts.at_most("resume 10k / load its messages", large["resume_ms"] / large["load_ms"], 3.0)
    for key, name in (("commits", "per step"), ("tool_commits", "per tool step")):
        mean = statistics.mean(results[key]["per_step"])
        verdicts.at_most(f"commits (WAL fsyncs) {name}, power", mean, COMMITS_TARGET)
    return verdicts.missed


if __name__ == "__main__":
    report(asyncio.run(run()))
