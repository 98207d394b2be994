"""What every request of a server shares: the store, the keys, the hub, the runners."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from statekeeper.errors import InvalidInputError
from statekeeper.runs.operations import build_runner
from statekeeper.runs.runner import Runner
from statekeeper.runs.steering import attach_followups
from statekeeper.server.errors import reported
from statekeeper.server.keys import ApiKeys
from statekeeper.server.streams import EventHub
from statekeeper.stores.base import Store
from statekeeper.tasks import cancel_and_wait

__all__ = ["ServerContext"]

_log = logging.getLogger(__name__)


@dataclass
class ServerContext:
    """The open store and what is built on it, for the server's lifetime."""

    store: Store
    hub: EventHub
    factory: Callable[..., Any] | None = None
    app_spec: str | None = None
    anonymous: bool = False
    locations: Sequence[str] = ()
    """Spellings of the store's location, kept out of what clients read (`reported`)."""
    shutdown_grace: float = 10.0
    """Seconds `aclose` lets background runs finish before it stops them (their leases
    released, so another server can resume them at once)."""
    closing: bool = False
    """Set when shutdown begins: ``/readyz`` answers 503 from then on."""
    keys: ApiKeys = field(init=False)
    _runners: dict[str, Runner] = field(default_factory=dict)
    _plain: dict[str, Runner] = field(default_factory=dict)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.keys = ApiKeys(self.store)

    def reported(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        """Damaged items of a listing as JSON, without the store's location."""
        return reported(items, self.locations)

    async def runner(self, tenant: str, *, agents: bool = False) -> Runner:
        """The tenant's runner: the ``--app`` one when there is an app (it knows the
        codec and the agents), else one without agents, enough to decide and cancel.
        ``agents=True`` (resume, fork and run) requires the app."""
        if self.factory is not None and self.app_spec is not None:
            runner = self._runners.get(tenant)
            if runner is None:
                runner = await build_runner(self.factory, self.app_spec, self.store, tenant)
                attach_followups(runner)  # runs it drives can be steered (routes_control)
                self._runners[tenant] = runner
            return runner
        if agents:
            raise InvalidInputError(
                "this server has no agents to run: start it with --app MODULE:ATTR "
                "(a function (store, tenant) -> Runner), as for `statekeeper runs resume`"
            )
        plain = self._plain.get(tenant)
        if plain is None:
            plain = self._plain[tenant] = Runner(self.store, tenant, agents=[])
        return plain

    def background(self, work: Coroutine[Any, Any, Any], *, tenant: str, run_id: str) -> None:
        """Run ``work`` (a resume) after the answer; its end wakes the run's streams."""

        async def job() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # recorded on the run (ERROR) by the runner itself
                _log.warning("the background resume of run %s failed: %r", run_id, exc)
            finally:
                self.hub.poke(tenant, run_id)

        task = asyncio.create_task(job(), name=f"statekeeper-resume:{run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def in_flight(self) -> int:
        """Background runs (starts, resumes, forks, follow-ups) this server drives now."""
        return sum(1 for task in self._tasks if not task.done())

    async def aclose(self, grace: float | None = None) -> None:
        """Graceful shutdown: let background runs finish for up to ``grace`` seconds
        (`shutdown_grace`), then stop the rest (each run's lease is released as it stops,
        so any server can resume it at once), stop follow-ups and streams, close the store."""
        self.closing = True
        grace = self.shutdown_grace if grace is None else grace
        pending = {task for task in self._tasks if not task.done()}
        if pending and grace > 0:
            _log.warning("shutting down: letting %d running run(s) finish", len(pending))
            await asyncio.wait(pending, timeout=grace)
        for runner in self._runners.values():
            if runner.coordination.followups is not None:
                with contextlib.suppress(Exception):
                    await runner.coordination.followups.close(cancel=True)
        left = [task for task in self._tasks if not task.done()]
        if left:
            names = ", ".join(sorted(task.get_name().partition(":")[2] for task in left))
            _log.warning("shutting down: stopping run(s) %s; their leases are released", names)
        for task in left:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        await self.hub.aclose()
        await self.store.close()
