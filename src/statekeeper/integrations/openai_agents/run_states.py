"""`RunStateStore`: the SDK's ``RunState`` kept in statekeeper while a run waits for a human.

When ``Runner.run`` stops with ``result.interruptions`` (tools with ``needs_approval``),
`RunStateStore.save` stores ``result.to_state().to_json()`` as one tenant-scoped JSON
record, with the pending calls (tool, arguments, agent) next to it. Any process with the
store can then list what waits (`pending`) and decide (`approve` / `reject`): it needs no
agent objects. The process that resumes calls `restore(run_id, agent)`, which rebuilds the
SDK's ``RunState`` (``RunState.from_json``) with the recorded decisions applied, and hands
the resumed run's result to `update` (saved again if it stopped again, deleted if done).

Decisions fail closed, as statekeeper's own approvals do (`statekeeper.runs.approvals`):
a decision names one call id and is applied only if the restored call has the same tool
and arguments (otherwise the call is rejected); a call with no decision stays pending and
the SDK stops for it again. Deciding a call the other way is a `ConflictError`.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

from agents import Agent, RunState
from agents.items import ToolApprovalItem

from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
    SchemaVersionError,
    StoreCorruptError,
)
from statekeeper.ids import new_id, validate_id
from statekeeper.stores.base import Store, VersionedRecord
from statekeeper.stores.types import CorruptItem

__all__ = ["NAMESPACE", "PendingApproval", "RunStateStore", "SavedRunList", "SavedRunState"]

_log = logging.getLogger(__name__)

NAMESPACE = "openai_agents.run_states"
"""Record namespace of the saved run states (one record per run id)."""
FORMAT = "statekeeper.openai-agents.run-state"
FORMAT_VERSION = 1
_CAS_ATTEMPTS = 20

Decision = Literal["approved", "rejected"]


@dataclass(frozen=True)
class PendingApproval:
    """One tool call a saved run waits on, as the model asked for it."""

    run_id: str
    call_id: str
    tool_name: str
    arguments: str
    """The arguments as the model gave them (JSON text); `parsed_arguments` decodes them."""
    agent: str
    session_id: str | None
    saved_at: datetime
    decision: Decision | None = None

    @property
    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (the raw text when they are not JSON)."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


@dataclass(frozen=True)
class SavedRunState:
    """A saved run: the SDK's ``to_json`` output, its calls and the decisions so far."""

    run_id: str
    agent: str
    session_id: str | None
    saved_at: datetime
    version: int
    state: dict[str, Any]
    calls: list[PendingApproval] = field(default_factory=list)
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def pending(self) -> list[PendingApproval]:
        """The calls nobody has decided yet."""
        return [call for call in self.calls if call.decision is None]


class SavedRunList(builtins.list[SavedRunState]):
    """What `RunStateStore.list` returns: the saved runs (a list), and ``corrupt``, the
    stored ones that cannot be read (`CorruptItem`: run id, the error naming the fix)."""

    def __init__(
        self, runs: Iterable[SavedRunState] = (), corrupt: Iterable[CorruptItem] = ()
    ) -> None:
        super().__init__(runs)
        self.corrupt: builtins.list[CorruptItem] = builtins.list(corrupt)

    @classmethod
    def of(cls, records: Iterable[VersionedRecord]) -> SavedRunList:
        """The saved runs of ``records``, the damaged ones (and the store's) reported."""
        runs: builtins.list[SavedRunState] = []
        corrupt = builtins.list(getattr(records, "corrupt", ()))
        for record in records:
            try:
                runs.append(_saved(record))
            except StoreCorruptError as exc:
                corrupt.append(CorruptItem(id=record.key, error=str(exc), raw=_raw(record)))
        return cls(runs, sorted(corrupt, key=lambda c: c.id))


class RunStateStore:
    """Saved SDK run states of one tenant, for approvals across processes."""

    def __init__(self, store: Store, *, tenant: str = "default") -> None:
        self.store = store
        self.tenant = validate_id(tenant, "tenant")

    async def save(
        self,
        run: Any,
        *,
        run_id: str | None = None,
        session_id: str | None = None,
        context_serializer: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> SavedRunState:
        """Save a run result (or ``RunState``) under ``run_id`` (a new id by default; an
        existing one is replaced, with its decisions). ``context_serializer`` is passed
        to ``to_json`` for a context that is not a mapping."""
        state = _run_state(run)
        if session_id is not None:
            validate_id(session_id, "session id")
        key = validate_id(run_id, "run id") if run_id is not None else new_id("run")
        snapshot = state.to_json(context_serializer=context_serializer)
        calls = [_call_json(item) for item in state.get_interruptions()]
        value: dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "agent": str(snapshot.get("current_agent", {}).get("name", "")),
            "session_id": session_id,
            "saved_at": datetime.now(UTC).isoformat(),
            "calls": calls,
            "decisions": {},
            "state": snapshot,
        }
        record = await self.store.put_record(
            self.tenant, NAMESPACE, key, value, expected_version=0 if run_id is None else None
        )
        return _saved(record)

    async def get(self, run_id: str) -> SavedRunState:
        """The saved run, or `NotFoundError`."""
        return _saved(await self._get(run_id))

    async def list(self, *, limit: int = 100, after: str | None = None) -> SavedRunList:
        """Saved runs in run-id order (page on with ``after`` = the last run id); a
        damaged one is reported in ``corrupt`` and the others are listed."""
        return SavedRunList.of(
            await self.store.list_records(self.tenant, NAMESPACE, after_key=after, limit=limit)
        )

    async def pending(self) -> builtins.list[PendingApproval]:
        """Every undecided tool call of every saved run of this tenant (a damaged saved
        run is logged and skipped: `list` reports it)."""
        out: builtins.list[PendingApproval] = []
        after: str | None = None
        while True:
            records = await self.store.list_records(
                self.tenant, NAMESPACE, after_key=after, limit=500
            )
            page = SavedRunList.of(records)
            for item in page.corrupt:
                _log.warning("skipping a saved run state: %s", item.error)
            out += [call for saved in page for call in saved.pending]
            if len(records) < 500:
                return out
            after = records[-1].key

    async def approve(
        self, run_id: str, call_id: str, *, always: bool = False, decided_by: str | None = None
    ) -> SavedRunState:
        """Approve one pending call (``always``: every later call of that tool by that agent)."""
        return await self._decide(run_id, call_id, "approved", always, None, decided_by)

    async def reject(
        self,
        run_id: str,
        call_id: str,
        *,
        message: str | None = None,
        always: bool = False,
        decided_by: str | None = None,
    ) -> SavedRunState:
        """Reject one pending call; ``message`` is what the model is told instead of a result."""
        return await self._decide(run_id, call_id, "rejected", always, message, decided_by)

    async def restore(
        self,
        run_id: str,
        agent: Agent[Any],
        *,
        context_override: Any = None,
        context_deserializer: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> RunState[Any, Agent[Any]]:
        """The SDK's ``RunState`` of the saved run, decisions applied: pass it to
        ``Runner.run(agent, state, ...)`` to resume."""
        saved = await self.get(run_id)
        state = await RunState.from_json(
            agent,
            json.loads(json.dumps(saved.state)),  # from_json may change what it is given
            context_override=context_override,
            context_deserializer=context_deserializer,
        )
        for item in state.get_interruptions():
            _apply(state, item, saved.decisions.get(item.call_id or ""))
        return state

    async def update(self, run_id: str, result: Any, **save: Any) -> SavedRunState | None:
        """Record what a resumed run came to: saved again (same id) when it stopped for
        approval again, deleted when it finished. Returns the saved run or None."""
        if getattr(result, "interruptions", None):
            saved = await self.get(run_id)
            save.setdefault("session_id", saved.session_id)
            return await self.save(result, run_id=run_id, **save)
        await self.delete(run_id)
        return None

    async def delete(self, run_id: str) -> None:
        """Delete a saved run (no error if there is none)."""
        key = validate_id(run_id, "run id")
        with contextlib.suppress(NotFoundError):
            await self.store.delete_record(self.tenant, NAMESPACE, key)

    # -- internals -------------------------------------------------------------------------

    async def _get(self, run_id: str) -> VersionedRecord:
        key = validate_id(run_id, "run id")
        try:
            return await self.store.get_record(self.tenant, NAMESPACE, key)
        except NotFoundError:
            raise NotFoundError(f"no saved run state {run_id!r} for this tenant") from None

    async def _decide(
        self,
        run_id: str,
        call_id: str,
        decision: Decision,
        always: bool,
        message: str | None,
        decided_by: str | None,
    ) -> SavedRunState:
        if not isinstance(call_id, str):
            raise InvalidInputError(f"call_id must be a string, got {type(call_id).__name__}")
        if not isinstance(always, bool):
            raise InvalidInputError(f"always must be True or False, got {always!r}")
        for name, text in (("message", message), ("decided_by", decided_by)):
            if text is not None and not isinstance(text, str):
                raise InvalidInputError(f"{name} must be a string, got {type(text).__name__}")
        for _ in range(_CAS_ATTEMPTS):
            record = await self._get(run_id)
            saved = _saved(record)
            call = _find_call(saved, call_id)
            earlier = saved.decisions.get(call_id)
            if earlier is not None:
                if earlier["decision"] != decision:
                    raise ConflictError(
                        f"tool call {call_id!r} of run {run_id!r} was already {earlier['decision']}"
                    )
                return saved
            value = dict(record.value) if isinstance(record.value, dict) else {}
            value["decisions"] = {
                **saved.decisions,
                call_id: {
                    "decision": decision,
                    "tool_name": call.tool_name,
                    "arguments": call.arguments,
                    "always": always,
                    "message": message,
                    "decided_by": decided_by,
                    "at": datetime.now(UTC).isoformat(),
                },
            }
            try:
                written = await self.store.put_record(
                    self.tenant, NAMESPACE, record.key, value, expected_version=record.version
                )
            except ConflictError:
                continue  # another approver wrote meanwhile: decide on what is there now
            return _saved(written)
        raise ConflictError(f"run {run_id!r} kept changing while deciding; retry the call")


def _run_state(run: Any) -> RunState[Any, Any]:
    if isinstance(run, RunState):
        return run
    to_state = getattr(run, "to_state", None)
    if callable(to_state):
        state = to_state()
        if isinstance(state, RunState):
            return state
    raise InvalidInputError(
        f"save takes a run result (Runner.run's) or a RunState, got {type(run).__name__}"
    )


def _call_json(item: ToolApprovalItem) -> dict[str, Any]:
    call_id = item.call_id
    if not call_id:
        raise InvalidPayloadError(f"an interruption of tool {item.name!r} has no call id")
    return {
        "call_id": call_id,
        "tool_name": item.name or "",
        "arguments": item.arguments or "",
        "agent": item.agent.name,
    }


def _find_call(saved: SavedRunState, call_id: str) -> PendingApproval:
    for call in saved.calls:
        if call.call_id == call_id:
            return call
    waiting = ", ".join(call.call_id for call in saved.calls) or "none"
    raise NotFoundError(
        f"run {saved.run_id!r} has no pending tool call {call_id!r} (pending: {waiting})"
    )


def _apply(
    state: RunState[Any, Any], item: ToolApprovalItem, decision: dict[str, Any] | None
) -> None:
    if decision is None:
        return  # undecided: the SDK stops for it again
    matches = decision["tool_name"] == (item.name or "") and decision["arguments"] == (
        item.arguments or ""
    )
    if decision["decision"] == "approved" and matches:
        state.approve(item, always_approve=bool(decision["always"]))
    elif matches:
        state.reject(
            item, always_reject=bool(decision["always"]), rejection_message=decision["message"]
        )
    else:  # fail closed: a decision about another call than the one restored
        state.reject(item, rejection_message="rejected: the approval did not match this call")


def _raw(record: VersionedRecord) -> str:
    return json.dumps(record.value, default=str)[:200]


def _saved(record: VersionedRecord) -> SavedRunState:
    if not isinstance(record.value, dict) or record.value.get("format") != FORMAT:
        raise StoreCorruptError(
            f"record {NAMESPACE}/{record.key} is not a saved run state; delete it "
            f"(RunStateStore.delete({record.key!r})) or restore it from a backup"
        )
    value = cast("dict[str, Any]", record.value)
    version = value.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise SchemaVersionError(
            f"saved run state {record.key!r} has format version {version!r}; this statekeeper "
            f"reads up to {FORMAT_VERSION}: upgrade statekeeper"
        )
    try:
        saved_at = datetime.fromisoformat(str(value["saved_at"]))
        session_id = value["session_id"]
        if session_id is not None and not isinstance(session_id, str):
            raise TypeError("session_id is not a string")
        decisions: dict[str, dict[str, Any]] = dict(value["decisions"])
        calls = [
            PendingApproval(
                run_id=record.key,
                call_id=str(call["call_id"]),
                tool_name=str(call["tool_name"]),
                arguments=str(call["arguments"]),
                agent=str(call["agent"]),
                session_id=session_id,
                saved_at=saved_at,
                decision=decisions.get(str(call["call_id"]), {}).get("decision"),
            )
            for call in value["calls"]
        ]
        return SavedRunState(
            run_id=record.key,
            agent=str(value["agent"]),
            session_id=session_id,
            saved_at=saved_at,
            version=record.version,
            state=dict(value["state"]),
            calls=calls,
            decisions=decisions,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreCorruptError(
            f"saved run state {record.key!r} is malformed ({exc!r}); delete it and save again"
        ) from exc
