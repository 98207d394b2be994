"""Starting a delegated (child) run: `Runner.delegate` does it through `start_child`.

In order: the parent's finished children are settled (`settle_children`), the child's
budget and tokens are reserved of the parent's room (`reserve`: refused, writing
nothing, when none is left), its session is created and it is registered with the
subagent registry, then it is started as a run of its own. A child that could not be
created gives its reservation back. See `statekeeper.runs.rollup`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from statekeeper.core.limits import Limits
from statekeeper.core.messages import Message
from statekeeper.core.metrics import DelegationInfo
from statekeeper.errors import NotFoundError, StatekeeperError
from statekeeper.ids import new_id
from statekeeper.runs.agent import Agent
from statekeeper.runs.coordination import Coordination
from statekeeper.runs.loop import find_agent
from statekeeper.runs.options import ContextCodec, RunPolicy
from statekeeper.runs.results import RunResult, as_messages
from statekeeper.runs.rollup import release, reserve, settle_children
from statekeeper.runs.spans import child_parent
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunStore
from statekeeper.sessions import SessionManager

__all__ = ["Delegator", "start_child"]


class Delegator(Protocol):
    """What `start_child` needs of a `statekeeper.runs.Runner`."""

    @property
    def agents(self) -> Mapping[str, Agent]: ...
    @property
    def runs(self) -> RunStore: ...
    @property
    def sessions(self) -> SessionManager: ...
    @property
    def coordination(self) -> Coordination: ...
    @property
    def policy(self) -> RunPolicy: ...
    @property
    def context_codec(self) -> ContextCodec: ...

    async def start(
        self,
        agent: str,
        input: str | Message | Sequence[Message] = (),
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        headless: bool = True,
        limits: Limits | None = None,
        context: Any = None,
        group_id: str | None = None,
        delegation: DelegationInfo | None = None,
    ) -> RunResult: ...


async def start_child(
    runner: Delegator,
    parent: RunState,
    agent: str,
    input: str | Message | Sequence[Message],
    *,
    own_session: bool,
    headless: bool | None,
    limits: Limits | None,
    task: str | None,
) -> RunResult:
    """Run ``agent`` as a child of ``parent`` (see `Runner.delegate`)."""
    find_agent(runner.agents, agent)  # before anything is written
    runs = runner.runs
    await settle_children(runs, parent.run_id, runner.coordination.track_child)
    run_id = new_id("run")
    parent, capped = await reserve(runs, parent, run_id, runner.policy.limits_for(limits))
    try:
        delegation = DelegationInfo.child_of(
            parent.delegation or 0,
            parent.metrics,
            int(parent.limits.iterations.current),
            parent_run_id=parent.run_id,
        )
        session_id = parent.session_id
        if own_session:
            title = f"delegated by {parent.run_id}"
            session_id = (await runner.sessions.create(title=title, agent_id=agent)).id
        messages = as_messages(input)
        await runner.coordination.register_child(
            run_id,
            child_session_id=session_id,
            requester_session_id=parent.session_id,
            task=task or (messages[0].text if messages else agent),
        )
        with child_parent(parent):  # the child's span goes under the parent's step
            return await runner.start(
                agent,
                messages,
                session_id=session_id,
                run_id=run_id,
                headless=parent.headless if headless is None else headless,
                limits=capped,
                group_id=parent.group_id or parent.run_id,
                delegation=delegation,
                context=runner.context_codec.load(parent.context),
            )
    except BaseException:
        # A child that exists keeps its reservation (it is paused, say) until it ends.
        with contextlib.suppress(StatekeeperError):
            try:
                await runs.index(run_id)
            except NotFoundError:
                await release(runs, parent.run_id, run_id)
        raise
