"""What a run returns and where it reports: `RunResult`, the event sink, small helpers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from pydantic import JsonValue

from statekeeper.core.messages import Message
from statekeeper.runs.state import Interruption, RunState
from statekeeper.runtime.coordination import SessionLocks  # re-exported: one protocol

__all__ = [
    "EventSink",
    "ReadOnlyMessages",
    "RunResult",
    "SessionLocks",
    "as_messages",
]


class EventSink(Protocol):
    """Where the runner publishes run events (the event bus, or the store's event log)."""

    async def publish(
        self, run_id: str, stream: str, kind: str, payload: dict[str, Any]
    ) -> object: ...


@dataclass
class RunResult:
    """Where a run stopped: its state and the messages this call added."""

    state: RunState
    new_messages: list[Message] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        """The run's id (pass it to `Runner.resume`)."""
        return self.state.run_id

    @property
    def status(self) -> str:
        """The status the run stopped in."""
        return self.state.status

    @property
    def output(self) -> JsonValue:
        """The final output of a completed run."""
        return self.state.output

    @property
    def interruptions(self) -> list[Interruption]:
        """Tool calls waiting for a decision."""
        return list(self.state.interruptions)


class ReadOnlyMessages(Sequence[Message]):
    """A read-only view of the run's message list: O(1) to hand to an agent each step."""

    __slots__ = ("_items",)

    def __init__(self, items: list[Message]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self._items[index]


def as_messages(value: str | Message | Sequence[Message]) -> list[Message]:
    if isinstance(value, str):
        return [Message.user(value)]
    if isinstance(value, Message):
        return [value]
    return list(value)
