"""Approval rules (pure): recording decisions and settling pending tool calls.

Approvals fail closed. A pending call is approved only by a decision that names the
same call id, tool and arguments, or by an "always approve" rule for its tool. A
decision that does not match its call exactly, or two decisions that disagree, count
as a rejection; a call with no decision stays pending.

An approval may edit the call's arguments (``edited_arguments``): it stays bound to the
call's own arguments, and the tool runs with the edited ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from statekeeper.errors import ConflictError, InvalidInputError, NotFoundError
from statekeeper.runs.state import ApprovalDecision, Interruption, RunState

__all__ = [
    "MAX_EDITED_ARGUMENTS",
    "Settlement",
    "edited_arguments",
    "record_decision",
    "settle",
    "settled_record",
]

MAX_EDITED_ARGUMENTS = 256 * 1024
"""Most bytes of edited arguments (their JSON text, UTF-8)."""


@dataclass
class Settlement:
    """Pending calls sorted by what happens to them on resume."""

    approved: list[Interruption] = field(default_factory=list)
    rejected: list[tuple[Interruption, str]] = field(default_factory=list)
    pending: list[Interruption] = field(default_factory=list)
    edits: dict[str, str] = field(default_factory=dict)
    """``call_id -> arguments`` of the approved calls whose arguments were edited."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parsed(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return None


def edited_arguments(call: Interruption, value: str | Mapping[str, Any]) -> str | None:
    """``value`` as the edited arguments of ``call``: JSON object text, or None when it
    equals the call's own arguments (no edit). Anything else is an `InvalidInputError`."""
    fix = 'pass the arguments as a JSON object, such as {"amount": 100}'
    where = f"edited arguments for tool call {call.call_id!r} ({call.tool})"
    if isinstance(value, str):
        try:
            parsed = json.loads(value, parse_constant=_no_constant)
        except ValueError as exc:
            raise InvalidInputError(f"{where} are not valid JSON ({exc}); {fix}") from None
    elif isinstance(value, Mapping):
        parsed = dict(value)
    else:
        raise InvalidInputError(f"{where} are a {type(value).__name__}; {fix}")
    if not isinstance(parsed, dict):
        raise InvalidInputError(f"{where} are a JSON {type(parsed).__name__}; {fix}")
    try:
        text = json.dumps(parsed, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{where} cannot be written as JSON ({exc}); {fix}") from None
    size = len(text.encode())
    if size > MAX_EDITED_ARGUMENTS:
        raise InvalidInputError(
            f"{where} are {size} bytes, more than {MAX_EDITED_ARGUMENTS}; shorten them"
        )
    return None if parsed == _parsed(call.arguments) else text


def record_decision(
    state: RunState,
    call_id: str,
    *,
    approved: bool,
    always: bool = False,
    reason: str | None = None,
    decided_by: str | None = None,
    arguments: str | Mapping[str, Any] | None = None,
) -> ApprovalDecision:
    """Add a decision for a pending call to ``state`` (which it changes in place).

    ``arguments``: an approval's edited arguments (see `edited_arguments`). Unknown calls
    raise `NotFoundError`; deciding a call again the other way (or with other edited
    arguments) raises `ConflictError`; deciding it again the same way changes nothing.
    """
    matches = [i for i in state.interruptions if i.call_id == call_id]
    if not matches:
        pending = ", ".join(i.call_id for i in state.interruptions) or "none"
        raise NotFoundError(
            f"run {state.run_id} has no pending tool call {call_id!r} (pending: {pending})"
        )
    call = matches[0]
    if arguments is not None and not approved:
        raise InvalidInputError(
            f"tool call {call_id!r}: edited arguments go with an approval only; "
            "to reject, say why in the reason (the model gets it as the call's result)"
        )
    edited = None if arguments is None else edited_arguments(call, arguments)
    for earlier in state.decisions:
        if earlier.call_id == call_id:
            if earlier.approved != approved or earlier.edited_arguments != edited:
                how = "approved" if earlier.approved else "rejected"
                if earlier.edited_arguments is not None:
                    how += f" with the arguments {earlier.edited_arguments}"
                raise ConflictError(
                    f"tool call {call_id!r} of run {state.run_id} was already {how}"
                )
            return earlier
    decision = ApprovalDecision(
        call_id=call_id,
        tool=call.tool,
        arguments=call.arguments,
        approved=approved,
        always=always,
        reason=reason,
        decided_by=decided_by,
        edited_arguments=edited,
    )
    state.decisions = [*state.decisions, decision]
    if always:
        state.always = {**state.always, call.tool: approved}
    return decision


def settle(state: RunState) -> Settlement:
    """Sort the pending calls of ``state`` into approved, rejected and still pending."""
    out = Settlement()
    for call in state.interruptions:
        related = [d for d in state.decisions if d.call_id == call.call_id]
        if not related:
            rule = state.always.get(call.tool)
            if rule is True:
                out.approved.append(call)
            elif rule is False:
                out.rejected.append((call, f"calls to {call.tool} are always rejected"))
            else:
                out.pending.append(call)
            continue
        exact = all(d.tool == call.tool and d.arguments == call.arguments for d in related)
        verdicts = {d.approved for d in related}
        edits = {d.edited_arguments for d in related}
        if not exact or len(verdicts) != 1 or len(edits) != 1:
            out.rejected.append(
                (call, "the approval decision is ambiguous for this call; failing closed")
            )
        elif verdicts == {True}:
            out.approved.append(call)
            edit = edits.pop()
            if edit is not None:
                out.edits[call.call_id] = edit
        else:
            reason = next((d.reason for d in related if d.reason), None)
            out.rejected.append((call, reason or "rejected by the user"))
    return out


def settled_record(state: RunState) -> list[ApprovalDecision]:
    """What to keep of the decisions on the pending calls of ``state`` once they are
    settled: each call's decisions, or for a call an ``always`` rule decided, a decision
    saying so (``decided_by="always rule"``)."""
    kept: list[ApprovalDecision] = []
    for call in state.interruptions:
        related = [d for d in state.decisions if d.call_id == call.call_id]
        rule = state.always.get(call.tool)
        if not related and rule is not None:
            verb = "approved" if rule else "rejected"
            related = [
                ApprovalDecision(
                    call_id=call.call_id,
                    tool=call.tool,
                    arguments=call.arguments,
                    approved=rule,
                    reason=f"calls to {call.tool} are always {verb}",
                    decided_by="always rule",
                )
            ]
        kept += related
    return kept
