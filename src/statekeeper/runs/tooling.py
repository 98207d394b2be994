"""The runner's tool and approval steps: running tool calls, holding calls that need
a decision, settling decisions (fail closed), and guardrails. A mixin of `Runner`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.errors import InvalidPayloadError, StatekeeperError
from statekeeper.runs.agent import Respond, Tool, ToolContext
from statekeeper.runs.approvals import record_decision, settle
from statekeeper.runs.state import GuardrailResult, Interruption, RunState
from statekeeper.runs.writer import CheckpointWriter

__all__ = ["GuardrailTripped", "Live", "ToolSteps"]


@dataclass
class Live:
    """What a driving runner holds besides the state: never persisted as is."""

    state: RunState
    writer: CheckpointWriter
    messages: list[Message]
    context: Any
    new_input: list[Message] = field(default_factory=list)
    added: list[Message] = field(default_factory=list)
    seen_seq: int = 0


class GuardrailTripped(StatekeeperError):
    """An input or output guardrail stopped the run."""


class ToolSteps(ABC):
    """Tool calls, approvals and guardrails of a run (mixed into `Runner`)."""

    tools: dict[str, Tool]
    input_guardrails: list[Any]
    output_guardrails: list[Any]

    @abstractmethod
    async def _publish(
        self, state: RunState, stream: str, kind: str, payload: dict[str, Any]
    ) -> None: ...

    @abstractmethod
    async def _commit(self, live: Live, messages: list[Message]) -> None: ...

    @abstractmethod
    def _move(self, state: RunState, target: str) -> None: ...

    async def _respond(self, live: Live, action: Respond) -> list[Message]:
        state = live.state
        messages = list(action.messages)
        with_calls = [i for i, m in enumerate(messages) if m.tool_calls]
        if not with_calls:
            return messages
        if with_calls != [len(messages) - 1]:
            raise InvalidPayloadError("put tool calls only in the last message of a Respond action")
        call_message = messages[-1]
        calls = call_message.tool_calls
        waiting = [c for c in calls if self._needs_approval(state, c)]
        if not waiting:
            return [*messages, *await self._run_tools(live, calls)]
        # Hold the call message until every decision is in: it is written together with
        # the results, so the transcript never has a call without its result.
        state.interruptions = [
            Interruption(
                call_id=c.id,
                tool=c.name,
                arguments=c.arguments,
                agent=state.agent,
                message=call_message.to_dict(),
                prompt=self.tools[c.name].approval_prompt if c.name in self.tools else None,
            )
            for c in calls
        ]
        for call in calls:
            if call not in waiting:
                record_decision(state, call.id, approved=True, decided_by="policy")
        self._move(state, AgentStatus.WAITING_FOR_APPROVAL)
        for call in waiting:
            await self._publish(
                state,
                "tool",
                "call_start",
                {"tool": call.name, "call_id": call.id, "awaiting_approval": True},
            )
        return messages[:-1]

    async def _settle_approvals(self, live: Live) -> bool:
        """Apply decisions; False if some call still waits for one."""
        state = live.state
        settled = settle(state)
        if settled.pending:
            return False
        message = Message.model_validate(state.interruptions[0].message)
        approved = {c.call_id for c in settled.approved}
        calls = [c for c in message.tool_calls if c.id in approved]
        results = {r.tool_results[0].tool_call_id: r for r in await self._run_tools(live, calls)}
        for call, reason in settled.rejected:
            state.tool_use[call.tool] = state.tool_use.get(call.tool, 0)
            results[call.call_id] = Message.tool_result(
                call.call_id, f"Tool call rejected: {reason}", is_error=True
            )
            await self._publish(
                state,
                "tool",
                "error",
                {"tool": call.tool, "call_id": call.call_id, "rejected": reason},
            )
        ordered = [results[c.id] for c in message.tool_calls]
        handled = {i.call_id for i in state.interruptions}
        state.interruptions = []
        state.decisions = [d for d in state.decisions if d.call_id not in handled]
        self._move(state, AgentStatus.RUNNING)
        await self._commit(live, [message, *ordered])
        return True

    async def _run_tools(self, live: Live, calls: Sequence[ToolCallBlock]) -> list[Message]:
        state = live.state
        out: list[Message] = []
        for call in calls:
            state.tool_use[call.name] = state.tool_use.get(call.name, 0) + 1
            text, is_error = await self._call_tool(live, call)
            out.append(Message.tool_result(call.id, text, is_error=is_error))
        return out

    async def _call_tool(self, live: Live, call: ToolCallBlock) -> tuple[str, bool]:
        state = live.state
        tool = self.tools.get(call.name)
        info = {"call_id": call.id, "tool": call.name, "span": state.trace.current_span}
        await self._publish(state, "tool", "call_start", info)
        if tool is None:
            await self._publish(state, "tool", "error", {**info, "error": "unknown tool"})
            return f"error: no tool named {call.name!r}", True
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            await self._publish(state, "tool", "error", {**info, "error": str(exc)})
            return f"error: invalid arguments: {exc}", True
        for check, value, kind in ((tool.input_guardrail, arguments, "tool_input"),):
            blocked = self._guard(state, check, value, kind)
            if blocked:
                return blocked, True
        try:
            result = await tool.fn(arguments, ToolContext(state, call.id, live.context))
        except Exception as exc:
            await self._publish(state, "tool", "error", {**info, "error": repr(exc)})
            return f"error: {type(exc).__name__}: {exc}", True
        blocked = self._guard(state, tool.output_guardrail, result, "tool_output")
        if blocked:
            return blocked, True
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        await self._publish(state, "tool", "result", {**info, "output": text[:2000]})
        return text, False

    def _guard(self, state: RunState, check: Any, value: Any, kind: str) -> str | None:
        if check is None:
            return None
        result: GuardrailResult | None = check(value)
        if result is None:
            return None
        result = result.model_copy(update={"kind": kind, "turn": state.turn})
        state.guardrails = [*state.guardrails, result]
        return f"blocked by guardrail {result.name}" if result.triggered else None

    async def _check_input(self, live: Live) -> None:
        state = live.state
        for check in self.input_guardrails:
            result = check(live.new_input)
            if result is not None:
                result = result.model_copy(update={"kind": "input", "turn": state.turn})
                state.guardrails = [*state.guardrails, result]
                if result.triggered:
                    raise GuardrailTripped(f"input guardrail {result.name} triggered")
        # Kept in the state until a step has seen it, so a pause in between loses nothing.
        live.state.pending_input = [
            *live.state.pending_input,
            *(m.to_dict() for m in live.new_input),
        ]
        await self._commit(live, list(live.new_input))
        live.new_input = []

    def _check_output(self, state: RunState, output: JsonValue) -> None:
        for check in self.output_guardrails:
            result = check(output)
            if result is not None:
                result = result.model_copy(update={"kind": "output", "turn": state.turn})
                state.guardrails = [*state.guardrails, result]
                if result.triggered:
                    raise GuardrailTripped(f"output guardrail {result.name} triggered")

    def _needs_approval(self, state: RunState, call: ToolCallBlock) -> bool:
        tool = self.tools.get(call.name)
        if tool is None or state.always.get(call.name) is True:
            return False
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return False  # the call fails on its bad arguments without running
        return tool.needs_approval(arguments if isinstance(arguments, dict) else {})
