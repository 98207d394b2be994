"""Event bus types and validation: what a run event is, and which events are valid.

Pure (no I/O): the streams and their kinds, `check_event`, the `BusEvent` a subscriber
gets, the `RunSnapshot` folded from a run's events, and the bus's errors. The bus itself
is in `statekeeper.runtime.events`, subscriptions in `statekeeper.runtime.subscriptions`.

Built-in streams (another kind on these raises `UnknownEventKindError`; other stream
names are custom and take any kind)::

    lifecycle   start, end, abort, status     status needs payload["status"]: str
    tool        call_start, result, error     needs payload["tool"]: str
    assistant   partial, complete             needs payload["text"]: str (complete:
                                              or payload["id"], a message's entry id)
    error       error                         needs payload["message"]: str
    compaction  start, complete
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from statekeeper.errors import InvalidInputError, InvalidPayloadError, StatekeeperError

__all__ = [
    "STREAM_KINDS",
    "BusEvent",
    "RunSnapshot",
    "SubscriberLaggedError",
    "UnknownEventKindError",
    "WaitTimeoutError",
    "check_event",
]

STREAM_KINDS: Final[Mapping[str, frozenset[str]]] = {
    "lifecycle": frozenset({"start", "end", "abort", "status"}),
    "tool": frozenset({"call_start", "result", "error"}),
    "assistant": frozenset({"partial", "complete"}),
    "error": frozenset({"error"}),
    "compaction": frozenset({"start", "complete"}),
}
_NEEDS: Final = {"tool": "tool", "assistant": "text", "error": "message", "lifecycle": None}
_RULES: Final = {
    (stream, kind): "status" if kind == "status" else _NEEDS.get(stream)
    for stream, kinds in STREAM_KINDS.items()
    for kind in kinds
}
_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
_TERMINAL: Final = frozenset({"end", "abort"})


class UnknownEventKindError(InvalidInputError):
    """A kind that the named built-in stream does not have, or an invalid stream name."""


class SubscriberLaggedError(StatekeeperError):
    """A subscriber fell ``buffer`` events behind and was detached, after delivering
    what it held. ``last_seq``: the last seq a run subscriber delivered; ``positions``:
    run id -> seq after which events were dropped (resubscribe there with ``from_seq``).
    An all-runs subscriber also misses later events of any run: resubscribe each run
    of interest from the last seq its consumer saw.
    """

    def __init__(self, run_id: str | None, last_seq: int | None, positions: dict[str, int]):
        super().__init__(
            f"subscriber to {f'run {run_id!r}' if run_id else 'all runs'} fell behind its "
            f"buffer and was detached; resubscribe with from_seq (dropped after: {positions})"
        )
        self.run_id, self.last_seq, self.positions = run_id, last_seq, positions


class WaitTimeoutError(StatekeeperError, TimeoutError):
    """No matching event arrived before the timeout."""


@dataclass(frozen=True, slots=True)
class BusEvent:
    """One event of a run. Treat ``payload`` as read-only: subscribers share it."""

    run_id: str
    seq: int
    stream: str
    kind: str
    ts: datetime
    payload: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """JSON data for a wire (the UI stream)."""
        return {name: getattr(self, name) for name in self.__slots__} | {"ts": self.ts.isoformat()}

    @property
    def terminal(self) -> bool:
        """True for lifecycle end or abort: the run is over."""
        return self.stream == "lifecycle" and self.kind in _TERMINAL


@dataclass(slots=True)
class RunSnapshot:
    """What the events of a run say so far (for wait/poll without reading the log)."""

    run_id: str
    last_seq: int = 0
    status: str | None = None
    """"running" after start, payload["status"] of status/end events, "aborted" on abort."""
    ended: bool = False
    updated_at: datetime | None = None
    last_assistant: str | None = None
    """The text of the last ``assistant/complete`` event; None when it names its message
    by ``id`` instead (the runner's do: the text is in the session's entry of that id)."""
    last_error: str | None = None
    last_by_stream: dict[str, BusEvent] = field(default_factory=dict)

    def apply(self, event: BusEvent) -> None:
        """Fold in the next event."""
        self.last_seq, self.updated_at = event.seq, event.ts
        self.last_by_stream[event.stream] = event
        payload = event.payload
        if event.stream == "lifecycle":
            if event.kind == "start":
                self.status = str(payload.get("status", "running"))
            elif event.kind in ("status", "end"):
                self.status = str(payload.get("status", "completed"))
            elif event.kind == "abort":
                self.status = "aborted"
            self.ended = self.ended or event.kind in _TERMINAL
        elif event.stream == "assistant" and event.kind == "complete":
            self.last_assistant = payload.get("text")
        elif event.stream == "error":
            self.last_error = payload["message"]


def check_event(stream: str, kind: str, payload: Mapping[str, Any]) -> None:
    """Raise a typed error unless ``stream``, ``kind`` and ``payload`` make a valid event."""
    try:
        key = _RULES[stream, kind]
    except (KeyError, TypeError):
        if (kinds := STREAM_KINDS.get(stream) if isinstance(stream, str) else None) is not None:
            raise UnknownEventKindError(
                f"stream {stream!r} has no kind {kind!r}; use one of {', '.join(sorted(kinds))}"
            ) from None
        for what, name in (("stream", stream), ("event kind", kind)):
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise UnknownEventKindError(
                    f"invalid {what} {name!r}: use [a-z][a-z0-9_.-]*"
                ) from None
        key = None
    if not isinstance(payload, Mapping):
        raise InvalidPayloadError(f"an event payload must be a JSON object, not {type(payload)}")
    if key == "text" and kind == "complete" and isinstance(payload.get("id"), str):
        return  # the text is in the message of that id
    if key is not None and not isinstance(payload.get(key), str):
        raise InvalidPayloadError(f"{stream}/{kind} events need payload[{key!r}] as a string")
