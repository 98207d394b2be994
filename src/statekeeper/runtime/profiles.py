"""Auth profiles: an agent's API keys, used least-recently-used first, rested after failures.

A profile never holds a secret. It holds a *reference* the caller chooses and resolves,
``scheme:name``: ``env:OPENAI_KEY_2`` (see `resolve_secret`), ``vault:kv/openai#key``,
``keyring:openai/2`` ... So stores, logs and reprs never see a key.

Persistence: one versioned record per agent, namespace ``auth_profiles``, key = agent id,
value ``{"format": 1, "uses": <counter>, "profiles": [...]}``. Every change is a
compare-and-set on that record, retried on conflict, so two processes picking at once
each take a different profile (the loser re-reads and sees the other's use), and a new
`AuthProfiles` after a restart sees every cooldown.

Cooldown after a failure: ``retry_after`` when the provider said so, else
``base_cooldown * 2 ** (failures in a row - 1)``, capped at ``max_cooldown``.
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidInputError,
    NotFoundError,
    SchemaVersionError,
    StatekeeperError,
    StoreCorruptError,
)
from statekeeper.ids import new_id, validate_id
from statekeeper.retry import retry_on_conflict
from statekeeper.stores.base import RecordStore

__all__ = [
    "NAMESPACE",
    "AllProfilesCoolingDownError",
    "AuthProfile",
    "AuthProfiles",
    "mask_secret",
    "resolve_secret",
]

NAMESPACE: Final = "auth_profiles"
_FORMAT: Final = 1
_REF = re.compile(r"[a-z][a-z0-9+.-]{0,31}:[^\s]{1,223}")


class AllProfilesCoolingDownError(StatekeeperError):
    """Every profile of the agent is cooling down; ``available_at`` says when one is free."""

    def __init__(self, agent_id: str, profile_id: str, available_at: datetime, now: datetime):
        wait = max((available_at - now).total_seconds(), 0.0)
        super().__init__(
            f"every auth profile of agent {agent_id!r} is cooling down; the first free is "
            f"{profile_id!r} at {available_at.isoformat()} (in {wait:.0f} s): wait, or add "
            "a profile"
        )
        self.agent_id = agent_id
        self.profile_id = profile_id
        self.available_at = available_at


def _problems(exc: ValidationError) -> str:
    """What pydantic found wrong, by field, without the input (it may be a secret)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())


class AuthProfile(BaseModel):
    """One API key profile of an agent, with its use and failure history.

    Building one with bad fields raises `InvalidInputError` naming them (never the input).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            # Our own message, not pydantic's: that one would echo the (secret?) input.
            raise InvalidInputError(
                f"invalid auth profile: {_problems(exc)}; correct the fields named"
            ) from None

    id: str
    agent_id: str
    label: str = ""
    secret_ref: str = Field(repr=False)
    """Where the key is (``env:NAME`` ...), never the key itself; hidden from repr."""
    usage_count: int = 0
    last_used: AwareDatetime | None = None
    use_seq: int = 0
    """Order of the last use among the agent's profiles (0: never): the LRU order."""
    cooldown_until: AwareDatetime | None = None
    failure_count: int = 0
    """Failures in a row; a success resets it."""
    failure_reason: str | None = None
    created_at: AwareDatetime = Field(default_factory=utcnow)

    @field_validator("secret_ref")
    @classmethod
    def _is_a_reference(cls, value: str) -> str:
        if not _REF.fullmatch(value):
            # Do not echo the value: it may be a key pasted by mistake.
            raise ValueError(
                "secret_ref must be a reference 'scheme:name' such as 'env:OPENAI_KEY_2' "
                "(no spaces, at most 256 characters), never the secret itself"
            )
        return value

    def cooling(self, now: datetime) -> bool:
        """True while the profile rests after a failure."""
        return self.cooldown_until is not None and self.cooldown_until > now

    def __str__(self) -> str:
        return f"AuthProfile {self.id!r} of agent {self.agent_id!r} ({self.label or 'no label'})"


MAX_RETRY_AFTER = 366 * 24 * 3600.0
"""The longest ``retry_after`` `AuthProfiles.report_failure` takes, in seconds (a year)."""


def _retry_seconds(retry_after: object) -> float | None:
    """``retry_after`` as seconds, or `InvalidInputError` naming the accepted range."""
    if retry_after is None:
        return None
    if isinstance(retry_after, timedelta):
        retry_after = retry_after.total_seconds()
    if isinstance(retry_after, bool) or not isinstance(retry_after, int | float):
        raise InvalidInputError(
            f"retry_after must be seconds (a number) or a timedelta, not "
            f"{type(retry_after).__name__}"
        )
    if not 0 <= retry_after <= MAX_RETRY_AFTER:  # also refuses NaN (and huge ints)
        raise InvalidInputError(
            f"retry_after must be between 0 and {MAX_RETRY_AFTER:.0f} seconds (a year), "
            f"not {retry_after!r}"
        )
    return float(retry_after)


def _seconds(value: object, what: str) -> float:
    """``value`` if it is seconds in (0, a year], else `InvalidInputError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{what} must be seconds (a number), not {type(value).__name__}")
    if not 0 < value <= MAX_RETRY_AFTER:  # also refuses NaN and infinity
        raise InvalidInputError(
            f"{what} must be more than 0 and at most {MAX_RETRY_AFTER:.0f} seconds (a year), "
            f"not {value!r}"
        )
    return float(value)


def resolve_secret(ref: str, resolvers: Mapping[str, Callable[[str], str]] | None = None) -> str:
    """The secret a reference names: ``env:NAME`` reads the environment; other schemes
    use ``resolvers[scheme](name)``. Raises `NotFoundError` (without the value) when it
    cannot be resolved, the resolver's own statekeeper errors as they are, and
    `InvalidInputError` for a reference that is not text, resolvers that are not a
    mapping, or a resolver that returns no text."""
    if not isinstance(ref, str):
        raise InvalidInputError(
            f"a secret reference is a str such as 'env:OPENAI_KEY', not {type(ref).__name__}"
        )
    if resolvers is not None and not isinstance(resolvers, Mapping):
        raise InvalidInputError(
            "resolvers must map a scheme to a function of the name, e.g. "
            f"{{'vault': read_vault}}, not {type(resolvers).__name__}"
        )
    scheme, _, name = ref.partition(":")
    if resolvers and scheme in resolvers:
        try:
            secret = resolvers[scheme](name)
        except StatekeeperError:
            raise
        except Exception as exc:  # its message is not shown: it might hold the secret
            raise NotFoundError(
                f"the resolver for scheme {scheme!r} failed ({type(exc).__name__}) on "
                f"{scheme}:{name}; check the reference and the resolver"
            ) from exc
        if not isinstance(secret, str):
            raise InvalidInputError(
                f"the resolver for scheme {scheme!r} returned {type(secret).__name__}, not "
                "the secret as a str; make it return a str"
            )
        return secret
    if scheme == "env" and name in os.environ:
        return os.environ[name]
    raise NotFoundError(
        f"cannot resolve secret reference {scheme}:{name}; set it or pass a resolver"
    )


class _State(BaseModel):
    """The stored record value."""

    model_config = ConfigDict(extra="forbid")
    format: int = _FORMAT
    uses: int = 0
    profiles: list[AuthProfile] = Field(default_factory=list)


class AuthProfiles:
    """The auth profiles of one agent, persisted in ``store`` for ``tenant``.

    Args:
        store: any `RecordStore` (a whole `Store` is one): only its records are used.
        clock: the time source (inject one in tests).
        base_cooldown: seconds of rest after a first failure; doubles per failure in a row.
        max_cooldown: the longest computed rest, in seconds.
    """

    def __init__(
        self,
        store: RecordStore,
        tenant: str,
        agent_id: str,
        *,
        clock: Callable[[], datetime] = utcnow,
        base_cooldown: float = 60,
        max_cooldown: float = 3600,
        attempts: int = 20,
    ) -> None:
        base_cooldown = _seconds(base_cooldown, "base_cooldown")
        max_cooldown = _seconds(max_cooldown, "max_cooldown")
        if not base_cooldown <= max_cooldown:
            raise InvalidInputError(
                f"base_cooldown ({base_cooldown:g} s) is more than max_cooldown "
                f"({max_cooldown:g} s); need base_cooldown <= max_cooldown"
            )
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise InvalidInputError(f"attempts must be an integer of at least 1, not {attempts!r}")
        self._store, self._clock = store, clock
        self.tenant = validate_id(tenant, "tenant")
        self.agent_id = validate_id(agent_id, "agent id")
        self.base_cooldown, self.max_cooldown = base_cooldown, max_cooldown
        self._attempts = attempts

    # -- storage --------------------------------------------------------------------------

    def _now(self) -> datetime:
        now = self._clock()
        if not isinstance(now, datetime) or now.utcoffset() is None:
            raise InvalidInputError(
                f"the clock of AuthProfiles returned {now!r}, not a timezone-aware datetime; "
                "pass a clock such as statekeeper.core.messages.utcnow"
            )
        return now

    def _corrupt(self, problem: str) -> StoreCorruptError:
        where = f"{self.tenant!r}, {NAMESPACE!r}, {self.agent_id!r}"
        return StoreCorruptError(
            f"the auth profiles of agent {self.agent_id!r} (record {NAMESPACE}/"
            f"{self.agent_id} of tenant {self.tenant!r}) cannot be read: {problem}; restore "
            f"the record from a backup, or delete it (store.delete_record({where})) and add "
            "the profiles again"
        )

    async def _load(self) -> tuple[_State, int]:
        try:
            record = await self._store.get_record(self.tenant, NAMESPACE, self.agent_id)
        except NotFoundError:
            return _State(), 0
        value: Any = record.value
        if not isinstance(value, dict):
            raise self._corrupt(f"it holds a {type(value).__name__}, not an object")
        stored = value.get("format", _FORMAT)
        if type(stored) is int and stored > _FORMAT:
            raise SchemaVersionError(
                f"auth profiles of agent {self.agent_id!r} were stored in format "
                f"{stored}; upgrade statekeeper"
            )
        try:
            return _State.model_validate(value), record.version
        except ValidationError as exc:
            raise self._corrupt(_problems(exc)) from None

    async def _change(
        self, change: Callable[[_State, datetime], Awaitable[AuthProfile | None]]
    ) -> AuthProfile | None:
        """Re-read, apply ``change`` (which edits the state in place) and compare-and-set."""

        async def attempt() -> AuthProfile | None:
            state, version = await self._load()
            result = await change(state, self._now())
            await self._store.put_record(
                self.tenant,
                NAMESPACE,
                self.agent_id,
                state.model_dump(mode="json"),
                expected_version=version,
            )
            return result

        return await retry_on_conflict(attempt, attempts=self._attempts)

    def _index(self, state: _State, profile_id: str) -> int:
        for i, profile in enumerate(state.profiles):
            if profile.id == profile_id:
                return i
        raise NotFoundError(f"no auth profile {profile_id!r} for agent {self.agent_id!r}")

    # -- managing profiles ----------------------------------------------------------------

    async def add(
        self, secret_ref: str, *, label: str = "", profile_id: str | None = None
    ) -> AuthProfile:
        """Add a profile. `AlreadyExistsError` if the id is taken; `InvalidInputError`
        (naming the field, never echoing the secret) for bad fields."""
        pid = validate_id(new_id("key") if profile_id is None else profile_id, "profile id")
        profile = AuthProfile(
            id=pid,
            agent_id=self.agent_id,
            label=label,
            secret_ref=secret_ref,
            created_at=self._now(),
        )

        async def add(state: _State, now: datetime) -> AuthProfile:
            if any(p.id == pid for p in state.profiles):
                raise AlreadyExistsError(
                    f"auth profile {pid!r} already exists for agent {self.agent_id!r}"
                )
            state.profiles.append(profile)
            return profile

        await self._change(add)
        return profile

    async def remove(self, profile_id: str) -> None:
        """Remove a profile. `NotFoundError` if unknown."""

        async def remove(state: _State, now: datetime) -> None:
            del state.profiles[self._index(state, profile_id)]

        await self._change(remove)

    async def list(self) -> builtins.list[AuthProfile]:
        """Every profile, in the order they were added."""
        return (await self._load())[0].profiles

    async def get(self, profile_id: str) -> AuthProfile:
        """One profile, or `NotFoundError`."""
        state, _ = await self._load()
        return state.profiles[self._index(state, profile_id)]

    # -- using profiles -------------------------------------------------------------------

    def _take(self, state: _State, now: datetime) -> AuthProfile:
        """Record a use of the least recently used profile that is not cooling down."""
        if not state.profiles:
            raise NotFoundError(f"agent {self.agent_id!r} has no auth profiles; add one")
        ready = [i for i, p in enumerate(state.profiles) if not p.cooling(now)]
        if not ready:
            first = min(state.profiles, key=lambda p: p.cooldown_until or now)
            assert first.cooldown_until is not None
            raise AllProfilesCoolingDownError(self.agent_id, first.id, first.cooldown_until, now)
        i = min(ready, key=lambda i: state.profiles[i].use_seq)
        state.uses += 1
        used = state.profiles[i].model_copy(
            update={
                "usage_count": state.profiles[i].usage_count + 1,
                "last_used": now,
                "use_seq": state.uses,
            }
        )
        state.profiles[i] = used
        return used

    async def pick(self) -> AuthProfile:
        """Take the least recently used profile that is not cooling down, recording the use.

        Raises `AllProfilesCoolingDownError` (with the first free time) or `NotFoundError`
        when the agent has no profiles.
        """

        async def pick(state: _State, now: datetime) -> AuthProfile:
            return self._take(state, now)

        picked = await self._change(pick)
        assert picked is not None
        return picked

    async def report_failure(
        self,
        profile_id: str,
        reason: str,
        *,
        rate_limited: bool = True,
        retry_after: float | timedelta | None = None,
    ) -> AuthProfile:
        """Record a failure and return the profile to use next (its use recorded).

        A rate-limited failure (or any with ``retry_after``) puts the profile in cooldown;
        other failures only count toward the streak. The failure is saved even when the
        rotation then raises `AllProfilesCoolingDownError`. Bad arguments raise
        `InvalidInputError` and store nothing.
        """
        retry_after = _retry_seconds(retry_after)
        if not isinstance(reason, str):
            raise InvalidInputError(
                f"reason must be a str such as '429 Too Many Requests', not {type(reason).__name__}"
            )
        if not isinstance(rate_limited, bool):
            raise InvalidInputError(
                f"rate_limited must be True or False, not {type(rate_limited).__name__}"
            )
        cooling: list[AllProfilesCoolingDownError] = []

        async def fail(state: _State, now: datetime) -> AuthProfile | None:
            i = self._index(state, profile_id)
            old = state.profiles[i]
            failures = old.failure_count + 1
            update: dict[str, Any] = {"failure_count": failures, "failure_reason": reason}
            if rate_limited or retry_after is not None:
                rest = retry_after
                if rest is None:
                    rest = min(self.base_cooldown * 2 ** min(failures - 1, 62), self.max_cooldown)
                try:
                    update["cooldown_until"] = now + timedelta(seconds=rest)
                except OverflowError:
                    raise InvalidInputError(
                        f"a cooldown of {rest:g} s from {now.isoformat()} ends after the last "
                        "date a datetime can hold; check the clock"
                    ) from None
            state.profiles[i] = old.model_copy(update=update)
            cooling.clear()
            try:
                return self._take(state, now)
            except AllProfilesCoolingDownError as exc:
                cooling.append(exc)  # raised after the failure is stored
                return None

        next_profile = await self._change(fail)
        if next_profile is None:
            raise cooling[0]
        return next_profile

    async def report_success(self, profile_id: str) -> AuthProfile:
        """A call with the profile worked: its failure streak starts over."""

        async def succeed(state: _State, now: datetime) -> AuthProfile:
            i = self._index(state, profile_id)
            state.profiles[i] = state.profiles[i].model_copy(
                update={"failure_count": 0, "failure_reason": None}
            )
            return state.profiles[i]

        done = await self._change(succeed)
        assert done is not None
        return done

    async def reset(self, profile_id: str | None = None) -> None:
        """Clear cooldowns and failure streaks (of one profile, or of all)."""

        async def reset(state: _State, now: datetime) -> None:
            targets = (
                range(len(state.profiles))
                if profile_id is None
                else [self._index(state, profile_id)]
            )
            for i in targets:
                state.profiles[i] = state.profiles[i].model_copy(
                    update={"cooldown_until": None, "failure_count": 0, "failure_reason": None}
                )

        await self._change(reset)

    async def next_free_at(self) -> datetime | None:
        """When a profile is next usable: now if one is ready, None if there are none."""
        profiles, now = await self.list(), self._now()
        if not profiles:
            return None
        return min(
            p.cooldown_until if p.cooling(now) and p.cooldown_until else now for p in profiles
        )


def mask_secret(ref: str) -> str:
    """A secret reference with only its scheme left: ``env:OPENAI_KEY`` -> ``env:…``
    (what listings show: never the reference itself)."""
    if not isinstance(ref, str):
        raise InvalidInputError(
            f"mask_secret takes a secret reference (a str), not {type(ref).__name__}"
        )
    scheme, sep, _ = ref.partition(":")
    return f"{scheme}:…" if sep else "…"
