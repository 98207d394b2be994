"""The option groups of a `Runner`, and the flat keywords it used to take.

    Runner(store, tenant, agents, tools,
           checkpoints=CheckpointOptions(write_mode="background", codec=codec),
           coordination=Coordination(lanes=lanes, followups=followups),
           guardrails=Guardrails(input=[no_secrets]),
           context_codec=ContextCodec(serializer=dump, deserializer=load),
           policy=RunPolicy(limits=Limits(iterations=IterationFlag(maximum=50))))

`Coordination` and `Guardrails` live next to the behaviour they configure
(``coordination.py``, ``guardrails.py``); the plain groups are here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from pydantic import JsonValue

from statekeeper.codec import StateCodec
from statekeeper.core.lifecycle import DEFAULT_TRANSITIONS, TransitionTable
from statekeeper.core.limits import Limits
from statekeeper.core.tokens import TokenCounter
from statekeeper.errors import InvalidInputError, InvalidPayloadError
from statekeeper.runs.guardrails import InputGuardrail, OutputGuardrail
from statekeeper.runs.results import EventSink, SessionLocks
from statekeeper.runs.writer import WriteMode
from statekeeper.runtime.followups import FollowupQueue
from statekeeper.runtime.lanes import CommandLanes
from statekeeper.runtime.subagents import SubagentRegistry

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["CheckpointOptions", "ContextCodec", "FlatOptions", "RunPolicy", "apply_flat"]

_WRITE_MODES = ("step", "background", "exit")


@dataclass(frozen=True)
class CheckpointOptions:
    """How runs write: ``write_mode`` (step, background or exit; see `CheckpointWriter`),
    ``codec`` sealing stored checkpoints, ``counter`` counting the tokens of messages."""

    write_mode: WriteMode = "step"
    codec: StateCodec | None = None
    counter: TokenCounter | None = None

    def __post_init__(self) -> None:
        if self.write_mode not in _WRITE_MODES:
            raise InvalidInputError(
                f"unknown write mode {self.write_mode!r}: use step, background or exit"
            )


@dataclass(frozen=True)
class ContextCodec:
    """How a run's user context is kept in ``RunState.context`` (JSON) and read back."""

    serializer: Callable[[Any], JsonValue] | None = None
    deserializer: Callable[[JsonValue], Any] | None = None

    def dump(self, context: Any) -> JsonValue:
        """``context`` as JSON (None stays None); needs a serializer for anything else."""
        if context is None:
            return None
        if self.serializer is None:
            raise InvalidInputError("a run context needs a context_serializer on the Runner")
        return self.serializer(context)

    def load(self, data: JsonValue) -> Any:
        """The live context from stored ``data``; `InvalidPayloadError` if it cannot be read."""
        if data is None:
            return None
        if self.deserializer is None:
            raise InvalidInputError(
                "this run has a stored context; give the Runner a context_deserializer"
            )
        try:
            return self.deserializer(data)
        except Exception as exc:
            raise InvalidPayloadError(f"the run's context cannot be deserialized: {exc}") from exc


@dataclass(frozen=True)
class RunPolicy:
    """Rules every run of a runner follows: its status ``transitions``, the ``limits`` a
    run gets when `Runner.start` passes none (default: `Limits()`), and the ``clock``
    (seconds, monotonic) that measures a run's wall time for its time limit."""

    transitions: TransitionTable = DEFAULT_TRANSITIONS
    limits: Limits | None = None
    clock: Callable[[], float] = time.monotonic

    def limits_for(self, given: Limits | None) -> Limits:
        """A fresh copy of the limits for one run (runs never share a mutable flag)."""
        chosen = given if given is not None else self.limits
        return chosen.model_copy(deep=True) if chosen is not None else Limits()


class FlatOptions(TypedDict, total=False):
    """The keywords `Runner` took before the option groups; still accepted, each going
    to the field of its group named on the right."""

    write_mode: WriteMode  # checkpoints.write_mode
    codec: StateCodec | None  # checkpoints.codec
    counter: TokenCounter | None  # checkpoints.counter
    context_serializer: Callable[[Any], JsonValue] | None  # context_codec.serializer
    context_deserializer: Callable[[JsonValue], Any] | None  # context_codec.deserializer
    input_guardrails: Sequence[InputGuardrail]  # guardrails.input
    output_guardrails: Sequence[OutputGuardrail]  # guardrails.output
    transitions: TransitionTable  # policy.transitions
    events: EventSink | None  # coordination.events
    lanes: CommandLanes | None  # coordination.lanes
    followups: FollowupQueue | None  # coordination.followups
    subagents: SubagentRegistry | None  # coordination.subagents
    session_locks: SessionLocks | None  # coordination.session_locks
    owner: str | None  # coordination.owner (None: the default)
    lease_ttl: float  # coordination.lease_ttl


_FLAT: dict[str, tuple[str, str]] = {
    "write_mode": ("checkpoints", "write_mode"),
    "codec": ("checkpoints", "codec"),
    "counter": ("checkpoints", "counter"),
    "context_serializer": ("context_codec", "serializer"),
    "context_deserializer": ("context_codec", "deserializer"),
    "input_guardrails": ("guardrails", "input"),
    "output_guardrails": ("guardrails", "output"),
    "transitions": ("policy", "transitions"),
    "events": ("coordination", "events"),
    "lanes": ("coordination", "lanes"),
    "followups": ("coordination", "followups"),
    "subagents": ("coordination", "subagents"),
    "session_locks": ("coordination", "session_locks"),
    "owner": ("coordination", "owner"),
    "lease_ttl": ("coordination", "lease_ttl"),
}

G = TypeVar("G", bound="DataclassInstance")


def apply_flat(group: str, options: G, flat: Mapping[str, Any]) -> G:
    """``options`` (a frozen dataclass of group ``group``) with the flat keywords that
    belong to it applied. Unknown keywords raise `TypeError`, as for any function."""
    unknown = set(flat) - set(_FLAT)
    if unknown:
        raise TypeError(f"Runner() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    changes: dict[str, Any] = {}
    for key, value in flat.items():
        owner, name = _FLAT[key]
        if owner == group and not (key == "owner" and value is None):
            changes[name] = value
    return replace(options, **changes) if changes else options
