"""How runs keep to their limits: checked before every step and on resume, raised only
on purpose.

A run whose iterations, budget, tokens or wall time reached its maximum starts no
further step: it stops in PAUSED (headless or not), and a resume without room raises
`LimitReachedError`, writing nothing. `raise_limits` gives it room, explicitly (new
maxima) or by each reached flag's ``increase_amount``. Wall time is the time the run was
being driven (a paused run's clock does not run), read from an injectable clock
(`RunPolicy(clock=...)`), so tests need no sleeping.
"""

from __future__ import annotations

from collections.abc import Callable

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.limits import ControlFlag, Limits
from statekeeper.errors import InvalidInputError, LimitReachedError
from statekeeper.runs.lifecycle import FINISHED, RunLifecycle
from statekeeper.runs.state import RunState
from statekeeper.runs.writer import CheckpointWriter

__all__ = [
    "LIMIT_KEYWORDS",
    "Stopwatch",
    "check_room",
    "limit_error",
    "raise_limits",
    "reached",
    "stop_at_limit",
]

LIMIT_KEYWORDS: dict[str, str] = {
    "iterations": "iterations",
    "budget": "budget",
    "tokens": "tokens",
    "time": "seconds",
}
"""A `Limits` field -> its keyword of `Runner.raise_limits` (and ``runs raise-limit`` option)."""


def reached(limits: Limits) -> tuple[str, ControlFlag] | None:
    """The first limit (field name and flag) at its maximum, or None if there is room."""
    for field in LIMIT_KEYWORDS:
        flag: ControlFlag | None = getattr(limits, field)
        if flag is not None and flag.reached_limit():
            return field, flag
    return None


def limit_error(state: RunState, field: str, flag: ControlFlag) -> LimitReachedError:
    """The error of a run stopped at ``flag``, telling how to give it room."""
    run_id, keyword = state.run_id, LIMIT_KEYWORDS[field]
    hint = (
        f"run {run_id} is paused before its next step; raise the limit with "
        f"runner.raise_limits({run_id!r}, {keyword}=...) or "
        f"`statekeeper runs raise-limit {run_id} --{keyword} N`, then resume it (or cancel it)"
    )
    return LimitReachedError(flag.name, flag.current, flag.maximum or 0.0, state=state, hint=hint)


async def stop_at_limit(
    state: RunState,
    lifecycle: RunLifecycle,
    writer: CheckpointWriter,
    field: str,
    flag: ControlFlag,
) -> None:
    """Stop a running run before its next step, resumable (PAUSED, one status event naming
    the limit); a headless run's caller also gets `limit_error` (with the state)."""
    details = {"limit": flag.name, "current": flag.current, "maximum": flag.maximum}
    lifecycle.move(state, AgentStatus.PAUSED, **details)
    await writer.save(state)
    await lifecycle.flush()
    if state.headless:
        raise limit_error(state, field, flag)


def check_room(state: RunState) -> None:
    """Raise `limit_error` if a limit of the run is reached (before a resume)."""
    found = reached(state.limits)
    if found is not None:
        raise limit_error(state, *found)


def raise_limits(
    state: RunState,
    *,
    iterations: int | None = None,
    budget: float | None = None,
    tokens: int | None = None,
    seconds: float | None = None,
) -> None:
    """Give the run room: the given new maxima, or (none given) every reached flag's
    ``increase_amount``. `InvalidInputError`, changing nothing, when that is not possible."""
    if state.status in FINISHED:
        raise InvalidInputError(
            f"run {state.run_id} is {state.status}; a finished run's limits cannot be raised"
        )
    given = {"iterations": iterations, "budget": budget, "tokens": tokens, "time": seconds}
    wanted = {field: value for field, value in given.items() if value is not None}
    if not wanted:
        if not state.limits.increase_limits(headless=False):
            raise InvalidInputError(
                f"run {state.run_id} has no reached limit with an increase_amount; give the "
                f"new maximum: raise_limits({state.run_id!r}, iterations=N, budget=X, "
                "tokens=T, seconds=S) (`runs raise-limit RUN --budget X ...`)"
            )
        return
    updated = state.limits.model_copy(deep=True)
    for field, value in wanted.items():
        flag: ControlFlag | None = getattr(updated, field)
        if flag is None:
            raise InvalidInputError(
                f"run {state.run_id} has no {field} limit to raise "
                f"({LIMIT_KEYWORDS[field]}=); it is unlimited"
            )
        flag.raise_to(value)
    state.limits = updated


class Stopwatch:
    """Adds the time a run is driven to its time limit (``Limits.time``), if it has one."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._mark: float | None = None

    def start(self) -> None:
        """The run is being driven from now on (time before this is not counted)."""
        self._mark = self.clock()

    def tick(self, state: RunState) -> None:
        """Add the time since the last tick (or `start`) to the run's time limit."""
        now = self.clock()
        flag = state.limits.time
        if flag is not None and self._mark is not None:
            flag.set_current(round(flag.current + max(now - self._mark, 0.0), 6))
        self._mark = now
