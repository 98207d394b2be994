"""`ToolBox`: runs the tool calls an agent makes and turns each into its result message.

Every call gets exactly one result message, whatever happens, so the transcript never
has a call without its result. The outcomes, and the ``tool`` events published for them
(after ``call_start``):

    outcome                                result text                       event
    ran                                    the output (JSON text if not str) result
    no tool of that name                   error: no tool named ...           error
    arguments not a JSON object            error: invalid arguments: ...      error
    tool input guardrail triggered         blocked by guardrail <name>        error
    the tool raised                        error: <Type>: <message>           error
    tool output guardrail triggered        blocked by guardrail <name>        error
    the output is not JSON                 error: ... not JSON ...            error

Result messages of failed calls have ``is_error`` set. ``RunState.tool_use`` counts every
call by tool name, failed ones included.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.runs.agent import Tool, ToolContext
from statekeeper.runs.guardrails import check_tool_guardrail
from statekeeper.runs.lifecycle import RunLifecycle
from statekeeper.runs.spans import failed, tool_span
from statekeeper.runs.state import GuardrailResult, RunState

__all__ = ["ToolBox", "parse_arguments"]


def parse_arguments(call: ToolCallBlock) -> dict[str, Any]:
    """The call's arguments as a dict; `ValueError` saying why when they are not a JSON
    object (an empty string means no arguments)."""
    arguments = json.loads(call.arguments or "{}")
    if not isinstance(arguments, dict):
        raise ValueError(f"arguments must be a JSON object, not {type(arguments).__name__}")
    return arguments


class _Failed(Exception):
    """A call that produced no output: its result text, the event's error, and the
    span's ``error.type`` (an exception's type name, or what went wrong)."""

    def __init__(self, text: str, error: str, error_type: str, **details: Any) -> None:
        super().__init__(text)
        self.text, self.error, self.error_type, self.details = text, error, error_type, details


class ToolBox:
    """The tools a runner offers its agents, by name."""

    def __init__(self, tools: Iterable[Tool], lifecycle: RunLifecycle) -> None:
        self._tools = {t.name: t for t in tools}
        self.lifecycle = lifecycle

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The tools by name (read-only)."""
        return MappingProxyType(self._tools)

    def needs_approval(self, state: RunState, call: ToolCallBlock) -> bool:
        """Whether ``call`` must wait for a human decision before it runs.

        Calls that cannot run (no such tool, bad arguments) never wait: they fail at once.
        An always-approve rule for the tool lets its calls through.
        """
        tool = self._tools.get(call.name)
        if tool is None or state.always.get(call.name) is True:
            return False
        try:
            arguments = parse_arguments(call)
        except ValueError:
            return False
        return tool.needs_approval(arguments)

    def approval_prompt(self, name: str) -> str | None:
        """What to show the human deciding a call of tool ``name``."""
        tool = self._tools.get(name)
        return tool.approval_prompt if tool else None

    async def run(
        self,
        state: RunState,
        context: Any,
        calls: Sequence[ToolCallBlock],
        *,
        announced: bool = False,
        ahead: bool = False,
    ) -> list[Message]:
        """Run ``calls`` in order; one result message per call, in the same order.

        ``announced``: their ``call_start`` was published already (when they were held
        for approval), so it is not published again. ``ahead``: the events reach this
        process's subscribers at once and are logged with the step's checkpoint (no
        write of their own: `RunLifecycle.publish`)."""
        out: list[Message] = []
        for call in calls:
            state.tool_use[call.name] = state.tool_use.get(call.name, 0) + 1
            # The step is the event's turn (and trace): no span name repeated in each.
            info = {"call_id": call.id, "tool": call.name}
            with tool_span(call) as span:
                if not announced:
                    await self.lifecycle.publish(state, "tool", "call_start", info, ahead=ahead)
                out.append(await self._result(state, context, call, info, span, ahead))
        return out

    async def _result(
        self,
        state: RunState,
        context: Any,
        call: ToolCallBlock,
        info: dict[str, Any],
        span: Any,
        ahead: bool,
    ) -> Message:
        """Run one call and publish its outcome; its result message (which the
        ``tool/result`` event names: the output is in it, not repeated in the event)."""
        try:
            text = await self._call(state, context, call)
        except _Failed as error:
            failed(span, error.error_type, error.error)
            payload = {**info, "error": error.error, **error.details}
            await self.lifecycle.publish(state, "tool", "error", payload, ahead=ahead)
            return Message.tool_result(call.id, error.text, is_error=True)
        message = Message.tool_result(call.id, text)
        payload = {**info, "message": message.id}
        await self.lifecycle.publish(state, "tool", "result", payload, ahead=ahead)
        return message

    async def _call(self, state: RunState, context: Any, call: ToolCallBlock) -> str:
        """The output text of ``call``; `_Failed` when it produced none."""
        tool = self._tools.get(call.name)
        if tool is None:
            raise _Failed(f"error: no tool named {call.name!r}", "unknown tool", "unknown_tool")
        try:
            arguments = parse_arguments(call)
        except ValueError as exc:
            raise _Failed(
                f"error: invalid arguments: {exc}", str(exc), "invalid_arguments"
            ) from None
        _guard(state, tool.input_guardrail, arguments, "tool_input")
        try:
            result = await tool.fn(arguments, ToolContext(state, call.id, context))
        except Exception as exc:
            name = type(exc).__name__
            raise _Failed(f"error: {name}: {exc}", repr(exc), name) from None
        _guard(state, tool.output_guardrail, result, "tool_output")
        if isinstance(result, str):
            return result
        try:
            return json.dumps(result, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            # The tool has run; its output just cannot be stored. Say so, never crash the run.
            text = f"error: the tool's output is not JSON ({type(result).__name__}): {exc}"
            raise _Failed(text, "output is not JSON", "output_not_json") from None


def _guard(
    state: RunState,
    check: Callable[[Any], GuardrailResult | None] | None,
    value: Any,
    kind: Literal["tool_input", "tool_output"],
) -> None:
    blocked = check_tool_guardrail(state, check, value, kind)
    if blocked is not None:
        raise _Failed(
            f"blocked by guardrail {blocked.name}",
            f"blocked by guardrail {blocked.name}",
            "guardrail",
            guardrail=blocked.name,
            kind=kind,
        )
