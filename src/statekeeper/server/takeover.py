"""Taking over runs whose server went away (``statekeeper serve --app ... --take-over S``).

A run is driven by the process that holds its lease. When that process dies (a SIGKILL,
a lost machine) the run stays ``running`` under a lease no live process holds
(`statekeeper.runs.index.held`); `statekeeper.runs.why.why_stopped` calls it crashed.
With take-over on, a server with agents (``--app``) looks every S seconds through the
running runs of every tenant that has an API key, and resumes each such run itself, in
the background, as ``POST /runs/{id}/resume`` would: from its last checkpoint, running
again the tool call it was in (tools with side effects should be idempotent). A run
whose lease has not yet expired is left alone (its process may still live elsewhere).
Several servers may find the same run: its lease decides (compare-and-set), and the
others' resumes end at once with a `ConflictError`, logged.

The look costs a read of each tenant's run index per interval, so keep S in seconds
(the default lease is 300 s: a run is taken over between its lease's end and S later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.errors import StatekeeperError
from statekeeper.runs.index import held
from statekeeper.server.context import ServerContext
from statekeeper.tasks import cancel_and_wait

__all__ = ["keep_taking_over", "take_over_once", "taking_over"]

_log = logging.getLogger("statekeeper.server")
_PAGE = 500


async def take_over_once(context: ServerContext) -> list[str]:
    """Resume, in the background, every run of a keyed tenant that stopped mid-run with
    no live lease (see the module); the ids of the runs resumed."""
    keys = await context.keys.list()
    tenants = sorted({key.tenant for key in keys if key.revoked_at is None})
    if context.anonymous:
        tenants.append("default")
    resumed: list[str] = []
    for tenant in tenants:
        runner = await context.runner(tenant, agents=True)
        after: str | None = None
        while True:
            page = await runner.runs.list(status=AgentStatus.RUNNING, after=after, limit=_PAGE)
            for index in page:  # (listed as failed to start if it never checkpointed)
                if not held(index):
                    _log.warning(
                        "taking over run %s of tenant %s (its driver %s went away)",
                        index.run_id,
                        tenant,
                        index.owner,
                    )
                    context.background(
                        runner.resume(index.run_id), tenant=tenant, run_id=index.run_id
                    )
                    resumed.append(index.run_id)
            if len(page) < _PAGE:
                break
            after = page[-1].run_id
    return resumed


async def keep_taking_over(context: ServerContext, every: float) -> None:
    """`take_over_once` every ``every`` seconds until cancelled (a failed look is logged
    and tried again at the next)."""
    while True:
        await asyncio.sleep(every)
        if context.closing:
            return
        try:
            await take_over_once(context)
        except StatekeeperError as exc:
            _log.warning("looking for runs to take over failed: %s", exc)


@contextlib.asynccontextmanager
async def taking_over(context: ServerContext, every: float | None) -> AsyncIterator[None]:
    """`keep_taking_over` while inside (nothing when ``every`` is None)."""
    if every is None:
        yield
        return
    task = asyncio.create_task(keep_taking_over(context, every), name="statekeeper-take-over")
    try:
        yield
    finally:
        await cancel_and_wait(task)
