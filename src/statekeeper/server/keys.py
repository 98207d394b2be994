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
import secrets
from datetime import datetime
from typing import Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, NotFoundError
from statekeeper.ids import validate_id
from statekeeper.server.errors import AuthenticationError
from statekeeper.stores.base import RecordStore

__all__ = ["KEYS_NAMESPACE", "KEYS_TENANT", "SCOPES", "ApiKey", "ApiKeys", "Scope"]

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


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def check_scope(scope: object) -> Scope:
    """``scope`` if it is one of `SCOPES`, else `InvalidInputError`."""
    for known in SCOPES:
        if scope == known:
            return known
    raise InvalidInputError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")


class ApiKeys:
    """The API keys kept in ``store``."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store

    async def create(
        self, tenant: str, scope: str, *, label: str | None = None
    ) -> tuple[ApiKey, str]:
        """A new key for ``tenant``: its record and the key itself (shown once)."""
        validate_id(tenant, "tenant")
        if tenant == KEYS_TENANT:
            raise InvalidInputError(f"tenant {KEYS_TENANT!r} is reserved for the keys")
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
        return ApiKey.model_validate(found.value)

    async def list(self, tenant: str | None = None) -> list[ApiKey]:
        """Every key (of ``tenant`` if given), revoked ones too, in id order."""
        out: list[ApiKey] = []
        after: str | None = None
        while page := await self.store.list_records(
            KEYS_TENANT, KEYS_NAMESPACE, after_key=after, limit=500
        ):
            out += [ApiKey.model_validate(r.value) for r in page]
            after = page[-1].key
        return [k for k in out if tenant is None or k.tenant == tenant]

    async def revoke(self, key_id: str, *, when: datetime | None = None) -> ApiKey:
        """Revoke a key: requests with it are refused from now on. Idempotent."""
        validate_id(key_id, "key id")
        try:
            found = await self.store.get_record(KEYS_TENANT, KEYS_NAMESPACE, key_id)
        except NotFoundError:
            raise NotFoundError(f"no API key {key_id!r} (see `statekeeper keys list`)") from None
        key = ApiKey.model_validate(found.value)
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
        try:
            key = await self.get(key_id)
        except (NotFoundError, InvalidInputError):
            raise AuthenticationError("unknown or revoked API key") from None
        if not hmac.compare_digest(key.secret_sha256, _digest(secret)) or key.revoked_at:
            raise AuthenticationError("unknown or revoked API key")
        return key


def _split(presented: str) -> tuple[str, str]:
    if not presented.startswith(_PREFIX):
        raise AuthenticationError(
            "an API key starts with sk_ (create one: statekeeper keys create)"
        )
    key_id, sep, secret = presented[len(_PREFIX) :].partition("_")
    if not (sep and key_id and secret):
        raise AuthenticationError("unknown or revoked API key")
    return key_id, secret
