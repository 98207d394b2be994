"""Auth profiles: LRU picking, cooldowns, rotation, persistence and secret hygiene, on the
memory and SQLite stores. Time comes from an injected clock: no sleeps."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, cast

import pytest
from fakes import START, Clock

from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    SchemaVersionError,
)
from statekeeper.runtime.profiles import (
    NAMESPACE,
    AllProfilesCoolingDownError,
    AuthProfiles,
    resolve_secret,
)
from statekeeper.stores.base import RecordStore

TENANT = "alice"


@pytest.fixture
async def profiles(record_store: RecordStore, clock: Clock) -> AuthProfiles:
    keys = AuthProfiles(record_store, TENANT, "bot", clock=clock)
    for n in (1, 2, 3):
        await keys.add(f"env:OPENAI_KEY_{n}", label=f"key {n}", profile_id=f"k{n}")
    return keys


async def test_pick_takes_the_least_recently_used_and_records_the_use(
    profiles: AuthProfiles, clock: Clock
) -> None:
    picked = [(await profiles.pick()).id for _ in range(7)]
    assert picked == ["k1", "k2", "k3", "k1", "k2", "k3", "k1"]  # even with a frozen clock
    k1 = await profiles.get("k1")
    assert (k1.usage_count, k1.last_used) == (3, START)
    await profiles.add("env:OPENAI_KEY_4", profile_id="k4")
    assert (await profiles.pick()).id == "k4"  # never used comes first
    assert (await profiles.pick()).id == "k2"


async def test_a_rate_limit_rotates_to_the_next_profile(profiles: AuthProfiles) -> None:
    first = await profiles.pick()
    following = await profiles.report_failure(first.id, "429 too many requests")
    assert (first.id, following.id) == ("k1", "k2")
    k1 = await profiles.get("k1")
    assert (k1.failure_count, k1.failure_reason) == (1, "429 too many requests")
    assert k1.cooldown_until == START + timedelta(seconds=60)
    assert [(await profiles.pick()).id for _ in range(3)] == ["k3", "k2", "k3"]


async def test_cooldown_doubles_per_failure_in_a_row_up_to_the_maximum(
    record_store: RecordStore, clock: Clock
) -> None:
    keys = AuthProfiles(record_store, TENANT, "bot", clock=clock, max_cooldown=500)
    await keys.add("env:A", profile_id="a")
    await keys.add("env:B", profile_id="b")
    rests = []
    for _ in range(6):
        await keys.report_failure("a", "rate limited")
        a = await keys.get("a")
        assert a.cooldown_until is not None
        rests.append((a.cooldown_until - clock.now).total_seconds())
    assert rests == [60, 120, 240, 480, 500, 500]
    assert (await keys.get("a")).failure_count == 6
    await keys.report_success("a")
    await keys.report_failure("a", "rate limited")
    a = await keys.get("a")
    assert a.failure_count == 1
    assert a.cooldown_until == clock.now + timedelta(seconds=60)


@pytest.mark.parametrize(
    "retry_after",
    [float("nan"), float("inf"), 1e300, 10**400, 366 * 24 * 3600 + 1, "60", True],
)
async def test_a_retry_after_out_of_range_is_refused_typed_and_changes_nothing(
    profiles: AuthProfiles, retry_after: Any
) -> None:
    before = await profiles.list()
    with pytest.raises(InvalidInputError, match="retry_after must be"):
        await profiles.report_failure("k1", "429", retry_after=retry_after)
    assert await profiles.list() == before


async def test_retry_after_sets_the_cooldown(profiles: AuthProfiles, clock: Clock) -> None:
    await profiles.report_failure("k1", "429", retry_after=7)
    assert (await profiles.get("k1")).cooldown_until == START + timedelta(seconds=7)
    await profiles.report_failure("k2", "429", retry_after=timedelta(minutes=90))
    assert (await profiles.get("k2")).cooldown_until == START + timedelta(minutes=90)
    with pytest.raises(InvalidInputError):
        await profiles.report_failure("k3", "429", retry_after=-1)


async def test_a_failure_that_is_not_a_rate_limit_only_counts(profiles: AuthProfiles) -> None:
    await profiles.report_failure("k1", "500 server error", rate_limited=False)
    k1 = await profiles.get("k1")
    assert (k1.failure_count, k1.cooldown_until) == (1, None)


async def test_when_every_profile_cools_down_pick_says_when_the_first_is_free(
    profiles: AuthProfiles, clock: Clock
) -> None:
    await profiles.report_failure("k1", "429", retry_after=300)
    await profiles.report_failure("k2", "429", retry_after=100)
    with pytest.raises(AllProfilesCoolingDownError) as caught:
        await profiles.report_failure("k3", "429", retry_after=200)
    free_at = START + timedelta(seconds=100)
    assert (caught.value.available_at, caught.value.profile_id) == (free_at, "k2")
    assert (await profiles.get("k3")).failure_count == 1  # the failure was stored first
    with pytest.raises(AllProfilesCoolingDownError) as caught:
        await profiles.pick()
    assert caught.value.available_at == free_at
    assert free_at.isoformat() in str(caught.value)
    assert "'k2'" in str(caught.value)
    assert await profiles.next_free_at() == free_at
    clock.advance(100)
    assert (await profiles.pick()).id == "k2"
    assert await profiles.next_free_at() == clock.now


async def test_reset_clears_cooldowns(profiles: AuthProfiles) -> None:
    for pid in ("k1", "k2"):
        await profiles.report_failure(pid, "429")
    await profiles.reset("k1")
    assert (await profiles.get("k1")).cooldown_until is None
    assert (await profiles.get("k2")).cooldown_until is not None
    await profiles.reset()
    assert all(p.cooldown_until is None and p.failure_count == 0 for p in await profiles.list())


async def test_state_survives_a_restart(record_store: RecordStore, clock: Clock) -> None:
    before = AuthProfiles(record_store, TENANT, "bot", clock=clock)
    await before.add("env:A", profile_id="a")
    await before.add("env:B", profile_id="b")
    await before.pick()
    await before.report_failure("b", "quota", retry_after=600)
    after = AuthProfiles(record_store, TENANT, "bot", clock=clock)
    b = await after.get("b")
    assert (b.failure_reason, b.cooldown_until) == ("quota", START + timedelta(seconds=600))
    a = await after.get("a")
    assert a.usage_count == 2  # picked once, then again as the rotation after b failed
    with pytest.raises(AllProfilesCoolingDownError):
        await AuthProfiles(record_store, TENANT, "bot", clock=clock).report_failure("a", "x")
    assert await AuthProfiles(record_store, TENANT, "other-agent").list() == []
    assert await AuthProfiles(record_store, "bob", "bot").list() == []


async def test_two_instances_picking_at_once_take_different_profiles(
    record_store: RecordStore, clock: Clock
) -> None:
    keys = [AuthProfiles(record_store, TENANT, "bot", clock=clock) for _ in range(4)]
    for n in range(4):
        await keys[0].add(f"env:K{n}", profile_id=f"k{n}")
    picked = await asyncio.gather(*(k.pick() for k in keys))
    assert sorted(p.id for p in picked) == ["k0", "k1", "k2", "k3"]
    assert all(p.usage_count == 1 for p in await keys[0].list())


class SlowReads:
    """A store whose reads let other tasks run first: every picker reads the same version."""

    def __init__(self, inner: RecordStore) -> None:
        self.inner = inner
        self.conflicts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get_record(self, *args: Any) -> Any:
        record = await self.inner.get_record(*args)
        await asyncio.sleep(0)
        return record

    async def put_record(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self.inner.put_record(*args, **kwargs)
        except ConflictError:
            self.conflicts += 1
            raise


async def test_racing_pickers_conflict_and_retry_instead_of_sharing_a_profile(
    record_store: RecordStore, clock: Clock
) -> None:
    slow = SlowReads(record_store)
    keys = [AuthProfiles(cast(RecordStore, slow), TENANT, "bot", clock=clock) for _ in range(3)]
    for n in range(3):
        await keys[0].add(f"env:K{n}", profile_id=f"k{n}")
    picked = await asyncio.gather(*(k.pick() for k in keys))
    assert sorted(p.id for p in picked) == ["k0", "k1", "k2"]
    assert slow.conflicts >= 2  # they did read the same version, and lost, and retried


async def test_add_remove_and_errors(profiles: AuthProfiles) -> None:
    with pytest.raises(AlreadyExistsError):
        await profiles.add("env:X", profile_id="k1")
    await profiles.remove("k2")
    assert [p.id for p in await profiles.list()] == ["k1", "k3"]
    with pytest.raises(NotFoundError):
        await profiles.remove("k2")
    with pytest.raises(NotFoundError):
        await profiles.report_failure("nope", "429")
    generated = await profiles.add("vault:kv/openai#key")
    assert generated.id.startswith("key_")


async def test_no_profiles_is_a_typed_error(record_store: RecordStore) -> None:
    with pytest.raises(NotFoundError, match="no auth profiles"):
        await AuthProfiles(record_store, TENANT, "bot").pick()
    assert await AuthProfiles(record_store, TENANT, "bot").next_free_at() is None


async def test_the_secret_reference_never_shows(profiles: AuthProfiles) -> None:
    profile = await profiles.get("k1")
    assert profile.secret_ref == "env:OPENAI_KEY_1"
    for text in (repr(profile), str(profile), repr(await profiles.list())):
        assert "OPENAI_KEY_1" not in text
    assert "k1" in repr(profile)


@pytest.mark.parametrize(
    "value", ["sk-proj-abcdef0123456789", "env: spaced", "", "x" * 300], ids=str.__len__
)
async def test_a_raw_secret_is_refused_without_echoing_it(
    profiles: AuthProfiles, value: str
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        await profiles.add(value)
    if value:
        assert value not in str(caught.value)
        assert caught.value.__cause__ is None


def test_resolve_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SK_TEST_KEY", "s3cret")
    assert resolve_secret("env:SK_TEST_KEY") == "s3cret"
    assert resolve_secret("vault:a/b", {"vault": lambda name: name.upper()}) == "A/B"
    with pytest.raises(NotFoundError):
        resolve_secret("env:SK_TEST_MISSING")


async def test_a_newer_stored_format_is_refused(record_store: RecordStore) -> None:
    await record_store.put_record(TENANT, NAMESPACE, "bot", {"format": 99, "profiles": []})
    with pytest.raises(SchemaVersionError):
        await AuthProfiles(record_store, TENANT, "bot").list()


def test_cooldown_settings_are_checked(record_store: RecordStore) -> None:
    with pytest.raises(InvalidInputError):
        AuthProfiles(record_store, TENANT, "bot", base_cooldown=10, max_cooldown=5)
