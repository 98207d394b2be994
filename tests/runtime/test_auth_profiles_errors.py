"""Auth profiles refuse bad input with typed errors (`statekeeper.errors`) whose message
names the problem and the fix, and leave the stored record as it was; a damaged stored
record is reported as `StoreCorruptError`, never as a pydantic or built-in error."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fakes import Clock

from statekeeper.errors import (
    InvalidIdError,
    InvalidInputError,
    NotFoundError,
    StatekeeperError,
    StoreCorruptError,
)
from statekeeper.runtime.profiles import (
    NAMESPACE,
    AuthProfile,
    AuthProfiles,
    mask_secret,
    resolve_secret,
)
from statekeeper.stores.base import RecordStore

TENANT = "alice"
AGENT = "bot"


async def stored(store: RecordStore) -> tuple[Any, int] | None:
    """The agent's stored record (value, version), or None."""
    try:
        record = await store.get_record(TENANT, NAMESPACE, AGENT)
    except NotFoundError:
        return None
    return record.value, record.version


@pytest.fixture
async def profiles(record_store: RecordStore, clock: Clock) -> AuthProfiles:
    keys = AuthProfiles(record_store, TENANT, AGENT, clock=clock)
    await keys.add("env:KEY_1", label="one", profile_id="k1")
    return keys


# -- the constructor ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"base_cooldown": "60"},
        {"max_cooldown": None},
        {"base_cooldown": math.nan},
        {"base_cooldown": True},
        {"max_cooldown": math.inf},
        {"max_cooldown": 1e30},
        {"attempts": 0},
        {"attempts": "3"},
        {"attempts": 2.5},
    ],
    ids=repr,
)
def test_bad_settings_are_refused_typed(record_store: RecordStore, options: Any) -> None:
    with pytest.raises(InvalidInputError) as caught:
        AuthProfiles(record_store, TENANT, AGENT, **options)
    name = next(iter(options))
    assert name in str(caught.value)


@pytest.mark.parametrize(("tenant", "agent"), [("", AGENT), (TENANT, 7), (TENANT, "a/../b")])
def test_bad_ids_are_refused_typed(record_store: RecordStore, tenant: Any, agent: Any) -> None:
    with pytest.raises(InvalidIdError):
        AuthProfiles(record_store, tenant, agent)


# -- each entry point with bad input: typed, and nothing stored changes -------------------


Call = Callable[[AuthProfiles], Awaitable[object]]

BAD_CALLS: dict[str, tuple[Call, type[StatekeeperError]]] = {
    "add: empty profile id": (lambda p: p.add("env:X", profile_id=""), InvalidIdError),
    "add: profile id not a str": (lambda p: p.add("env:X", profile_id=5), InvalidIdError),  # type: ignore[arg-type]
    "add: secret_ref not a str": (lambda p: p.add(None), InvalidInputError),  # type: ignore[arg-type]
    "add: label not a str": (lambda p: p.add("env:X", label=3), InvalidInputError),  # type: ignore[arg-type]
    "report_failure: reason not a str": (
        lambda p: p.report_failure("k1", 429),  # type: ignore[arg-type]
        InvalidInputError,
    ),
    "report_failure: rate_limited not a bool": (
        lambda p: p.report_failure("k1", "429", rate_limited="no"),  # type: ignore[arg-type]
        InvalidInputError,
    ),
    "report_failure: retry_after not seconds": (
        lambda p: p.report_failure("k1", "429", retry_after="5"),  # type: ignore[arg-type]
        InvalidInputError,
    ),
    "report_failure: unknown profile": (lambda p: p.report_failure("k9", "x"), NotFoundError),
    "report_success: unknown profile": (lambda p: p.report_success("k9"), NotFoundError),
    "remove: unknown profile": (lambda p: p.remove("k9"), NotFoundError),
    "reset: unknown profile": (lambda p: p.reset("k9"), NotFoundError),
    "get: unknown profile": (lambda p: p.get("k9"), NotFoundError),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
async def test_bad_input_is_typed_and_changes_nothing(
    profiles: AuthProfiles, record_store: RecordStore, case: str
) -> None:
    call, error = BAD_CALLS[case]
    before = await stored(record_store)
    with pytest.raises(error):
        await call(profiles)
    assert await stored(record_store) == before
    # The profiles still read back (nothing half-written).
    assert [p.id for p in await profiles.list()] == ["k1"]


async def test_a_reason_that_is_not_text_is_never_stored(
    profiles: AuthProfiles, record_store: RecordStore
) -> None:
    with pytest.raises(InvalidInputError, match="reason"):
        await profiles.report_failure("k1", {"status": 429})  # type: ignore[arg-type]
    assert (await profiles.get("k1")).failure_reason is None


async def test_a_clock_without_a_timezone_is_refused_typed(record_store: RecordStore) -> None:
    keys = AuthProfiles(record_store, TENANT, AGENT)
    await keys.add("env:KEY_1", profile_id="k1")
    before = await stored(record_store)
    naive = AuthProfiles(record_store, TENANT, AGENT, clock=lambda: datetime(2030, 1, 1))
    for call in (naive.pick(), naive.report_failure("k1", "x"), naive.add("env:Y")):
        with pytest.raises(InvalidInputError, match="clock"):
            await call
    assert await stored(record_store) == before


async def test_a_cooldown_past_the_calendar_is_refused_typed(record_store: RecordStore) -> None:
    late = datetime(9999, 12, 31, tzinfo=UTC)
    keys = AuthProfiles(record_store, TENANT, AGENT, clock=lambda: late)
    await keys.add("env:KEY_1", profile_id="k1")
    before = await stored(record_store)
    with pytest.raises(InvalidInputError, match="cooldown"):
        await keys.report_failure("k1", "429", retry_after=timedelta(days=2))
    assert await stored(record_store) == before


# -- a damaged stored record ----------------------------------------------------------------

DAMAGED: dict[str, Any] = {
    "not an object": "garbage",
    "format not a number": {"format": "one", "profiles": []},
    "a profile of the wrong shape": {"format": 1, "profiles": [{"id": "k1"}]},
    "uses not a number": {"format": 1, "uses": "many", "profiles": []},
}

ENTRY_POINTS: dict[str, Call] = {
    "list": lambda p: p.list(),
    "get": lambda p: p.get("k1"),
    "add": lambda p: p.add("env:X"),
    "remove": lambda p: p.remove("k1"),
    "pick": lambda p: p.pick(),
    "report_failure": lambda p: p.report_failure("k1", "429"),
    "report_success": lambda p: p.report_success("k1"),
    "reset": lambda p: p.reset(),
    "next_free_at": lambda p: p.next_free_at(),
}


@pytest.mark.parametrize("damage", list(DAMAGED))
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
async def test_a_damaged_record_is_store_corrupt_and_left_alone(
    record_store: RecordStore, damage: str, entry: str
) -> None:
    await record_store.put_record(TENANT, NAMESPACE, AGENT, DAMAGED[damage])
    before = await stored(record_store)
    with pytest.raises(StoreCorruptError) as caught:
        await ENTRY_POINTS[entry](AuthProfiles(record_store, TENANT, AGENT))
    message = str(caught.value)
    assert repr(AGENT) in message
    assert NAMESPACE in message
    assert "delete" in message  # the fix
    assert await stored(record_store) == before


# -- the module's functions -----------------------------------------------------------------


def test_resolve_secret_refuses_a_reference_that_is_not_text() -> None:
    with pytest.raises(InvalidInputError, match="secret reference"):
        resolve_secret(None)  # type: ignore[arg-type]


def test_resolve_secret_refuses_resolvers_that_are_not_a_mapping() -> None:
    with pytest.raises(InvalidInputError, match="resolvers"):
        resolve_secret("vault:a", ["vault"])  # type: ignore[arg-type]


def test_a_failing_resolver_is_a_typed_error_naming_the_scheme() -> None:
    def broken(name: str) -> str:
        raise KeyError(name)

    with pytest.raises(NotFoundError, match="'vault'") as caught:
        resolve_secret("vault:kv/openai", {"vault": broken})
    assert "KeyError" in str(caught.value)


def test_a_resolver_that_returns_no_text_is_a_typed_error() -> None:
    with pytest.raises(InvalidInputError, match="'vault'"):
        resolve_secret("vault:a", {"vault": lambda name: None})  # type: ignore[arg-type,return-value]


def test_a_resolver_s_own_typed_error_goes_through() -> None:
    def missing(name: str) -> str:
        raise NotFoundError(f"no {name}")

    with pytest.raises(NotFoundError, match="no a"):
        resolve_secret("vault:a", {"vault": missing})


def test_mask_secret_refuses_what_is_not_text() -> None:
    with pytest.raises(InvalidInputError, match="mask_secret"):
        mask_secret(42)  # type: ignore[arg-type]


def test_a_profile_built_with_bad_fields_is_a_typed_error_without_the_secret() -> None:
    with pytest.raises(InvalidInputError) as caught:
        AuthProfile(id="k1", agent_id=AGENT, secret_ref="sk-live-0123456789")
    assert "sk-live-0123456789" not in str(caught.value)
    with pytest.raises(InvalidInputError, match="usage_count"):
        AuthProfile(id="k1", agent_id=AGENT, secret_ref="env:K", usage_count="lots")  # type: ignore[arg-type]
