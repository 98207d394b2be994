"""Time travel: a run's checkpoint history, and forks of a run from any past checkpoint.

Every checkpoint a run wrote stays in its session's transcript (until pruned), so its
history is a read: `checkpoint_history` lists them, oldest first, with what each one
added to the conversation. `fork_run` starts a new run from any of them: the new run
gets a session *forked* from the run's session at that checkpoint's transcript position
(nothing is copied: the fork reads the shared history from its origin), and a copy of
the checkpoint's state, optionally edited. Resuming the new run replays the agent from
there; the original run and its session are never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import JsonValue

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
)
from statekeeper.ids import new_id, validate_id
from statekeeper.runs.lifecycle import FINISHED
from statekeeper.runs.recovery import (
    CheckpointReader,
    is_checkpoint_of,
    problem_of,
    revision_of,
)
from statekeeper.runs.state import RunState, TraceState
from statekeeper.sessions.manager import SessionManager
from statekeeper.stores.base import Entry

__all__ = ["FIXED_FIELDS", "CheckpointInfo", "checkpoint_history", "checkpoint_state", "fork_run"]

FIXED_FIELDS = frozenset(
    {"run_id", "session_id", "tenant", "revision", "schema_version", "transcript_seq", "items"}
)
"""Run state fields a fork's ``state_update`` cannot set (the fork's identity)."""


class RunWriter(CheckpointReader, Protocol):
    """What forking needs of a `RunStore` (which this module does not import)."""

    async def create(self, state: RunState) -> int: ...

    async def save(self, state: RunState, *, index_version: int | None) -> object: ...


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint of a run's history."""

    step: int
    """The checkpoint's number in the run (1 for the first): what ``fork(at=)`` takes."""
    id: str
    """Its entry id (``<run>.c<step>``)."""
    seq: int
    """Its position among the session's entries."""
    status: str
    """The run's status at the checkpoint ("corrupt" when it cannot be read)."""
    turn: int | None
    """Steps the agent had taken (None when corrupt)."""
    agent: str | None
    at: datetime
    """When it was written."""
    added: list[str]
    """Ids of the messages that joined the run's conversation since the checkpoint
    before: what this step (or the input it took) added."""
    cost: float = 0.0
    """The run's accumulated cost at the checkpoint."""
    corrupt: str | None = None
    """Why the checkpoint cannot be read, when it cannot."""

    @property
    def message_count(self) -> int:
        """How many messages the step added."""
        return len(self.added)

    def to_json(self) -> dict[str, Any]:
        """As the CLI's ``--json`` and the server answer it."""
        return {
            "step": self.step,
            "id": self.id,
            "seq": self.seq,
            "status": self.status,
            "turn": self.turn,
            "agent": self.agent,
            "at": self.at.isoformat(),
            "added": self.added,
            "message_count": self.message_count,
            "cost": self.cost,
            "corrupt": self.corrupt,
        }


async def checkpoint_history(runs: CheckpointReader, run_id: str) -> list[CheckpointInfo]:
    """See `RunStore.history`."""
    index, _ = await runs.index(run_id)
    entries = await runs.store.read_entries(runs.tenant, index.session_id)
    by_seq = {entry.seq: entry for entry in entries}
    at_seq = index.checkpoint_seq if index.revision else None
    out: list[CheckpointInfo] = []
    position: int | None = None  # the transcript position of the checkpoint before
    for entry in entries:
        if not is_checkpoint_of(entry, run_id, at_seq=at_seq):
            continue
        step = revision_of(entry.id, run_id) or 0
        state = problem_of(entry, run_id, lambda e: runs.decode(e, run_id))
        if not isinstance(state, RunState):
            out.append(
                CheckpointInfo(
                    step,
                    entry.id,
                    entry.seq,
                    "corrupt",
                    None,
                    None,
                    entry.created_at,
                    [],
                    corrupt=state,
                )
            )
            continue
        # A stored checkpoint holds the position before its own write: where the run
        # started, for the first one.
        since = state.transcript_seq if position is None else position
        position = entry.parent_seq or 0
        out.append(
            CheckpointInfo(
                step=step or state.revision,
                id=entry.id,
                seq=entry.seq,
                status=state.status,
                turn=state.turn,
                agent=state.agent,
                at=state.updated_at,
                added=_messages_between(by_seq, since, position),
                cost=state.metrics.accumulated_cost,
            )
        )
    return out


def _messages_between(by_seq: Mapping[int, Entry], since: int, until: int) -> list[str]:
    """Ids of the messages on the branch ending at ``until`` that are after ``since``."""
    found: list[str] = []
    seq: int | None = until
    while seq is not None and seq > since and (entry := by_seq.get(seq)) is not None:
        if entry.kind == "message":
            found.append(entry.id)
        seq = entry.parent_seq
    return found[::-1]


async def _checkpoint_at(
    runs: CheckpointReader,
    run_id: str,
    at: int | None,
    history: list[CheckpointInfo] | None = None,
) -> tuple[Entry, RunState]:
    """The checkpoint ``at`` of the run (None: its newest one that is not finished; a
    finished one is forked only when asked for by its step)."""
    if history is None:
        history = await checkpoint_history(runs, run_id)
    see = f"`statekeeper runs history {run_id}` (RunStore.history) lists its steps"
    if at is None:
        usable = [c for c in history if c.corrupt is None and c.status not in FINISHED]
        if not usable:
            raise NotFoundError(f"run {run_id!r} has no checkpoint that is not finished; {see}")
        at = usable[-1].step
    chosen = next((c for c in history if c.step == at), None)
    if chosen is None:
        steps = ", ".join(str(c.step) for c in history) or "none"
        raise NotFoundError(f"run {run_id!r} has no checkpoint {at} (it has: {steps}); {see}")
    if chosen.corrupt is not None:
        raise InvalidInputError(
            f"checkpoint {at} of run {run_id!r} is corrupt ({chosen.corrupt}); fork another "
            f"one: {see}"
        )
    index, _ = await runs.index(run_id)
    entry = await runs.store.get_entry(runs.tenant, index.session_id, chosen.id)
    return entry, runs.decode(entry, run_id)


def _forked_state(
    source: RunState, at: int, update: Mapping[str, Any] | None, *, run_id: str, session_id: str
) -> RunState:
    """The new run's state: the checkpoint's, under new ids, edited by ``update``."""
    fixed = sorted(FIXED_FIELDS & set(update or {}))
    if fixed:
        raise InvalidInputError(
            f"state_update cannot set {', '.join(fixed)}: a fork gets its own; set the "
            "other run state fields (metadata, limits, context, status ...)"
        )
    data = source.checkpoint_data()
    now = utcnow().isoformat()
    data.update(
        run_id=run_id,
        session_id=session_id,
        revision=0,
        transcript_seq=0,
        cancel_requested=False,
        trace=TraceState().model_dump(mode="json"),
        created_at=now,
        updated_at=now,
    )
    if data["status"] in (AgentStatus.RUNNING, AgentStatus.INITIALIZING):
        data["status"] = AgentStatus.PAUSED  # stopped, not crashed: nobody runs it yet
    elif data["status"] in FINISHED:
        # A finished run's checkpoint forks into a run that goes on from there with new
        # input (a follow-up question, or another try after an error): paused, with no
        # output or error of its own yet.
        data.update(status=AgentStatus.PAUSED, output=None, error=None)
        if isinstance(data["metadata"], dict):
            data["metadata"] = {k: v for k, v in data["metadata"].items() if k != "cancel_reason"}
    data.update(update or {})
    if isinstance(data["metadata"], dict):  # else validation says what is wrong
        origin: dict[str, JsonValue] = {"run_id": source.run_id, "step": at}
        data["metadata"] = {**data["metadata"], "forked_from": origin}
    try:
        return RunState.from_data(data)
    except InvalidPayloadError as exc:
        raise InvalidPayloadError(f"state_update makes {exc}") from exc


async def checkpoint_state(
    runs: CheckpointReader, run_id: str, step: int
) -> tuple[CheckpointInfo, RunState]:
    """The run's state as checkpoint ``step`` (a ``step`` of `checkpoint_history`) stored
    it: what to look at before forking from there. `NotFoundError` for an unknown step,
    `InvalidInputError` for a corrupt one."""
    history = await checkpoint_history(runs, run_id)
    _, state = await _checkpoint_at(runs, run_id, step, history)
    return next(c for c in history if c.step == step), state


async def fork_run(
    runs: RunWriter,
    run_id: str,
    *,
    at: int | None = None,
    state_update: Mapping[str, Any] | None = None,
    new_run_id: str | None = None,
    title: str | None = None,
) -> RunState:
    """See `RunStore.fork`."""
    entry, source = await _checkpoint_at(runs, run_id, at)
    step = revision_of(entry.id, run_id) or source.revision
    fork_id = validate_id(new_run_id, "run id") if new_run_id else new_id("run")
    try:
        await runs.index(fork_id)
    except NotFoundError:
        pass
    else:
        raise AlreadyExistsError(f"run {fork_id!r} already exists; pass another new_run_id")
    # Checked before anything is written: a refused update leaves nothing behind.
    _forked_state(source, step, state_update, run_id=fork_id, session_id=source.session_id)
    manager = SessionManager(runs.store, runs.tenant, max_messages=None)
    origin = await manager.get(source.session_id)
    session = await origin.fork(entry.parent_seq or 0, title=title)
    state = _forked_state(source, step, state_update, run_id=fork_id, session_id=session.id)
    index_version = await runs.create(state)
    await runs.save(state, index_version=index_version)
    return state
