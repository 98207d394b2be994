"""App-wide and per-user ADK state, kept as versioned records of the service's tenant.

An app's state is one record, a user's state in an app another (`_codec` names them).
A change merges a delta into a record with compare-and-set, retrying when another
writer got in first, and returns what is needed to put it back if the rest of the
call fails, as `statekeeper.sessions.state.ScopedState` does for its shared scopes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from statekeeper.errors import ConflictError, NotFoundError, StatekeeperError
from statekeeper.integrations.adk._codec import (
    STATE_NAMESPACE,
    app_record_key,
    user_record_key,
    user_record_prefix,
)
from statekeeper.stores.base import RecordStore

__all__ = ["SharedState", "Undo"]

_MAX_ATTEMPTS = 10
_PAGE = 500


@dataclass(frozen=True, slots=True)
class Undo:
    """How to put a record back: its value and version before, and the version written."""

    key: str
    value: dict[str, Any]
    version: int
    written: int


class SharedState:
    """Reads and merges the app and user state records of one tenant."""

    def __init__(self, store: RecordStore, tenant: str) -> None:
        self._store = store
        self._tenant = tenant

    async def _load(self, key: str) -> tuple[dict[str, Any], int]:
        try:
            record = await self._store.get_record(self._tenant, STATE_NAMESPACE, key)
        except NotFoundError:
            return {}, 0
        value = record.value
        return (dict(value) if isinstance(value, dict) else {}), record.version

    async def app(self, app_name: str) -> dict[str, Any]:
        """The app's state (keys without ``app:``)."""
        value, _ = await self._load(app_record_key(app_name))
        state = value.get("state")
        return dict(state) if isinstance(state, dict) else {}

    async def user(self, app_name: str, user_id: str) -> dict[str, Any]:
        """One user's state in the app (keys without ``user:``)."""
        value, _ = await self._load(user_record_key(app_name, user_id))
        state = value.get("state")
        return dict(state) if isinstance(state, dict) else {}

    async def users(self, app_name: str) -> dict[str, dict[str, Any]]:
        """Every user's state in the app, by user id."""
        out: dict[str, dict[str, Any]] = {}
        after: str | None = None
        while True:
            page = await self._store.list_records(
                self._tenant,
                STATE_NAMESPACE,
                prefix=user_record_prefix(app_name),
                after_key=after,
                limit=_PAGE,
            )
            for record in page:
                value = record.value
                state = value.get("state") if isinstance(value, dict) else None
                if isinstance(value, dict) and isinstance(state, dict):
                    out[str(value.get("user"))] = dict(state)
            if len(page) < _PAGE:
                return out
            after = page[-1].key

    async def merge(self, app_name: str, user_id: str | None, delta: dict[str, Any]) -> Undo | None:
        """Merge ``delta`` into the app's state (``user_id`` None) or a user's, the way
        ``dict.update`` does; None when there is nothing to merge."""
        if not delta:
            return None
        if user_id is None:
            key, names = app_record_key(app_name), {"app": app_name}
        else:
            key, names = user_record_key(app_name, user_id), {"app": app_name, "user": user_id}
        for _ in range(_MAX_ATTEMPTS):
            before, version = await self._load(key)
            state = before.get("state")
            merged = {**(state if isinstance(state, dict) else {}), **delta}
            try:
                written = await self._store.put_record(
                    self._tenant,
                    STATE_NAMESPACE,
                    key,
                    {**names, "state": merged},
                    expected_version=version,
                )
            except ConflictError:
                continue
            return Undo(key, before, version, written.version)
        scope = "app" if user_id is None else "user"
        raise ConflictError(
            f"{scope} state of {app_name!r} kept changing under other writers; retry"
        )

    async def restore(self, undo: Undo | None) -> None:
        """Put a record back as it was, unless another writer has changed it since."""
        if undo is None:
            return
        with contextlib.suppress(StatekeeperError):
            if undo.version == 0:
                await self._store.delete_record(
                    self._tenant, STATE_NAMESPACE, undo.key, expected_version=undo.written
                )
            else:
                await self._store.put_record(
                    self._tenant,
                    STATE_NAMESPACE,
                    undo.key,
                    undo.value,
                    expected_version=undo.written,
                )
