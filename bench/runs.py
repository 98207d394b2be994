"""Run checkpoints: per-step cost and bytes at 10, 1,000 and 10,000 steps, and resume.

- step: the mean wall time from one agent step to the next (a trivial scripted agent,
  so the time is the runner's own work plus the checkpoint write) over ``MEASURED``
  steps of a run that already has N steps;
- bytes/step: JSON bytes of the entries one step writes (its message + its checkpoint);
- resume: loading a paused 10,000-step run and taking its next step, against loading the
  same session's messages (``Session.messages()``), in the same process.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.core.messages import Message
from statekeeper.runs import Respond, Runner, StepInput
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store

HISTORIES = (10, 1_000, 10_000)
MEASURED = 200
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


async def _timed(awaitable: object) -> float:
    start = time.perf_counter()
    await awaitable  # type: ignore[misc]
    return time.perf_counter() - start


async def run() -> list[tuple[int, dict[str, float]]]:
    """Every measurement, in one process."""
    with tempfile.TemporaryDirectory(prefix="statekeeper-bench-runs-") as folder:
        return [(h, await measure(h, Path(folder))) for h in HISTORIES]


def report(results: list[tuple[int, dict[str, float]]]) -> list[str]:
    """Print the table and verdicts; return the missed targets."""
    print(f"{'steps':>7} {'step us':>9} {'bytes/step':>10} {'load ms':>8} {'resume ms':>9}")
    for history, r in results:
        print(
            f"{history:>7} {r['step_us']:>9.1f} {r['bytes']:>10.0f} "
            f"{r['load_ms']:>8.2f} {r['resume_ms']:>9.2f}"
        )
    small, large = results[0][1], results[-1][1]
    checks = [
        ("step at 10k / step at 10", large["step_us"] / small["step_us"], 1.5),
        ("bytes/step at 10k / at 10", large["bytes"] / small["bytes"], 1.1),
        ("resume 10k / load its messages", large["resume_ms"] / large["load_ms"], 3.0),
    ]
    print()
    failed = []
    for name, value, limit in checks:
        ok = value <= limit
        print(f"{name:<40} {value:6.2f}  (target <= {limit})  {'ok' if ok else 'MISSED'}")
        if not ok:
            failed.append(name)
    return failed


if __name__ == "__main__":
    report(asyncio.run(run()))
