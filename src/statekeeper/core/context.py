"""Building the context window for the next model call. Pure: no I/O, never mutates input.

`build_context_window` chooses which messages fit a token budget:

1. SYSTEM messages are always kept, whole (if they alone exceed the budget they are
   still kept and ``over_budget`` is set).
2. Then CONTEXT, then DIALOG, then SYSTEM_OUTPUT messages, each category newest first.
   A CONTEXT or SYSTEM_OUTPUT message that does not fit is skipped and older ones are
   still tried. DIALOG stops at the first message that does not fit, so the kept dialog
   is the most recent stretch of the conversation, never a scattering of old turns.
3. The result keeps the input order and holds new objects.

Tool calls and results stay paired, because a call without its result (or the reverse)
breaks every later model request:

* a message is only kept together with the messages holding the calls of its tool
  results, and with the messages holding the results of its tool calls;
* a result message needed only because its call is kept may be *elided*: its tool results
  keep their ``tool_call_id`` and ``is_error`` but their content becomes a short
  placeholder (other blocks are removed). It is elided only when that is cheaper, and it
  is restored in full later if the budget allows (SYSTEM_OUTPUT pass);
* a message that cannot be kept so (a result whose call is not in the input, or a call
  whose result message cannot be kept) is dropped, with the messages tied to it.

SYSTEM messages are kept whatever their tool blocks: if the input itself orphans a call or
result held by a SYSTEM message, that pairing cannot be repaired here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from statekeeper.core.messages import (
    ContentBlock,
    Message,
    MessageCategory,
    ToolCallBlock,
    ToolResultBlock,
)
from statekeeper.core.tokens import TokenCounter, message_tokens
from statekeeper.errors import InvalidInputError

__all__ = ["ELIDED_PLACEHOLDER", "ContextWindow", "build_context_window"]

ELIDED_PLACEHOLDER = "[output omitted to fit the context window]"
"""The content an elided tool result gets instead of its output."""


@dataclass(frozen=True)
class ContextWindow:
    """The messages to send to the model, and what was left out.

    ``messages`` are in input order; ``tokens`` is their total; ``dropped`` and ``elided``
    hold the ids of the messages left out and of those whose tool output was replaced by
    a placeholder; ``over_budget`` is True when the SYSTEM messages (with the tool
    messages paired with them) alone exceed the usable budget.
    """

    messages: list[Message]
    tokens: int
    dropped: list[str]
    elided: list[str]
    over_budget: bool


class _Mode(IntEnum):
    ELIDED = 1
    FULL = 2


def _elide(message: Message, placeholder: str) -> Message:
    blocks: list[ContentBlock] = [
        ToolResultBlock(tool_call_id=r.tool_call_id, content=placeholder, is_error=r.is_error)
        for r in message.tool_results
    ]
    return message.model_copy(update={"content": blocks, "tokens": None}, deep=True)


class _Packer:
    """Greedy packing state: which messages are kept, how, and at what cost."""

    def __init__(
        self,
        messages: Sequence[Message],
        usable: int,
        counter: TokenCounter | None,
        placeholder: str,
    ) -> None:
        self.messages = messages
        self.usable = usable
        self.calls = [{b.id for b in m.blocks if isinstance(b, ToolCallBlock)} for m in messages]
        self.results = [{r.tool_call_id for r in m.tool_results} for m in messages]
        self.owners: dict[str, list[int]] = defaultdict(list)  # call id -> messages calling
        self.holders: dict[str, list[int]] = defaultdict(list)  # call id -> result messages
        for i in range(len(messages)):
            for call_id in self.calls[i]:
                self.owners[call_id].append(i)
            for call_id in self.results[i]:
                self.holders[call_id].append(i)
        self.full = [message_tokens(m, counter) for m in messages]
        self.elided: dict[int, tuple[Message, int]] = {}
        for i, message in enumerate(messages):
            if message.category is MessageCategory.SYSTEM or self.calls[i] or not self.results[i]:
                continue  # only tool results can be elided, never in SYSTEM messages
            short = _elide(message, placeholder)
            cost = message_tokens(short, counter)
            if cost < self.full[i]:
                self.elided[i] = (short, cost)
        self.mode: dict[int, _Mode] = {}
        self.closed: set[int] = set()  # decided: left out for good
        self.used = 0

    def cost(self, i: int, mode: _Mode) -> int:
        return self.elided[i][1] if mode is _Mode.ELIDED else self.full[i]

    def closure(self, target: int, *, force: bool = False) -> dict[int, _Mode] | None:
        """What keeping ``target`` whole requires, or None if that would orphan a tool block."""
        need: dict[int, _Mode] = {}
        stack = [(target, _Mode.FULL)]
        while stack:
            i, mode = stack.pop()
            if max(need.get(i, 0), self.mode.get(i, 0)) >= mode:
                continue
            if not force and i not in self.mode:
                orphan = any(c not in self.owners for c in self.results[i])
                if orphan or i in self.closed:
                    return None
            need[i] = mode
            for call_id in self.results[i]:
                stack.extend((owner, _Mode.FULL) for owner in self.owners[call_id])
            if mode is _Mode.FULL:
                for call_id in self.calls[i]:
                    stack.extend(
                        (h, _Mode.ELIDED if h in self.elided else _Mode.FULL)
                        for h in self.holders[call_id]
                    )
        return need

    def add(self, need: dict[int, _Mode], *, force: bool = False) -> bool:
        """Keep ``need`` if it fits (or ``force``); say whether it was kept."""
        delta = sum(
            self.cost(i, mode) - (self.cost(i, self.mode[i]) if i in self.mode else 0)
            for i, mode in need.items()
        )
        if not force and self.used + delta > self.usable:
            return False
        self.mode.update(need)
        self.used += delta
        return True

    def pack(self) -> None:
        indexes = range(len(self.messages))
        for i in indexes:
            if self.messages[i].category is MessageCategory.SYSTEM:
                need = self.closure(i, force=True)
                assert need is not None  # a forced closure always exists
                self.add(need, force=True)
        for category in (
            MessageCategory.CONTEXT,
            MessageCategory.DIALOG,
            MessageCategory.SYSTEM_OUTPUT,
        ):
            for i in reversed(indexes):
                if self.messages[i].category is not category or self.mode.get(i) is _Mode.FULL:
                    continue
                need = self.closure(i)
                if need is None:
                    continue  # cannot be kept without orphaning a tool call or result
                kept_before = i in self.mode
                if not self.add(need) and category is MessageCategory.DIALOG and not kept_before:
                    break
            self.closed.update(
                i for i in indexes if i not in self.mode and self.messages[i].category <= category
            )

    def window(self) -> ContextWindow:
        messages: list[Message] = []
        dropped: list[str] = []
        elided: list[str] = []
        for i, message in enumerate(self.messages):
            mode = self.mode.get(i)
            if mode is None:
                dropped.append(message.id)
            elif mode is _Mode.ELIDED:
                messages.append(self.elided[i][0])  # already a fresh deep copy
                elided.append(message.id)
            else:
                messages.append(message.model_copy(deep=True))
        tokens = sum(self.cost(i, mode) for i, mode in self.mode.items())
        return ContextWindow(messages, tokens, dropped, elided, tokens > self.usable)


def build_context_window(
    messages: Sequence[Message],
    budget: int,
    *,
    counter: TokenCounter | None = None,
    reserve: int = 0,
    placeholder: str = ELIDED_PLACEHOLDER,
) -> ContextWindow:
    """Choose the messages for the next model call within ``budget - reserve`` tokens.

    Args:
        messages: the conversation, oldest first. It is not changed.
        budget: the model's context size in tokens (or the share of it for messages).
        counter: counts messages without a measured ``tokens``; `DEFAULT_COUNTER` if None.
        reserve: tokens kept free, e.g. for the model's answer or tool definitions.
        placeholder: the content of elided tool results.

    Raises:
        InvalidInputError: a negative budget or reserve, a reserve above the budget, or an
            item that is not a `Message`.

    See the module docstring for the rules.
    """
    for name, value in (("budget", budget), ("reserve", reserve)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInputError(f"{name} must be an int >= 0, got {value!r}")
    if reserve > budget:
        raise InvalidInputError(f"reserve ({reserve}) is larger than the budget ({budget})")
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise InvalidInputError(f"message {index} is a {type(message).__name__}, not a Message")
    packer = _Packer(messages, budget - reserve, counter, placeholder)
    packer.pack()
    return packer.window()
