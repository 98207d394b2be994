"""Conversation statistics: cost and tokens summed over a session's runs.

Each run counts what it spent itself (`RunState.own_metrics`: without its parent's
snapshot, and without what its delegated children spent, which rolled up into it), so a
session's statistics are what the runs of that conversation spent, per model, each
spend counted once. A run whose checkpoint cannot be read (corrupt, or sealed
and the `RunStore` has no codec) is listed in ``unreadable`` instead of hiding the others.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from statekeeper.core.metrics import Metrics, TokenUsage
from statekeeper.errors import InvalidInputError, NotFoundError, StoreCorruptError
from statekeeper.runs.store import RunStore

__all__ = ["RunUsage", "SessionStats", "session_stats"]


class RunUsage(BaseModel):
    """One run's share of a session's statistics."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run_id: str
    agent: str
    status: str
    cost: float = 0.0
    tokens: int = 0
    calls: int = 0


class SessionStats(BaseModel):
    """What a session's runs used: ``metrics`` per model, and each run's share."""

    model_config = ConfigDict(extra="forbid")
    session_id: str
    metrics: Metrics = Field(default_factory=Metrics)
    runs: list[RunUsage] = Field(default_factory=list)
    unreadable: list[str] = Field(default_factory=list)
    """Runs whose checkpoint could not be read (not counted)."""

    @property
    def cost(self) -> float:
        """Total cost over every run and model."""
        return self.metrics.accumulated_cost

    @property
    def usage(self) -> TokenUsage:
        """Total token usage."""
        return self.metrics.usage

    @property
    def calls(self) -> int:
        """Model calls made."""
        return self.metrics.calls

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data, totals included."""
        return {
            "session_id": self.session_id,
            "cost": self.cost,
            "usage": self.usage.model_dump(mode="json"),
            "calls": self.calls,
            "metrics": self.metrics.to_dict(),
            "runs": [r.model_dump(mode="json") for r in self.runs],
            "unreadable": list(self.unreadable),
        }


async def session_stats(runs: RunStore, session_id: str) -> SessionStats:
    """Sum the usage of every run of ``session_id`` (`NotFoundError` if no such session)."""
    await runs.store.get_session(runs.tenant, session_id)
    stats = SessionStats(session_id=session_id)
    for index in await runs.list(session_id=session_id, limit=10**9):
        own, status = Metrics(), index.status  # registered, never checkpointed: nothing yet
        try:
            state, _, _ = await runs.load(index.run_id)
        except NotFoundError:
            pass
        except (StoreCorruptError, InvalidInputError):  # corrupt, or sealed: no codec here
            stats.unreadable.append(index.run_id)
            continue
        else:
            own, status = state.own_metrics, state.status
        stats.metrics.merge(own)
        stats.runs.append(
            RunUsage(
                run_id=index.run_id,
                agent=index.agent,
                status=status,
                cost=own.accumulated_cost,
                tokens=own.usage.total,
                calls=own.calls,
            )
        )
    return stats
