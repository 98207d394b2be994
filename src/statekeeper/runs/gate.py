"""`ApprovalGate`: holds tool calls that need a human decision, and lets them through.

The rules (what counts as approved, fail closed) are in `statekeeper.runs.approvals`;
this is where the runner applies them. The assistant message that made the calls is
held in the run state and written only together with every call's result, so the
transcript never has a call without its result, or a result without its call.

An approval with edited arguments runs the tool with them. The transcript keeps the
assistant's call as the model made it; the call's result says (to the model, in its text)
that the arguments were edited and what ran, and records it in its metadata
(``edited_arguments``, ``original_arguments``, ``edited_by``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.errors import InvalidInputError
from statekeeper.runs.approvals import record_decision, settle, settled_record
from statekeeper.runs.lifecycle import RunLifecycle
from statekeeper.runs.spans import decision_span, wait_spans
from statekeeper.runs.state import Interruption, RunState
from statekeeper.runs.store import RunStore
from statekeeper.runs.tools import ToolBox

__all__ = ["ApprovalGate"]


def _edited(result: Message, call: ToolCallBlock, edited: str, by: str | None) -> Message:
    """``result`` (of ``call`` run with ``edited`` arguments) saying so."""
    block = result.tool_results[0]
    note = (
        f"[A human edited the arguments of this tool call before it ran; it ran with: {edited}]\n"
    )
    record = {"edited_arguments": edited, "original_arguments": call.arguments}
    return result.with_changes(
        content=[block.model_copy(update={"content": note + block.content})],
        metadata={**result.metadata, **record, "edited_by": by},
    )


class ApprovalGate:
    """Approvals of one runner: hold, decide, settle."""

    def __init__(self, runs: RunStore, tools: ToolBox, lifecycle: RunLifecycle) -> None:
        self.runs = runs
        self.tools = tools
        self.lifecycle = lifecycle

    async def hold(
        self, state: RunState, message: Message, waiting: Sequence[ToolCallBlock]
    ) -> None:
        """Stop the run in WAITING_FOR_APPROVAL for ``waiting`` (calls of ``message``).

        Every call of the message becomes an interruption; those not waiting are approved
        by policy, so they run together with the others once all are decided.
        """
        calls = message.tool_calls
        state.interruptions = [
            Interruption(
                call_id=c.id,
                tool=c.name,
                arguments=c.arguments,
                agent=state.agent,
                message=message.to_dict(),
                prompt=self.tools.approval_prompt(c.name),
            )
            for c in calls
        ]
        waiting_ids = {c.id for c in waiting}
        for call in calls:
            if call.id not in waiting_ids:
                record_decision(state, call.id, approved=True, decided_by="policy")
        self.lifecycle.move(state, AgentStatus.WAITING_FOR_APPROVAL)
        # Each call is announced once, here: its result or error follows when it is
        # released (``awaiting_approval``: whether it waits for a human decision).
        for call in calls:
            info: dict[str, Any] = {"tool": call.name, "call_id": call.id}
            info["awaiting_approval"] = call.id in waiting_ids
            await self.lifecycle.publish(state, "tool", "call_start", info)

    async def settle(
        self, state: RunState, context: Any, *, ahead: bool = False
    ) -> list[Message] | None:
        """Apply the decisions: run the approved calls, turn rejections into results
        (``ahead``: their events go with the checkpoint, as `ToolBox.run` says).

        Returns the held message and its results in call order (the run is RUNNING
        again), or None while some call still has no decision (nothing changes).
        """
        settled = settle(state)
        if settled.pending:
            return None
        wait_spans(state)  # each wait ended at its decision, under the step that held it
        message = Message.model_validate(state.interruptions[0].message)
        approved = {c.call_id for c in settled.approved}
        edits = settled.edits
        calls = [
            c.model_copy(update={"arguments": edits[c.id]}) if c.id in edits else c
            for c in message.tool_calls
            if c.id in approved
        ]
        # The status change comes before the tool events it releases.
        self.lifecycle.move(state, AgentStatus.RUNNING)
        await self.lifecycle.flush()
        ran = await self.tools.run(state, context, calls, announced=True, ahead=ahead)
        results = {r.tool_results[0].tool_call_id: r for r in ran}
        by = {d.call_id: d.decided_by for d in state.decisions if d.edited_arguments}
        for made in message.tool_calls:
            if made.id in edits:
                results[made.id] = _edited(results[made.id], made, edits[made.id], by.get(made.id))
        for call, reason in settled.rejected:
            # It did not run: listed in the tool counts, but not counted up.
            state.tool_use[call.tool] = state.tool_use.get(call.tool, 0)
            results[call.call_id] = Message.tool_result(
                call.call_id, f"Tool call rejected: {reason}", is_error=True
            )
            payload = {"tool": call.tool, "call_id": call.call_id, "rejected": reason}
            await self.lifecycle.publish(state, "tool", "error", payload, ahead=ahead)
        state.settled_decisions = [*state.settled_decisions, *settled_record(state)]
        handled = {i.call_id for i in state.interruptions}
        state.interruptions = []
        state.decisions = [d for d in state.decisions if d.call_id not in handled]
        return [message, *(results[c.id] for c in message.tool_calls)]

    async def decide(
        self,
        run_id: str,
        call_id: str,
        *,
        approved: bool,
        always: bool = False,
        reason: str | None = None,
        by: str | None = None,
        arguments: str | Mapping[str, Any] | None = None,
    ) -> RunState:
        """Record a decision on a waiting run's call and save it (compare-and-set): one
        ``statekeeper.approval`` span in the run's trace when traced (`decision_span`).
        ``arguments``: an approval's edited arguments (`record_decision`)."""
        with decision_span(run_id, call_id, approved=approved, by=by) as trace:
            state, index_version, session_version = await self.runs.load(run_id)
            if trace is not None:
                trace.adopt(state)
            if state.status != AgentStatus.WAITING_FOR_APPROVAL:
                raise InvalidInputError(f"run {run_id} is {state.status}, not waiting for approval")
            record_decision(
                state,
                call_id,
                approved=approved,
                always=always,
                reason=reason,
                decided_by=by,
                arguments=arguments,
            )
            saved = await self.runs.save(
                state, index_version=index_version, session_version=session_version
            )
            return saved.state
