"""Guardrails: checks on what goes into a run and what comes out of it.

A guardrail is a function returning a `GuardrailResult` (or None: nothing to report).
Every result is kept in ``RunState.guardrails`` with its kind and turn. What a
*triggered* one does depends on where it sits:

    kind          checks                          when triggered
    input         new input messages of the run   the run ends in ERROR (`GuardrailTripped`)
    output        the output of a `Finish`        the run ends in ERROR (`GuardrailTripped`)
    tool_input    a tool call's arguments         the call does not run; its result says why
    tool_output   a tool's output                 the output is withheld; the result says why

Input and output guardrails belong to the runner (`Guardrails`); tool guardrails to each
`Tool` (``input_guardrail`` / ``output_guardrail``). A tripped tool guardrail never stops
the run: the agent sees the blocked call's result and decides what to do next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import JsonValue

from statekeeper.core.messages import Message
from statekeeper.errors import StatekeeperError
from statekeeper.runs.state import GuardrailResult, RunState

__all__ = [
    "GuardrailKind",
    "GuardrailTripped",
    "Guardrails",
    "InputGuardrail",
    "OutputGuardrail",
    "check_tool_guardrail",
]

GuardrailKind = Literal["input", "output", "tool_input", "tool_output"]
InputGuardrail = Callable[[Sequence[Message]], GuardrailResult | None]
"""Sees the new input messages of a run (at start, on resume, and steering)."""
OutputGuardrail = Callable[[JsonValue], GuardrailResult | None]
"""Sees the output a `Finish` action gives."""


class GuardrailTripped(StatekeeperError):
    """An input or output guardrail stopped the run, which ended in ERROR.

    ``result`` is the triggered guardrail's result; ``state`` the run state as saved.
    """

    def __init__(self, result: GuardrailResult, *, state: RunState | None = None) -> None:
        super().__init__(f"{result.kind} guardrail {result.name} triggered")
        self.result = result
        self.state = state


def _record(state: RunState, result: GuardrailResult, kind: GuardrailKind) -> GuardrailResult:
    # The kind and turn come from where the check ran, whatever the function filled in.
    result = result.model_copy(update={"kind": kind, "turn": state.turn})
    state.guardrails = [*state.guardrails, result]
    return result


@dataclass(frozen=True)
class Guardrails:
    """The runner's input and output guardrails, run in the order given."""

    input: Sequence[InputGuardrail] = ()
    output: Sequence[OutputGuardrail] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "input", tuple(self.input))
        object.__setattr__(self, "output", tuple(self.output))

    def check_input(self, state: RunState, messages: Sequence[Message]) -> None:
        """Record every input guardrail's result; raise `GuardrailTripped` at the first
        triggered one (later ones do not run)."""
        for check in self.input:
            result = check(messages)
            if result is not None:
                recorded = _record(state, result, "input")
                if recorded.triggered:
                    raise GuardrailTripped(recorded)

    def check_output(self, state: RunState, output: JsonValue) -> None:
        """Like `check_input`, for the output of a `Finish`."""
        for check in self.output:
            result = check(output)
            if result is not None:
                recorded = _record(state, result, "output")
                if recorded.triggered:
                    raise GuardrailTripped(recorded)


def check_tool_guardrail(
    state: RunState,
    check: Callable[[Any], GuardrailResult | None] | None,
    value: Any,
    kind: Literal["tool_input", "tool_output"],
) -> GuardrailResult | None:
    """Run a tool's guardrail on ``value``, record its result; the result if triggered."""
    if check is None:
        return None
    result = check(value)
    if result is None:
        return None
    recorded = _record(state, result, kind)
    return recorded if recorded.triggered else None
