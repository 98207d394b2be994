"""Approval rules (pure): recording decisions and settling pending tool calls.

Approvals fail closed. A pending call is approved only by a decision that names the
same call id, tool and arguments, or by an "always approve" rule for its tool. A
decision that does not match its call exactly, or two decisions that disagree, count
as a rejection; a call with no decision stays pending.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from statekeeper.errors import ConflictError, NotFoundError
from statekeeper.runs.state import ApprovalDecision, Interruption, RunState

__all__ = ["Settlement", "record_decision", "settle", "settled_record"]


@dataclass
class Settlement:
    """Pending calls sorted by what happens to them on resume."""

    approved: list[Interruption] = field(default_factory=list)
    rejected: list[tuple[Interruption, str]] = field(default_factory=list)
    pending: list[Interruption] = field(default_factory=list)


def record_decision(
    state: RunState,
    call_id: str,
    *,
    approved: bool,
    always: bool = False,
    reason: str | None = None,
    decided_by: str | None = None,
) -> ApprovalDecision:
    """Add a decision for a pending call to ``state`` (which it changes in place).

    Unknown calls raise `NotFoundError`; deciding a call again the other way raises
    `ConflictError`; deciding it again the same way changes nothing.
    """
    matches = [i for i in state.interruptions if i.call_id == call_id]
    if not matches:
        pending = ", ".join(i.call_id for i in state.interruptions) or "none"
        raise NotFoundError(
            f"run {state.run_id} has no pending tool call {call_id!r} (pending: {pending})"
        )
    call = matches[0]
    for earlier in state.decisions:
        if earlier.call_id == call_id:
            if earlier.approved != approved:
                raise ConflictError(
                    f"tool call {call_id!r} of run {state.run_id} was already "
                    f"{'approved' if earlier.approved else 'rejected'}"
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
        if not exact or len(verdicts) != 1:
            out.rejected.append(
                (call, "the approval decision is ambiguous for this call; failing closed")
            )
        elif verdicts == {True}:
            out.approved.append(call)
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
