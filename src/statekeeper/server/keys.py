"""API keys: created and revoked from the CLI, checked by the server on every request.

A key is ``sk_<key id>_<secret>`` with a 256-bit random secret. The store keeps only the
SHA-256 of the secret (a fast hash is enough for a secret that cannot be guessed), in
the reserved tenant `KEYS_TENANT` that no API request can reach (every request is scoped
to its key's tenant, and no key can be made for that one). The key itself is returned
once, by `ApiKeys.create`, and never stored or logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, NotFoundError, StoreCorruptError
from statekeeper.ids import validate_id
from statekeeper.server.errors import AuthenticationError
from statekeeper.stores.base import RecordStore, VersionedRecord
from statekeeper.stores.types import CorruptItem

__all__ = [
    "KEYS_NAMESPACE",
    "KEYS_TENANT",
    "SCOPES",
    "ApiKey",
    "ApiKeyList",
    "ApiKeys",
    "Scope",
]

_log = logging.getLogger(__name__)

Scope = Literal["read", "operate", "admin"]
SCOPES: Final[tuple[Scope, ...]] = ("read", "operate", "admin")
"""From least to most allowed: each scope may do what the ones before it may."""
KEYS_TENANT: Final = "statekeeper.server"
KEYS_NAMESPACE: Final = "api_keys"
_PREFIX: Final = "sk_"


class ApiKey(BaseModel):
    """What the store keeps of a key (its secret only as a hash)."""

    model_config = ConfigDict(extra="forbid")
    key_id: str
    tenant: str
    scope: Scope
    label: str | None = None
    created_at: AwareDatetime
    revoked_at: AwareDatetime | None = None
    secret_sha256: str

    def public(self) -> dict[str, object]:
        """The key as listings show it: everything but the hash."""
        return self.model_dump(mode="json", exclude={"secret_sha256"})

    def allows(self, scope: Scope) -> bool:
        """Whether this key's scope includes ``scope``."""
        return SCOPES.index(self.scope) >= SCOPES.index(scope)


class ApiKeyList(list[ApiKey]):
    """What `ApiKeys.list` returns: the keys (a list), and ``corrupt``, the stored key
    records that cannot be read (such a key is refused; revoke it by creating a new one
    and deleting the damaged record, named in the error)."""

    def __init__(self, keys: Iterable[ApiKey] = (), corrupt: Iterable[CorruptItem] = ()):
        super().__init__(keys)
        self.corrupt: list[CorruptItem] = list(corrupt)


def _decode(record: VersionedRecord) -> ApiKey:
    try:
        return ApiKey.model_validate(record.value)
    except ValidationError as exc:
        raise StoreCorruptError(
            f"API key record {record.key!r} cannot be read ({exc.error_count()} errors); "
            f"the key is refused: delete the record (store.delete_record({KEYS_TENANT!r}, "
            f"{KEYS_NAMESPACE!r}, {record.key!r})) and create a new key"
        ) from None


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def check_scope(scope: object) -> Scope:
    """``scope`` if it is one of `SCOPES`, else `InvalidInputError`."""
    for known in SCOPES:
        if scope == known:
            return known
    raise InvalidInputError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")


_VERIFIED_MAX = 1024


class ApiKeys:
    """The API keys kept in ``store``.

    `verify` reads the key's record on every call, so a revocation (by any process)
    counts from the next request. What it skips is the rest, once a key has been seen:
    it remembers the record value each live key was verified against, and while the
    record read is that same value it does not decode it or hash the secret again.
    """

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        # key id -> (the record value it was verified against, its secret, the key)
        self._verified: dict[str, tuple[object, bytes, ApiKey]] = {}

    async def create(
        self, tenant: str, scope: str, *, label: str | None = None
    ) -> tuple[ApiKey, str]:
        """A new key for ``tenant``: its record and the key itself (shown once)."""
        validate_id(tenant, "tenant")
        if tenant == KEYS_TENANT:
            raise InvalidInputError(f"tenant {KEYS_TENANT!r} is reserved for the keys")
        if label is not None and (not isinstance(label, str) or len(label) > 200):
            raise InvalidInputError("a key's label is a text of at most 200 characters")
        key_id = "k" + secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        record = ApiKey(
            key_id=key_id,
            tenant=tenant,
            scope=check_scope(scope),
            label=label,
            created_at=utcnow(),
            secret_sha256=_digest(secret),
        )
        await self.store.put_record(
            KEYS_TENANT, KEYS_NAMESPACE, key_id, record.model_dump(mode="json"), expected_version=0
        )
        return record, f"{_PREFIX}{key_id}_{secret}"

    async def get(self, key_id: str) -> ApiKey:
        """The key's record, or `NotFoundError`."""
        validate_id(key_id, "key id")
        try:
            found = await self.store.get_record(KEYS_TENANT, KEYS_NAMESPACE, key_id)
        except NotFoundError:
            raise NotFoundError(f"no API key {key_id!r} (see `statekeeper keys list`)") from None
        return _decode(found)

    async def list(self, tenant: str | None = None) -> ApiKeyList:
        """Every key (of ``tenant`` if given), revoked ones too, in id order; key records
        that cannot be read are reported in ``corrupt`` (whatever ``tenant``)."""
        if tenant is not None:
            validate_id(tenant, "tenant")
        out = ApiKeyList()
        after: str | None = None
        while True:
            page = await self.store.list_records(
                KEYS_TENANT, KEYS_NAMESPACE, after_key=after, limit=500
            )
            out.corrupt += page.corrupt
            for record in page:
                try:
                    key = _decode(record)
                except StoreCorruptError as exc:
                    out.corrupt.append(CorruptItem(id=record.key, error=str(exc)))
                    continue
                if tenant is None or key.tenant == tenant:
                    out.append(key)
            if len(page) < 500:
                return out
            after = page[-1].key

    async def revoke(self, key_id: str, *, when: datetime | None = None) -> ApiKey:
        """Revoke a key: requests with it are refused from now on. Idempotent."""
        validate_id(key_id, "key id")
        try:
            found = await self.store.get_record(KEYS_TENANT, KEYS_NAMESPACE, key_id)
        except NotFoundError:
            raise NotFoundError(f"no API key {key_id!r} (see `statekeeper keys list`)") from None
        key = _decode(found)
        if key.revoked_at is None:
            key.revoked_at = when or utcnow()
            await self.store.put_record(
                KEYS_TENANT,
                KEYS_NAMESPACE,
                key_id,
                key.model_dump(mode="json"),
                expected_version=found.version,
            )
        return key

    async def verify(self, presented: str) -> ApiKey:
        """The live key ``presented`` is, or `AuthenticationError` (never saying why in
        more detail than "unknown or revoked", and never echoing the key)."""
        key_id, secret = _split(presented)
        given = secret.encode("utf-8")
        try:
            validate_id(key_id, "key id")
            found = await self.store.get_record(KEYS_TENANT, KEYS_NAMESPACE, key_id)
            seen = self._verified.pop(key_id, None)
            if seen is not None and seen[0] == found.value and hmac.compare_digest(seen[1], given):
                key = seen[2]  # the record is as it was (not revoked), the secret the same
            else:
                key = _decode(found)
                if not hmac.compare_digest(key.secret_sha256, _digest(secret)) or key.revoked_at:
                    raise AuthenticationError("unknown or revoked API key")
        except (NotFoundError, InvalidInputError):
            raise AuthenticationError("unknown or revoked API key") from None
        except StoreCorruptError as exc:  # fail closed, and tell the operator
            _log.warning("refusing an API key: %s", exc)
            raise AuthenticationError("unknown or revoked API key") from None
        if len(self._verified) >= _VERIFIED_MAX:
            self._verified.pop(next(iter(self._verified)))
        self._verified[key_id] = (found.value, given, key)
        return key.model_copy()


def _split(presented: str) -> tuple[str, str]:
    if not presented.startswith(_PREFIX):
        raise AuthenticationError(
            "an API key starts with sk_ (create one: statekeeper keys create)"
        )
    key_id, sep, secret = presented[len(_PREFIX) :].partition("_")
    if not (sep and key_id and secret):
        raise AuthenticationError("unknown or revoked API key")
    return key_id, secret
