"""The agent lifecycle: statuses, the transition table and a status timeline. Pure, no I/O.

A `Lifecycle` holds an agent's current status and the list of transitions that led to
it. Moves are checked against a `TransitionTable`; one the table does not allow raises
`InvalidTransitionError` and changes nothing. Tables are immutable and replaceable per
agent, and may add custom states (names like ids, kept in lower case).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError, field_validator

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, InvalidPayloadError, InvalidTransitionError
from statekeeper.ids import validate_id

__all__ = [
    "DEFAULT_TRANSITIONS",
    "STATUS_ALIASES",
    "AgentStatus",
    "Lifecycle",
    "Transition",
    "TransitionTable",
    "parse_status",
    "status_on_limit",
]


class AgentStatus(StrEnum):
    """The built-in statuses of an agent run."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    WAITING_FOR_INPUT = "waiting_for_input"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    PAUSED = "paused"
    COMPLETED = "completed"
    ERROR = "error"
    CANCELLED = "cancelled"


STATUS_ALIASES: Mapping[str, AgentStatus] = MappingProxyType(
    {
        "loading": AgentStatus.INITIALIZING,
        "awaiting_user_input": AgentStatus.WAITING_FOR_INPUT,
        "awaiting_user_confirmation": AgentStatus.WAITING_FOR_APPROVAL,
        "finished": AgentStatus.COMPLETED,
        "stopped": AgentStatus.CANCELLED,
    }
)
"""Other systems' status names (lower case) accepted when reading, and what they mean."""


def _explain(exc: Exception) -> str:
    """An error as one line (a pydantic error as ``field: message; ...``)."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())


_BUILTIN = {s.value: s for s in AgentStatus}


def _builtin(name: str) -> AgentStatus | None:
    key = name.lower()
    return _BUILTIN.get(key) or STATUS_ALIASES.get(key)


def _custom_name(name: object) -> str:
    return validate_id(name, "state name").lower()


def _state_key(name: object) -> str:
    """A row key: the built-in state a name means, else a validated custom name."""
    status = _builtin(name) if isinstance(name, str) else None
    return status if status is not None else _custom_name(name)


def _parse(name: object, custom: Collection[str]) -> str:
    if isinstance(name, AgentStatus):
        return name
    if not isinstance(name, str):
        raise InvalidInputError(f"a status must be a string, got {type(name).__name__}")
    status = _builtin(name)
    if status is not None:
        return status
    if name.lower() in custom:
        return name.lower()
    known = [s.value for s in AgentStatus] + [s for s in custom if s not in _BUILTIN]
    raise InvalidInputError(
        f"unknown status {name!r}; valid statuses: {', '.join(known)} "
        f"(aliases: {', '.join(STATUS_ALIASES)})"
    )


def parse_status(name: object, table: TransitionTable | None = None) -> str:
    """Turn a status name into an `AgentStatus`, or into a custom state of ``table``.

    Built-in names and values are accepted in any case, as are the aliases in
    `STATUS_ALIASES`. A custom state is returned as a lower-case ``str`` only when
    ``table`` has it. Anything else raises `InvalidInputError` listing the valid names.
    """
    return _parse(name, table.states if table is not None else ())


class TransitionTable:
    """An immutable map from each state to the states it may move to.

    Every state must have a row (an empty row makes it terminal) and every target must
    be a state of the table. Built-in states are `AgentStatus` members; custom states
    are lower-case names validated like ids. Alias names always mean the built-in state.
    """

    __slots__ = ("_rows",)
    _rows: Mapping[str, frozenset[str]]

    def __init__(self, rows: Mapping[str, Iterable[object]]) -> None:
        if not isinstance(rows, Mapping):
            raise InvalidInputError(
                f"a transition table must be a mapping of state -> targets, "
                f"got {type(rows).__name__}"
            )
        sources: dict[str, list[object]] = {}
        for source, targets in rows.items():
            name = _state_key(source)
            if isinstance(targets, str) or not isinstance(targets, Iterable):
                raise InvalidInputError(
                    f"the targets of {str(name)!r} must be a list of state names, "
                    f"got {type(targets).__name__}"
                )
            sources.setdefault(name, []).extend(targets)
        table: dict[str, frozenset[str]] = {}
        for name, targets in sources.items():
            resolved: set[str] = set()
            for target in targets:
                try:
                    state = _parse(target, sources.keys())
                    if state not in sources:
                        raise InvalidInputError(state)
                except InvalidInputError:
                    raise InvalidInputError(
                        f"target {target!r} of state {str(name)!r} is not a state of the table; "
                        "add a row for it (an empty row makes it terminal)"
                    ) from None
                resolved.add(state)
            table[name] = frozenset(resolved)
        object.__setattr__(self, "_rows", MappingProxyType(table))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("TransitionTable is immutable; use with_transitions/with_state")

    # -- queries --------------------------------------------------------------------------

    @property
    def states(self) -> tuple[str, ...]:
        """All states of the table, in the order they were declared."""
        return tuple(self._rows)

    def parse(self, name: object) -> str:
        """`parse_status` against this table: built-in, alias or one of its custom states."""
        return parse_status(name, self)

    def allowed(self, source: object) -> frozenset[str]:
        """The states ``source`` may move to."""
        return self._rows[self._known(source)]

    def allows(self, source: object, target: object) -> bool:
        """Whether the table allows ``source -> target`` (both must be known states)."""
        return self._known(target) in self.allowed(source)

    def is_terminal(self, state: object) -> bool:
        """Whether no transition leaves ``state``."""
        return not self.allowed(state)

    def _known(self, name: object) -> str:
        state = self.parse(name)
        if state not in self._rows:
            raise InvalidInputError(
                f"status {str(state)!r} is not a state of this table; its states: "
                + ", ".join(self._rows)
            )
        return state

    # -- derived tables -------------------------------------------------------------------

    def with_transitions(self, rows: Mapping[str, Iterable[object]]) -> TransitionTable:
        """A new table where the given rows replace (or add) those of this one."""
        if not isinstance(rows, Mapping):
            raise InvalidInputError("with_transitions expects a mapping of state -> targets")
        merged: dict[str, Iterable[object]] = dict(self._rows)
        merged.update({_state_key(source): targets for source, targets in rows.items()})
        return TransitionTable(merged)

    def with_state(
        self, name: str, *, to: Iterable[str] = (), from_: Iterable[str] = ()
    ) -> TransitionTable:
        """A new table with state ``name`` added (or extended).

        ``to`` are states ``name`` may move to; each state in ``from_`` may move to it.
        """
        state = _state_key(name)
        rows: dict[str, list[str]] = {s: list(t) for s, t in self._rows.items()}
        rows.setdefault(state, []).extend(to)
        for source in from_:
            source_state = _parse(source, rows.keys())
            if source_state not in rows:
                raise InvalidInputError(
                    f"from_ state {source!r} is not a state of the table; its states: "
                    + ", ".join(rows)
                )
            rows[source_state].append(state)
        return TransitionTable(rows)

    # -- JSON -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, list[str]]:
        """The table as JSON: state -> sorted list of targets."""
        return {str(s): sorted(str(t) for t in targets) for s, targets in self._rows.items()}

    @classmethod
    def from_dict(cls, data: object) -> TransitionTable:
        """Read a table written by `to_dict` (alias names accepted)."""
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(t, str) for t in v)
            for k, v in data.items()
        ):
            raise InvalidPayloadError(
                "a transition table must be a JSON object of state -> list of state names"
            )
        try:
            return cls(data)
        except InvalidInputError as exc:
            raise InvalidPayloadError(f"invalid transition table: {_explain(exc)}") from exc

    # -- protocol -------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TransitionTable):
            return NotImplemented
        return dict(self._rows) == dict(other._rows)

    def __hash__(self) -> int:
        return hash(frozenset(self._rows.items()))

    def __repr__(self) -> str:
        return f"TransitionTable({self.to_dict()!r})"


_DEFAULT_ROWS = {
    "initializing": "running waiting_for_input waiting_for_approval paused completed error",
    "running": "completed error paused waiting_for_input waiting_for_approval",
    "waiting_for_input": "running waiting_for_approval paused completed error waiting_for_input",
    "waiting_for_approval": (
        "running waiting_for_input waiting_for_approval paused completed cancelled error"
    ),
    "paused": "initializing running waiting_for_input waiting_for_approval cancelled error",
    "completed": "",
    "error": "cancelled",
    "cancelled": "",
}
DEFAULT_TRANSITIONS = TransitionTable({s: t.split() for s, t in _DEFAULT_ROWS.items()})
"""The default table of DESIGN.md ("Lifecycle")."""


class Transition(BaseModel):
    """One recorded status change: from ``source`` to ``target`` at ``at`` (UTC-aware)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    target: str
    at: AwareDatetime
    reason: str | None = None

    @field_validator("source", "target")
    @classmethod
    def _status_name(cls, value: str) -> str:
        return _builtin(value) or _custom_name(value)

    def to_dict(self) -> dict[str, Any]:
        """The transition as plain JSON data."""
        return self.model_dump(mode="json")


class Lifecycle:
    """An agent's current status and its timeline of transitions.

    Subclasses may override `can_transition` to restrict (or widen) what the table
    allows for one agent; `transition_to` consults it.
    """

    def __init__(
        self,
        status: str = AgentStatus.INITIALIZING,
        *,
        table: TransitionTable = DEFAULT_TRANSITIONS,
        history: Iterable[Transition | dict[str, Any]] = (),
    ) -> None:
        if not isinstance(table, TransitionTable):
            raise InvalidInputError(f"table must be a TransitionTable, got {type(table).__name__}")
        self._table = table
        self._status = table._known(status)
        self._history = [Transition.model_validate(t) for t in history]
        expected = self._history[0].source if self._history else self._status
        for i, step in enumerate(self._history):
            table._known(step.source)
            table._known(step.target)
            if step.source != expected:
                raise InvalidInputError(
                    f"history is not a chain: transition {i} starts at {str(step.source)!r} "
                    f"but the previous one ended at {str(expected)!r}"
                )
            expected = step.target
        if expected != self._status:
            raise InvalidInputError(
                f"history ends at {str(expected)!r} but the status is {str(self._status)!r}"
            )

    @property
    def status(self) -> str:
        """The current status (an `AgentStatus`, or a custom state name)."""
        return self._status

    @property
    def table(self) -> TransitionTable:
        """The transition table in force."""
        return self._table

    @property
    def history(self) -> tuple[Transition, ...]:
        """Every transition so far, oldest first (a read-only copy)."""
        return tuple(self._history)

    @property
    def initial_status(self) -> str:
        """The status before the first recorded transition."""
        return self._history[0].source if self._history else self._status

    @property
    def is_terminal(self) -> bool:
        """Whether the current status has no way out in the table."""
        return self._table.is_terminal(self._status)

    def can_transition(self, target: str) -> bool:
        """Whether moving from the current status to ``target`` is allowed. Override hook."""
        return self._table.allows(self._status, target)

    def allowed_targets(self) -> frozenset[str]:
        """The states `can_transition` allows from the current status."""
        return frozenset(s for s in self._table.states if self.can_transition(s))

    def transition_to(
        self, target: str, reason: str | None = None, *, at: datetime | None = None
    ) -> Transition:
        """Move to ``target`` and record it, or raise `InvalidTransitionError` changing nothing.

        An unknown target raises `InvalidInputError`. ``at`` defaults to now (UTC).
        """
        state = self._table._known(target)
        if not self.can_transition(state):
            allowed = frozenset(str(s) for s in self.allowed_targets())
            raise InvalidTransitionError(str(self._status), str(state), allowed)
        try:
            step = Transition(source=self._status, target=state, at=at or utcnow(), reason=reason)
        except ValidationError as exc:
            raise InvalidInputError(f"invalid transition: {_explain(exc)}") from exc
        self._history.append(step)
        self._status = state
        return step

    # -- JSON -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; the table is included only when it is not the default."""
        data: dict[str, Any] = {
            "status": str(self._status),
            "history": [t.to_dict() for t in self._history],
        }
        if self._table != DEFAULT_TRANSITIONS:
            data["table"] = self._table.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: object, *, table: TransitionTable | None = None) -> Lifecycle:
        """Read `to_dict` output (alias names accepted).

        ``table`` overrides a stored table; without either the default table is used.
        """
        if not isinstance(data, dict) or not isinstance(data.get("status"), str):
            raise InvalidPayloadError("a lifecycle must be a JSON object with a 'status' string")
        unknown = set(data) - {"status", "history", "table"}
        if unknown:
            raise InvalidPayloadError(f"unknown lifecycle fields: {', '.join(sorted(unknown))}")
        if table is None:
            stored = data.get("table")
            table = DEFAULT_TRANSITIONS if stored is None else TransitionTable.from_dict(stored)
        history = data.get("history", [])
        if not isinstance(history, list):
            raise InvalidPayloadError("lifecycle 'history' must be a list of transitions")
        try:
            return cls(data["status"], table=table, history=history)
        except (ValidationError, InvalidInputError) as exc:
            raise InvalidPayloadError(f"invalid lifecycle: {_explain(exc)}") from exc

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Lifecycle):
            return NotImplemented
        return (
            type(self) is type(other)
            and self._status == other._status
            and self._table == other._table
            and self._history == other._history
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        name, status = type(self).__name__, str(self._status)
        return f"{name}(status={status!r}, transitions={len(self._history)})"


def status_on_limit(headless: bool) -> AgentStatus:
    """Where a run goes when a limit is reached: PAUSED, resumable once the limit is raised.

    Headless or not: a headless run's caller gets `LimitReachedError` (carrying the
    state) instead of a paused result, and may raise the limit and resume, as the
    OpenAI Agents SDK lets a caller catch ``MaxTurnsExceeded`` and continue.
    """
    del headless  # the same status either way; kept for callers that pass it
    return AgentStatus.PAUSED
