"""`RunIndex`: the small, listable record of a run (namespace ``runs``).

A cache for listing and lookup, kept by `statekeeper.runs.store.RunStore`: loading
rolls forward past it to the newest checkpoint (see ``docs/runs.md``).
"""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from statekeeper.core.messages import utcnow
from statekeeper.core.metrics import Metrics
from statekeeper.runs.state import RunState

__all__ = ["RunIndex", "carry", "index_of"]


class RunIndex(BaseModel):
    """The small, listable record of a run."""

    model_config = ConfigDict(extra="forbid")
    run_id: str
    session_id: str
    agent: str
    status: str
    turn: int = 0
    revision: int = 0
    checkpoint_seq: int = 0
    group_id: str | None = None
    parent_run_id: str | None = None
    headless: bool = True
    cancel_requested: bool = False
    child_usage: dict[str, Metrics] = Field(default_factory=dict)
    """What delegated children reported they used (see `statekeeper.runs.rollup`)."""
    owner: str | None = None
    lease_until: AwareDatetime | None = None
    created_at: AwareDatetime = Field(default_factory=utcnow)
    updated_at: AwareDatetime = Field(default_factory=utcnow)


def index_of(state: RunState, *, checkpoint_seq: int) -> RunIndex:
    """The index record of ``state``, checkpointed at ``checkpoint_seq`` (no lease)."""
    return RunIndex(
        run_id=state.run_id,
        session_id=state.session_id,
        agent=state.agent,
        status=state.status,
        turn=state.turn,
        revision=state.revision,
        checkpoint_seq=checkpoint_seq,
        group_id=state.group_id,
        parent_run_id=state.delegation.parent_run_id if state.delegation else None,
        headless=state.headless,
        cancel_requested=state.cancel_requested,
        child_usage=state.child_usage,
        created_at=state.created_at,
        updated_at=state.updated_at,
    )


def carry(index: RunIndex, current: RunIndex) -> RunIndex:
    """``index`` keeping what others wrote into ``current``, the stored record: a cancel
    request, and the usage reports of delegated children (the stored ones are newest)."""
    index.cancel_requested = index.cancel_requested or current.cancel_requested
    index.child_usage = {**index.child_usage, **current.child_usage}
    return index
