"""A small agent app used by the cross-process tests (imported in subprocesses)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.runs import Finish, Respond, Runner, StepInput, Tool, ToolContext
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import WrappingStore

STEPS = 6


async def work(args: dict[str, Any], ctx: ToolContext) -> str:
    n = int(args["n"])
    if args.get("hang_at") == n:
        print(f"hanging in step {n}", flush=True)
        await asyncio.Event().wait()  # the test kills the process here
    return f"worked {n}"


async def wire(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"sent {args['amount']}"


def step(n: int, hang_at: int | None) -> Any:
    def act(run: StepInput) -> Respond | Finish:
        if n > STEPS:
            return Finish({"steps": STEPS})
        call = ToolCallBlock(
            id=f"call-{n}", name="work", arguments=json.dumps({"n": n, "hang_at": hang_at})
        )
        return Respond([Message.assistant(f"step {n}", tool_calls=[call])])

    return act


def make_runner(store: Store, tenant: str, hang_at: int | None = None) -> Runner:
    agent = ScriptedAgent("worker", [step(n, hang_at) for n in range(1, STEPS + 2)])
    approver = ScriptedAgent(
        "payer",
        [
            Respond(
                [
                    Message.assistant(
                        "paying",
                        tool_calls=[
                            ToolCallBlock(id="pay", name="wire", arguments='{"amount": 9}')
                        ],
                    )
                ]
            ),
            Finish("paid"),
        ],
    )
    tools = [Tool("work", work), Tool("wire", wire, requires_approval=True)]
    return Runner(store, tenant, [agent, approver], tools)


def talk(run: StepInput) -> Respond:
    """A step that only says something: its message, checkpoint and ``assistant/complete``
    event are written in one append."""
    return Respond([Message.assistant(f"said {run.state.turn}")])


class DyingStore(WrappingStore):
    """SIGKILLs its own process in the append of a run's first checkpoint: the run's
    index is written (and held by this process), nothing else of the run is."""

    def __init__(self, store: Store) -> None:
        self.wrapped = store

    async def append_entries(self, tenant: str, session_id: str, drafts: Any, **kw: Any) -> Any:
        if any(d.kind == "checkpoint" for d in drafts):
            os.kill(os.getpid(), signal.SIGKILL)
        return await self.wrapped.append_entries(tenant, session_id, drafts, **kw)


class HangingStore(WrappingStore):
    """Hangs in the append that writes the message ``said <hang_at>`` (the test kills the
    process there: in the middle of that step's write)."""

    def __init__(self, store: Store, hang_at: int) -> None:
        self.wrapped, self.text = store, f"said {hang_at}"

    async def append_entries(self, tenant: str, session_id: str, drafts: Any, **kw: Any) -> Any:
        if any(self.text in json.dumps(d.payload) for d in drafts):
            print(f"appending {self.text}", flush=True)
            await asyncio.Event().wait()
        return await self.wrapped.append_entries(tenant, session_id, drafts, **kw)


async def main(url: str, command: str, run_id: str, *rest: str) -> None:
    store = await open_store(url)
    try:
        if command == "start-talking":  # hangs in the write of step 40
            talking = HangingStore(store, 40)
            runner = Runner(talking, "t", [ScriptedAgent("talker", [talk])])  # type: ignore[arg-type]
            limits = Limits(iterations=IterationFlag(maximum=10**6))
            await runner.start("talker", "go", run_id=run_id, limits=limits)
        elif command == "start-dying":  # killed as it writes the run's first checkpoint
            dying = DyingStore(store)
            runner = Runner(dying, "t", [ScriptedAgent("dier", [Finish("never")])])  # type: ignore[arg-type]
            await runner.start("dier", "go", run_id=run_id)
        elif command == "start-hanging":
            runner = make_runner(store, "t", hang_at=4)
            await runner.start("worker", "go", run_id=run_id)
        elif command == "start-payer":
            result = await make_runner(store, "t").start("payer", "pay", run_id=run_id)
            print(result.status, flush=True)
        elif command == "fork":  # fork RUN AT NEW_RUN: only creates the new run
            at, new_run_id = int(rest[0]), rest[1]
            state = await make_runner(store, "t").runs.fork(run_id, at=at, new_run_id=new_run_id)
            print(state.status, state.session_id, flush=True)
        elif command == "resume":
            result = await make_runner(store, "t").resume(run_id)
            print(result.status, json.dumps(result.output), flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
