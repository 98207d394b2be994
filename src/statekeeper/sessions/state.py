"""Scoped key-value state on a session, changed through recorded deltas.

Keys choose their scope by prefix:

    "app:theme"     shared by every user of the app (agent)
    "user:locale"   this tenant's, across all their sessions
    "temp:scratch"  this handle's only; never persisted
    "draft"         (no prefix) this session's

Every change to persisted scopes is recorded as a ``state`` entry in the transcript
holding the delta, so the history of state is replayable like the conversation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from statekeeper.errors import ConflictError, InvalidInputError, NotFoundError, StatekeeperError
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, encode_json
from statekeeper.sessions.handle import SessionHandle
from statekeeper.stores.base import EntryDraft, EntryKind, SessionPatch
from statekeeper.stores.rules import check_version

__all__ = ["APP_TENANT", "ScopedState"]

APP_TENANT = "statekeeper.app"
"""The reserved tenant that holds app-wide state (user tenants may not use it)."""

_SCOPES = ("app:", "user:", "temp:")
_MAX_ATTEMPTS = 10


def _split(key: str) -> tuple[str, str]:
    if not isinstance(key, str) or not key:
        raise InvalidInputError("state keys must be non-empty strings")
    for prefix in _SCOPES:
        if key.startswith(prefix):
            name = key[len(prefix) :]
            if not name:
                raise InvalidInputError(f"state key {key!r} has a scope but no name")
            return prefix[:-1], name
    return "session", key


class ScopedState:
    """The state of one session handle across the four scopes."""

    def __init__(self, session: SessionHandle) -> None:
        self._session = session
        self._temp: dict[str, JsonValue] = {}

    def reset_temp(self) -> None:
        """Forget temporary keys (done when the handle moves to a continuation)."""
        self._temp.clear()

    def _shared(self, scope: str) -> tuple[str, str, str]:
        manager = self._session.manager
        tenant = APP_TENANT if scope == "app" else manager.tenant
        return tenant, f"state.{scope}", self._session.record.agent_id or "default"

    async def _load_shared(self, scope: str) -> tuple[dict[str, JsonValue], int]:
        tenant, namespace, key = self._shared(scope)
        try:
            record = await self._session.manager.store.get_record(tenant, namespace, key)
        except NotFoundError:
            return {}, 0
        value = record.value
        return (dict(value) if isinstance(value, dict) else {}), record.version

    async def all(self) -> dict[str, JsonValue]:
        """Every key of every scope, with its prefix."""
        out: dict[str, JsonValue] = {}
        for scope in ("app", "user"):
            values, _ = await self._load_shared(scope)
            out.update({f"{scope}:{k}": v for k, v in values.items()})
        out.update(self._session.record.state)
        out.update({f"temp:{k}": v for k, v in self._temp.items()})
        return out

    async def get(self, key: str, default: JsonValue = None) -> JsonValue:
        """One key's value, or ``default``."""
        scope, name = _split(key)
        if scope == "temp":
            return self._temp.get(name, default)
        if scope == "session":
            return self._session.record.state.get(name, default)
        values, _ = await self._load_shared(scope)
        return values.get(name, default)

    async def update(self, delta: Mapping[str, JsonValue]) -> None:
        """Set keys in their scopes and record the persisted part of the delta."""
        await self._change(dict(delta), [])

    async def delete(self, *keys: str) -> None:
        """Remove keys from their scopes (absent keys are ignored)."""
        await self._change({}, list(keys))

    async def _change(self, delta: dict[str, JsonValue], deleted: Iterable[str]) -> None:
        """Apply a change whole or not at all: the session's compare-and-set is checked
        before the shared scopes are written, and they are put back if the delta entry
        cannot be recorded after all (another writer got in between)."""
        by_scope: dict[str, tuple[dict[str, JsonValue], list[str]]] = {
            s: ({}, []) for s in ("app", "user", "session", "temp")
        }
        for key, value in delta.items():
            scope, name = _split(key)
            by_scope[scope][0][name] = value
        for key in deleted:
            scope, name = _split(key)
            by_scope[scope][1].append(name)
        recorded = {
            scope: {"set": by_scope[scope][0], "deleted": by_scope[scope][1]}
            for scope in ("app", "user", "session")
            if by_scope[scope][0] or by_scope[scope][1]
        }
        if recorded:
            await self._record(by_scope, recorded)
        temp_sets, temp_removes = by_scope["temp"]
        self._temp.update(temp_sets)
        for name in temp_removes:
            self._temp.pop(name, None)

    async def _record(
        self,
        by_scope: dict[str, tuple[dict[str, JsonValue], list[str]]],
        recorded: dict[str, dict[str, Any]],
    ) -> None:
        session = self._session
        await session._follow()  # a continued session's state goes on in the live one
        payload = {"delta": recorded}
        sets, removes = by_scope["session"]
        new_state = {**session.record.state, **sets}
        for name in removes:
            new_state.pop(name, None)
        await self._check_fits(by_scope, payload, new_state)
        expected = session.version
        store = session.manager.store
        check_version(await store.get_session(session.manager.tenant, session.id), expected)
        undo: list[_Undo] = []
        try:
            for scope in ("app", "user"):
                sets, removes = by_scope[scope]
                if sets or removes:
                    undo.append(await self._write_shared(scope, sets, removes))
            draft = EntryDraft(kind=EntryKind.STATE, payload=payload)
            patch = SessionPatch(set={"state": new_state})
            await session._append_raw([draft], patch, expected_version=expected)
        except BaseException:
            for step in reversed(undo):
                await self._restore(step)
            raise

    async def _check_fits(
        self,
        by_scope: dict[str, tuple[dict[str, JsonValue], list[str]]],
        payload: dict[str, Any],
        new_state: dict[str, JsonValue],
    ) -> None:
        """Refuse, before anything is written, what a write below would refuse: values
        that are not JSON (NaN, objects) and scopes, entries or heads past the store's
        size limit."""
        store = self._session.manager.store
        limit = getattr(store, "max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES)
        encode_json(payload, what="state update", limit=limit)
        head = self._session.record.model_copy(update={"state": new_state})
        encode_json(head.to_doc(), what=f"session {head.id!r} with this state", limit=limit)
        for scope in ("app", "user"):
            sets, removes = by_scope[scope]
            if sets or removes:
                values, _ = await self._load_shared(scope)
                values.update(sets)
                for name in removes:
                    values.pop(name, None)
                encode_json(values, what=f"{scope} state", limit=limit)

    async def _write_shared(
        self, scope: str, sets: dict[str, JsonValue], removes: list[str]
    ) -> _Undo:
        tenant, namespace, key = self._shared(scope)
        store = self._session.manager.store
        for _ in range(_MAX_ATTEMPTS):
            values, version = await self._load_shared(scope)
            before = dict(values)
            values.update(sets)
            for name in removes:
                values.pop(name, None)
            try:
                written = await store.put_record(
                    tenant, namespace, key, values, expected_version=version
                )
            except ConflictError:
                continue
            return _Undo(scope, before, version, written.version)
        raise ConflictError(f"{scope} state kept changing under concurrent writers; retry")

    async def _restore(self, step: _Undo) -> None:
        """Put a shared scope back as it was, unless someone else has written it since."""
        tenant, namespace, key = self._shared(step.scope)
        store = self._session.manager.store
        with contextlib.suppress(StatekeeperError):
            if step.version == 0:
                await store.delete_record(tenant, namespace, key, expected_version=step.written)
            else:
                await store.put_record(
                    tenant, namespace, key, step.values, expected_version=step.written
                )


@dataclass(frozen=True, slots=True)
class _Undo:
    """How to put a shared scope back: its values and version before, and the version
    written."""

    scope: str
    values: dict[str, JsonValue]
    version: int
    written: int
