"""``/api/v1/runs/{run_id}/checkpoints/{step}``: a run's state as one checkpoint stored it.

What an operator looks at before "edit and rerun": the state, limits, metrics, the calls
waiting there, and the fields a fork's ``state_update`` may set (then ``POST .../fork``
with ``at``, ``state_update`` and ``input``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from statekeeper.runs.history import FIXED_FIELDS, checkpoint_state
from statekeeper.server.auth import Context, Reader
from statekeeper.server.views import limits_json, metrics_json, pending_json

__all__ = ["router"]

router = APIRouter(prefix="/runs", tags=["runs"])

_EDITABLE = ("context", "metadata", "limits", "always", "pending_input")
"""The fields the page offers to edit before forking (any field but the fixed ones may be
set through the API)."""


@router.get("/{run_id}/checkpoints/{step}")
async def checkpoint(
    run_id: str,
    step: Annotated[int, Path(ge=1, le=2**62, description="a step of the run's checkpoints")],
    caller: Reader,
    context: Context,
) -> dict[str, Any]:
    """The run's state at checkpoint ``step``: status, limits, metrics, pending calls."""
    runner = await context.runner(caller.tenant)
    info, state = await checkpoint_state(runner.runs, run_id, step)
    data = state.checkpoint_data()
    return {
        "run_id": run_id,
        "step": info.step,
        "turn": info.turn,
        "status": info.status,
        "agent": info.agent,
        "at": info.at.isoformat(),
        "added": list(info.added),
        "limits": limits_json(state.limits),
        "metrics": metrics_json(state.local_metrics),
        "pending": pending_json(state),
        "editable": {name: data.get(name) for name in _EDITABLE},
        "fixed": sorted(FIXED_FIELDS),
        "state": data,
    }
