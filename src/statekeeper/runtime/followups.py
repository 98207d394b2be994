"""The follow-up queue: messages that arrive for a session while a run is active.

Each follow-up has a mode (per message, else per session, else the queue's default):

- ``steer``: the message is for the run in progress. The runner calls
  `FollowupQueue.take_steering` at its next step and adds what it gets to the run.
- ``queue``: the message waits for the run to end, then becomes a run of its own.

A follow-up for an idle session (no active run, nothing draining) starts a run at once,
whatever its mode: a steer with nothing to steer is simply the next run. When a run ends
(`FollowupQueue.mark_idle`, or a run the queue started returns) the pending follow-ups go,
one at a time and in arrival order, to the ``start_run`` callback, each after the previous
run finished; steering the run did not take drains the same way, so none is lost. A failed
run is reported to ``on_error`` and the drain goes on.

Admission, in this order: a message whose dedup key (its text, or a custom key) is already
pending for the session is dropped (``duplicate``); one within ``min_interval`` seconds of
the session's last accepted message is dropped (``too_fast``); with ``max_pending``
pending, policy ``oldest`` evicts the oldest, ``newest`` drops the new one
(``queue_full``), ``reject`` raises `FollowupQueueFullError`. Memory is bounded: at most
``max_pending`` messages per session, and state only for busy or recently active sessions.

Wiring with command lanes, so that runs of one session never overlap::

    followups = FollowupQueue(
        lambda sid, msg: lanes.run(f"session:{sid}", partial(run_agent, sid, msg)))
    outcome = await followups.submit(session_id, incoming)  # every inbound message

    async def run_agent(sid, msg):  # runs started elsewhere do the same
        with followups.active(sid, run_id):
            ...  # at each step: add followups.take_steering(sid) to the run's input

Modes, policies, outcomes and errors are in `statekeeper.runtime.followup_types`
(re-exported here); this module holds the behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from functools import partial

from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError
from statekeeper.ids import validate_id
from statekeeper.runtime.followup_types import (
    DropPolicy,
    DropReason,
    ErrorCallback,
    FollowupMode,
    FollowupQueueClosedError,
    FollowupQueueFullError,
    StartRun,
    SubmitOutcome,
    SubmitStatus,
    parse_choice,
)

__all__ = [
    "DropPolicy",
    "DropReason",
    "FollowupMode",
    "FollowupQueue",
    "FollowupQueueClosedError",
    "FollowupQueueFullError",
    "SubmitOutcome",
    "SubmitStatus",
]

_logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Item:
    message: Message
    mode: FollowupMode
    key: Hashable


class _Session:
    __slots__ = ("active_run", "drain", "keys", "pending")

    def __init__(self) -> None:
        self.pending: deque[_Item] = deque()
        self.keys: dict[Hashable, int] = {}  # dedup key -> how many pending items have it
        self.active_run: str | None = None
        self.drain: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self.active_run is not None or self.drain is not None

    def push(self, item: _Item) -> None:
        self.pending.append(item)
        self.keys[item.key] = self.keys.get(item.key, 0) + 1

    def forget(self, item: _Item) -> None:
        left = self.keys[item.key] - 1
        if left:
            self.keys[item.key] = left
        else:
            del self.keys[item.key]

    def pop(self) -> _Item:
        item = self.pending.popleft()
        self.forget(item)
        return item


def _text_key(message: Message) -> Hashable:
    if isinstance(message.content, str):
        return message.content
    return json.dumps([block.model_dump(mode="json") for block in message.content], sort_keys=True)


class FollowupQueue:
    """Steers or queues the messages that arrive while a session's run is active.

    Args:
        start_run: ``await start_run(session_id, message)`` runs the agent on a message;
            the queue calls it for idle sessions and to drain, one run per session at a time.
        mode: the default mode of sessions (`set_mode` per session, ``mode=`` per message).
        dedup: drop a message whose text is already pending for the session (True), or
            whose ``dedup(message)`` key is (a callable); False keeps duplicates.
        max_pending: the most follow-ups pending per session.
        min_interval: a message within this many seconds of the session's last accepted
            one is dropped (0: no limit).
        drop_policy: what to do when ``max_pending`` are pending (`DropPolicy`).
        on_error: told about a failed run started by the drain (default: logged).
        clock: monotonic time in seconds (tests pass a fake clock).
    """

    def __init__(
        self,
        start_run: StartRun,
        *,
        mode: FollowupMode | str = FollowupMode.QUEUE,
        dedup: bool | Callable[[Message], Hashable] = True,
        max_pending: int = 20,
        min_interval: float = 0.0,
        drop_policy: DropPolicy | str = DropPolicy.OLDEST,
        on_error: ErrorCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise InvalidInputError(f"max_pending must be an integer >= 1, got {max_pending!r}")
        if not min_interval >= 0:
            raise InvalidInputError(f"min_interval must be >= 0 seconds, got {min_interval!r}")
        self._start_run = start_run
        self._mode = parse_choice(FollowupMode, mode, "mode")
        self._key: Callable[[Message], Hashable] | None = (
            (_text_key if dedup else None) if isinstance(dedup, bool) else dedup
        )
        self._max_pending = max_pending
        self._min_interval = float(min_interval)
        self._policy = parse_choice(DropPolicy, drop_policy, "drop_policy")
        self._on_error = on_error
        self._clock = clock
        self._sessions: dict[str, _Session] = {}
        self._modes: dict[str, FollowupMode] = {}
        self._last_accepted: OrderedDict[str, float] = OrderedDict()  # oldest first
        self._closed = False

    # -- configuration and state ------------------------------------------------------------

    def set_mode(self, session_id: str, mode: FollowupMode | str | None) -> None:
        """Set the default mode of one session (None: back to the queue's default)."""
        validate_id(session_id, "session id")
        if mode is None:
            self._modes.pop(session_id, None)
        else:
            self._modes[session_id] = parse_choice(FollowupMode, mode, "mode")

    def mode(self, session_id: str) -> FollowupMode:
        """The default mode of a session."""
        return self._modes.get(session_id, self._mode)

    def mark_active(self, session_id: str, run_id: str) -> None:
        """Record that ``run_id`` is running on the session: follow-ups wait or steer it."""
        validate_id(run_id, "run id")
        self._session(validate_id(session_id, "session id")).active_run = run_id

    def mark_idle(self, session_id: str, run_id: str | None = None) -> None:
        """Record that the session's run ended, and drain its pending follow-ups.

        With ``run_id``, only if that run is the active one (a stale end changes nothing).
        """
        state = self._sessions.get(session_id)
        if state is None or (run_id is not None and state.active_run != run_id):
            return
        state.active_run = None
        if state.drain is None and state.pending:
            self._start_drain(session_id, state)
        self._forget_if_idle(session_id, state)

    @contextlib.contextmanager
    def active(self, session_id: str, run_id: str) -> Iterator[None]:
        """``with queue.active(sid, run_id):`` marks the run active, and idle on exit."""
        self.mark_active(session_id, run_id)
        try:
            yield
        finally:
            self.mark_idle(session_id, run_id)

    def active_run(self, session_id: str) -> str | None:
        """The run id given to `mark_active` for the session, if it is still active."""
        state = self._sessions.get(session_id)
        return None if state is None else state.active_run

    def is_busy(self, session_id: str) -> bool:
        """True while a run is active or the queue is draining for the session."""
        state = self._sessions.get(session_id)
        return state is not None and state.busy

    def pending(self, session_id: str) -> list[Message]:
        """The follow-ups pending for a session, oldest first."""
        state = self._sessions.get(session_id)
        return [] if state is None else [item.message for item in state.pending]

    def sessions(self) -> list[str]:
        """Sessions with state held: busy, or with follow-ups pending."""
        return list(self._sessions)

    # -- messages ---------------------------------------------------------------------------

    async def submit(
        self, session_id: str, message: Message, mode: FollowupMode | str | None = None
    ) -> SubmitOutcome:
        """Steer, queue, start a run with, or drop ``message``; say which and why.

        Raises:
            FollowupQueueFullError: ``max_pending`` reached and the policy is ``reject``.
            FollowupQueueClosedError: the queue is closed.
            InvalidInputError: a bad session id, message or mode.
        """
        if self._closed:
            raise FollowupQueueClosedError()
        validate_id(session_id, "session id")
        if not isinstance(message, Message):
            raise InvalidInputError(f"message must be a Message, got {type(message).__name__}")
        chosen = self.mode(session_id) if mode is None else parse_choice(FollowupMode, mode, "mode")
        state = self._sessions.get(session_id)
        key = self._key(message) if self._key is not None else object()
        reason: DropReason | None = None
        evicted: Message | None = None
        now = self._clock()
        if state is not None and key in state.keys:
            reason = DropReason.DUPLICATE
        elif self._min_interval and self._too_fast(session_id, now):
            reason = DropReason.TOO_FAST
        elif state is not None and len(state.pending) >= self._max_pending:
            if self._policy is DropPolicy.REJECT:
                raise FollowupQueueFullError(session_id, self._max_pending)
            if self._policy is DropPolicy.NEWEST:
                reason = DropReason.QUEUE_FULL
            else:
                evicted = state.pop().message
        if reason is not None:
            status = SubmitStatus.DEDUPLICATED if reason is DropReason.DUPLICATE else None
            pending = 0 if state is None else len(state.pending)
            return SubmitOutcome(
                status or SubmitStatus.DROPPED, session_id, message, chosen, reason, None, pending
            )
        if self._min_interval:
            self._last_accepted[session_id] = now
            self._last_accepted.move_to_end(session_id)
        state = self._session(session_id)
        state.push(_Item(message, chosen, key))
        if not state.busy:
            status = SubmitStatus.STARTED
            self._start_drain(session_id, state)
        elif chosen is FollowupMode.STEER:
            status = SubmitStatus.STEERED
        else:
            status = SubmitStatus.QUEUED
        return SubmitOutcome(status, session_id, message, chosen, None, evicted, len(state.pending))

    def take_steering(self, session_id: str) -> list[Message]:
        """Remove and return the steering messages pending for the session, oldest first.

        The active run calls this at each step and adds the messages to its input.
        """
        state = self._sessions.get(session_id)
        if state is None or not state.pending:
            return []
        taken: list[Message] = []
        kept: deque[_Item] = deque()
        for item in state.pending:
            if item.mode is FollowupMode.STEER:
                taken.append(item.message)
                state.forget(item)
            else:
                kept.append(item)
        state.pending = kept
        self._forget_if_idle(session_id, state)
        return taken

    def clear(self, session_id: str) -> list[Message]:
        """Drop and return every follow-up pending for the session (a run in progress goes on)."""
        state = self._sessions.get(session_id)
        if state is None:
            return []
        dropped = [item.message for item in state.pending]
        state.pending.clear()
        state.keys.clear()
        self._forget_if_idle(session_id, state)
        return dropped

    async def wait_drained(self, session_id: str | None = None) -> None:
        """Wait until the queue has no run in progress for the session (or for any session).

        Follow-ups still waiting behind a run marked active with `mark_active` are not
        waited for: they drain when `mark_idle` is called.
        """
        while drains := [
            state.drain
            for sid, state in self._sessions.items()
            if state.drain is not None and not state.drain.done() and session_id in (None, sid)
        ]:
            await asyncio.wait(drains)

    async def close(self, *, cancel: bool = False) -> None:
        """Refuse new messages, then wait until the queue's drains end.

        Accepted follow-ups still run: those behind a run marked active elsewhere when that
        run ends. With ``cancel=True`` they are dropped and the queue's runs are cancelled.
        """
        self._closed = True
        if cancel:
            for session_id in list(self._sessions):
                self.clear(session_id)
            for state in self._sessions.values():
                if state.drain is not None:
                    state.drain.cancel()
        await self.wait_drained()

    # -- internals --------------------------------------------------------------------------

    def _session(self, session_id: str) -> _Session:
        state = self._sessions.get(session_id)
        if state is None:
            state = self._sessions[session_id] = _Session()
        return state

    def _forget_if_idle(self, session_id: str, state: _Session) -> None:
        if not state.busy and not state.pending and self._sessions.get(session_id) is state:
            del self._sessions[session_id]

    def _too_fast(self, session_id: str, now: float) -> bool:
        recent = self._last_accepted
        horizon = now - self._min_interval
        while recent and next(iter(recent.values())) <= horizon:
            recent.popitem(last=False)
        return session_id in recent

    def _start_drain(self, session_id: str, state: _Session) -> None:
        drain = asyncio.get_running_loop().create_task(
            self._drain(session_id, state), name=f"statekeeper-followups:{session_id}"
        )
        drain.add_done_callback(partial(self._drain_done, session_id, state))
        state.drain = drain

    def _drain_done(self, session_id: str, state: _Session, drain: asyncio.Task[None]) -> None:
        # A drain cancelled before its first step never ran its own clean-up.
        if state.drain is drain:
            state.drain = None
            self._forget_if_idle(session_id, state)

    async def _drain(self, session_id: str, state: _Session) -> None:
        try:
            while state.pending and state.active_run is None:
                message = state.pop().message
                try:
                    await self._start_run(session_id, message)
                except Exception as exc:
                    self._report(session_id, message, exc)
        finally:
            state.drain = None
            self._forget_if_idle(session_id, state)

    def _report(self, session_id: str, message: Message, exc: Exception) -> None:
        if self._on_error is None:
            _logger.error("follow-up run for session %r failed", session_id, exc_info=exc)
            return
        try:
            self._on_error(session_id, message, exc)
        except Exception:
            _logger.exception("the on_error callback of the follow-up queue failed")
