"""One `StatekeeperSession` used from many threads, each with its own event loop, in the
shapes the OpenAI Agents SDK's own tests and users make. Run by ``test_oai_threads.py``
as a subprocess (so a call that hangs fails the test instead of hanging the suite):

    python oai_threads.py URL concurrent owned|caller   # the SDK's concurrent-access test
    python oai_threads.py URL run_sync owned|caller     # Runner.run_sync from a thread pool

``owned``: the session is made with ``StatekeeperSession.from_url``. ``caller``: the
store is opened by the caller on its own loop, which then blocks in the thread pool (as
the SDK's test blocks its test's loop), and the session is made over it.

Prints one JSON object; exits 3 (printing what finished) if a call does not finish in
time, without waiting for the threads still stuck.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from statekeeper.integrations.openai_agents import StatekeeperSession
from statekeeper.stores import open_store

SECONDS = 60.0  # for every thread's calls together


def in_threads(work: Callable[[int], Any], jobs: Iterable[int], workers: int) -> list[Any]:
    """``work(n)`` for each job, on a pool of ``workers`` threads; results in job order."""
    executor = ThreadPoolExecutor(max_workers=workers)
    futures = [executor.submit(work, n) for n in jobs]
    try:
        return [future.result(timeout=SECONDS) for future in futures]
    except TimeoutError:
        done = [f.result() for f in futures if f.done() and not f.exception()]
        print(json.dumps({"hung": len(futures) - len(done), "done": len(done)}))
        sys.stdout.flush()
        os._exit(3)  # the stuck threads would keep the interpreter from exiting
    finally:
        executor.shutdown(wait=False)


def add_one(session: StatekeeperSession, n: int) -> None:
    """The SDK's ``add_item``: a new event loop in this thread for one call."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(session.add_items([{"role": "user", "content": f"Message {n}"}]))
    loop.close()


def run_one(session: StatekeeperSession, n: int) -> str:
    """One run of an agent through ``Runner.run_sync`` (the thread's default loop)."""
    from agents import Runner
    from oai_app import RUN_CONFIG, ScriptedModel, make_agent, say

    agent = make_agent(ScriptedModel([[say(f"Answer {n}", n)]]))
    result = Runner.run_sync(agent, f"Question {n}", session=session, run_config=RUN_CONFIG)
    return str(result.final_output)


def scenario(session: StatekeeperSession, shape: str) -> list[Any]:
    if shape == "concurrent":
        return in_threads(lambda n: add_one(session, n), range(10), workers=5)
    return in_threads(lambda n: run_one(session, n), range(8), workers=4)


def owned(url: str, shape: str) -> dict[str, Any]:
    session = StatekeeperSession.from_url("concurrent_test", url, tenant="threads")
    results = scenario(session, shape)
    items = asyncio.run(session.get_items())
    session.close()
    return {"results": results, "items": items}


async def caller(url: str, shape: str) -> dict[str, Any]:
    async with open_store(url) as store:
        session = StatekeeperSession("concurrent_test", store, tenant="threads")
        results = scenario(session, shape)  # blocks this loop, as the SDK's test does
        items = await asyncio.wait_for(session.get_items(), SECONDS)
    return {"results": results, "items": items}


def main(url: str, shape: str, mode: str) -> None:
    try:
        outcome = owned(url, shape) if mode == "owned" else asyncio.run(caller(url, shape))
    except Exception:
        print(json.dumps({"error": traceback.format_exc()}))
        sys.stdout.flush()
        os._exit(4)  # threads may still be stuck in a failed call
    print(json.dumps(outcome))


if __name__ == "__main__":
    main(*sys.argv[1:4])
