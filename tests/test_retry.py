"""`retry_on_conflict`: capped, jittered backoff (fake sleep and random: no real waiting)."""

from __future__ import annotations

import pytest

from statekeeper.errors import ConflictError, InvalidInputError
from statekeeper.retry import retry_on_conflict


async def test_backoff_is_capped_and_jittered() -> None:
    slept: list[float] = []
    draws = iter([0.0, 1.0] * 20)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def always_conflicts() -> None:
        raise ConflictError("lost the race")

    with pytest.raises(ConflictError):
        await retry_on_conflict(
            always_conflicts,
            attempts=20,
            backoff=0.1,
            max_backoff=2.0,
            sleep=sleep,
            random=lambda: next(draws),
        )
    assert len(slept) == 19
    assert max(slept) <= 2.0
    assert slept[:2] == [pytest.approx(0.05), pytest.approx(0.2)]  # jitter: half to whole
    assert slept[-2:] == [pytest.approx(2.0), pytest.approx(1.0)]  # capped
    assert sum(slept) < 40


async def test_default_cap_bounds_a_long_stall() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    calls = 0

    async def succeeds_late() -> str:
        nonlocal calls
        calls += 1
        if calls < 12:
            raise ConflictError("lost the race")
        return "done"

    assert await retry_on_conflict(succeeds_late, attempts=12, backoff=0.5, sleep=sleep) == "done"
    assert max(slept) <= 5.0


@pytest.mark.parametrize("kwargs", [{"attempts": 0}, {"backoff": -1.0}, {"max_backoff": -1.0}])
async def test_bad_settings_are_typed(kwargs: dict[str, float]) -> None:
    async def operation() -> None:
        return None

    with pytest.raises(InvalidInputError):
        await retry_on_conflict(operation, **kwargs)  # type: ignore[arg-type]
