"""What a sealed store seals in each kind of row, and how it is bound to its place.

A sealed value is stored where the plain value was, in a shape the backend accepts:

- a JSON object (entry and event payloads, record values, session ``state``) becomes
  ``{"~sealed": "<envelope>"}``;
- session ``metadata`` keeps the keys declared clear and puts the rest under ``"~sealed"``
  (``~`` is never allowed in a filter key, so no listing can filter on it);
- a session ``title`` becomes ``"~sealed:<envelope>"``;
- a session ``delivery`` becomes ``{"extra": {"~sealed": "<envelope>"}}``.

Each envelope is bound (authenticated data, see `statekeeper.stores.sealed.keyring`) to
what the row is and where it lives, so moving it anywhere else makes it fail to open.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from statekeeper.codec import StateTamperedError
from statekeeper.errors import InvalidInputError
from statekeeper.jsoncodec import encode_json, loads
from statekeeper.stores.base import DeliveryContext, SessionRecord
from statekeeper.stores.sealed.keyring import Keyring, bindings

__all__ = ["BACKEND_METADATA", "SEALED_KEY", "SESSION_FIELDS", "FieldSealer", "sealed_text"]

SEALED_KEY: Final = "~sealed"
"""The key holding a sealed envelope inside a stored JSON object."""
_TITLE_PREFIX: Final = "~sealed:"
BACKEND_METADATA: Final = frozenset({"recovered_from", "recovery"})
"""Metadata keys a backend writes itself, below the wrapper, so in clear: the files store
names the lost session a recovery session was made from (`statekeeper.stores.files`)."""
SESSION_FIELDS: Final = ("title", "metadata", "delivery", "state")
"""The session head fields that are sealed (the others stay clear: see docs/encryption.md)."""


def sealed_text(value: object) -> str | None:
    """The envelope of a stored ``{"~sealed": envelope}`` object, else None."""
    if type(value) is dict and len(value) == 1:
        text = value.get(SEALED_KEY)
        if type(text) is str:
            return text
    return None


def _plain(where: str) -> StateTamperedError:
    return StateTamperedError(
        f"{where} is stored unsealed, but this store seals it: refusing it (it may have "
        "been written around the encryption). If the store holds data from before "
        "encryption was turned on, open it with allow_plain=True until `statekeeper "
        "reseal` has sealed every row"
    )


class FieldSealer:
    """Seals and opens the sealed fields of session heads for one keyring."""

    def __init__(
        self, keyring: Keyring, clear_metadata: frozenset[str], allow_plain: bool, limit: int
    ) -> None:
        self.keyring = keyring
        self.clear_metadata = clear_metadata
        self.allow_plain = allow_plain
        self.limit = limit

    def seal_json(self, value: Any, binding: bytes, what: str) -> str:
        """``value`` as JSON text, sealed with a random nonce."""
        text = encode_json(value, what=what, limit=self.limit)
        return self.keyring.seal(text.encode(), binding, deterministic=False)

    def open_json(self, sealed: str, binding: bytes) -> Any:
        """The JSON value sealed in ``sealed`` (typed errors from `Keyring.open`)."""
        return loads(self.keyring.open(sealed, binding))

    # -- session heads -------------------------------------------------------------------

    def seal_session(
        self, tenant: str, session_id: str, fields: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``fields`` (a head's or a patch's) with the sealed ones sealed; others as given."""
        out = dict(fields)
        for name in SESSION_FIELDS:
            if name not in fields or fields[name] is None:
                continue
            value = fields[name]
            binding = bindings("session", tenant, session_id, name)
            what = f"session {session_id!r} {name}"
            if name == "title" and isinstance(value, str):
                out[name] = _TITLE_PREFIX + self.seal_json(value, binding, what)
            elif name == "metadata" and isinstance(value, dict):
                out[name] = self._seal_metadata(value, binding, what)
            elif name == "delivery":
                data = (
                    value.model_dump(mode="json") if isinstance(value, DeliveryContext) else value
                )
                out[name] = DeliveryContext(extra={SEALED_KEY: self.seal_json(data, binding, what)})
            elif name == "state" and isinstance(value, dict) and value:
                out[name] = {SEALED_KEY: self.seal_json(value, binding, what)}
            # anything else is left for the store's own validation to refuse
        return out

    def _seal_metadata(self, value: dict[str, Any], binding: bytes, what: str) -> Any:
        if SEALED_KEY in value:
            raise InvalidInputError(
                f"metadata key {SEALED_KEY!r} is reserved by the sealed store; rename it"
            )
        clear = {k: v for k, v in value.items() if k in self.clear_metadata}
        hidden = {k: v for k, v in value.items() if k not in self.clear_metadata}
        if hidden:
            clear[SEALED_KEY] = self.seal_json(hidden, binding, what)
        return clear

    def open_session(self, record: SessionRecord) -> SessionRecord:
        """The head with its sealed fields opened; `StateTamperedError` (or
        `WrongKeyError`) naming the session if one does not open."""
        try:
            return self._open_session(record)
        except StateTamperedError as exc:
            raise type(exc)(f"session {record.id!r}: {exc}") from None

    def _open_session(self, record: SessionRecord) -> SessionRecord:
        changes: dict[str, Any] = {}
        tenant, session_id = record.tenant, record.id
        # A head the backend made itself (a files-store recovery session) is plain.
        plain_ok = self.allow_plain or "recovered_from" in record.metadata

        def binding(name: str) -> bytes:
            return bindings("session", tenant, session_id, name)

        where = f"session {session_id!r}"
        title = record.title
        if title is not None:
            if title.startswith(_TITLE_PREFIX):
                changes["title"] = self.open_json(title[len(_TITLE_PREFIX) :], binding("title"))
            elif not plain_ok:
                raise _plain(f"the title of {where}")
        if record.metadata:
            changes["metadata"] = self._open_metadata(record.metadata, binding("metadata"), where)
        delivery = record.delivery
        if delivery is not None:
            sealed = sealed_text(delivery.extra)
            if sealed is not None and delivery.channel is None and delivery.sender is None:
                opened = self.open_json(sealed, binding("delivery"))
                changes["delivery"] = DeliveryContext.model_validate(opened)
            elif not plain_ok:
                raise _plain(f"the delivery context of {where}")
        if record.state:
            sealed = sealed_text(record.state)
            if sealed is not None:
                changes["state"] = self.open_json(sealed, binding("state"))
            elif not plain_ok:
                raise _plain(f"the state of {where}")
        return record.model_copy(update=changes) if changes else record

    def _open_metadata(
        self, metadata: dict[str, Any], binding: bytes, where: str
    ) -> dict[str, Any]:
        opened = {k: v for k, v in metadata.items() if k != SEALED_KEY}
        stray = [k for k in opened if k not in self.clear_metadata and k not in BACKEND_METADATA]
        if stray and not self.allow_plain:
            raise _plain(f"metadata {stray[0]!r} of {where} (not declared in clear_metadata)")
        sealed = metadata.get(SEALED_KEY)
        if isinstance(sealed, str):
            hidden = self.open_json(sealed, binding)
            if isinstance(hidden, dict):
                opened.update(hidden)
        return opened
