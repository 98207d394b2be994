"""Control flags and the limits container."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.core.limits import (
    BudgetFlag,
    ControlFlag,
    IterationFlag,
    Limits,
    TimeFlag,
    TokenFlag,
)
from statekeeper.errors import InvalidInputError, InvalidPayloadError, LimitReachedError

# -- examples ---------------------------------------------------------------------------------


def test_iteration_flag_steps_up_to_the_maximum() -> None:
    flag = IterationFlag(maximum=3)
    for expected in (1, 2, 3):
        assert not flag.reached_limit()
        flag.step()
        assert flag.current == expected
    assert flag.reached_limit()
    assert flag.remaining == 0
    with pytest.raises(LimitReachedError) as info:
        flag.step()
    assert (info.value.name, info.value.current, info.value.maximum) == ("iterations", 3, 3)
    assert str(info.value).startswith("iterations limit reached: 3 of 3;")
    assert flag.current == 3


def test_step_that_would_pass_the_maximum_raises_and_changes_nothing() -> None:
    flag = BudgetFlag(current=0.9, maximum=1.0)
    with pytest.raises(LimitReachedError, match=r"budget limit reached: 0\.9 of 1"):
        flag.step(0.2)
    assert flag.current == 0.9
    flag.step(0.1)
    assert flag.current == 1.0
    assert flag.reached_limit()


def test_float_steps_land_exactly_on_the_maximum() -> None:
    flag = BudgetFlag(maximum=0.3)
    flag.step(0.1)
    flag.step(0.2)  # 0.1 + 0.2 is 0.30000000000000004 in floating point
    assert flag.current == 0.3
    assert flag.reached_limit()


def test_unlimited_flag_never_raises() -> None:
    flag = TokenFlag()
    for _ in range(5):
        flag.step(1_000_000)
    assert flag.current == 5_000_000
    assert not flag.reached_limit()
    assert flag.remaining is None
    flag.check()
    assert not flag.increase_limit(headless=False)


def test_zero_maximum_is_reached_at_once() -> None:
    flag = IterationFlag(maximum=0)
    assert flag.reached_limit()
    with pytest.raises(LimitReachedError):
        flag.step()


def test_set_current_may_pass_the_maximum() -> None:
    flag = BudgetFlag(maximum=1.0, increase_amount=0.5)
    flag.set_current(1.25)
    assert flag.current == 1.25
    assert flag.reached_limit()
    assert flag.remaining == 0
    with pytest.raises(LimitReachedError, match=r"budget limit reached: 1\.25 of 1"):
        flag.check()
    # The raised maximum gives full headroom above the overshoot.
    assert flag.increase_limit(headless=False)
    assert flag.maximum == 1.75
    assert not flag.reached_limit()
    flag.check()


def test_increase_limit_only_interactively_and_at_the_limit() -> None:
    flag = IterationFlag(maximum=2, increase_amount=10)
    assert not flag.increase_limit(headless=False)  # not reached yet
    assert flag.maximum == 2
    flag.step(2)
    assert not flag.increase_limit(headless=True)
    assert flag.maximum == 2
    assert flag.increase_limit(headless=False)
    assert flag.maximum == 12
    flag.step()
    assert flag.current == 3


def test_increase_limit_with_zero_amount_changes_nothing() -> None:
    flag = IterationFlag(current=5, maximum=5)
    assert not flag.increase_limit(headless=False)
    assert flag.maximum == 5


def test_flag_kinds_and_defaults() -> None:
    assert IterationFlag().name == "iterations"
    assert BudgetFlag().name == "budget"
    assert TokenFlag().name == "tokens"
    assert TimeFlag().name == "time"
    assert ControlFlag().maximum is None
    assert isinstance(IterationFlag(current=2.0).current, int)
    assert isinstance(BudgetFlag(current=2).current, float)
    time = TimeFlag(maximum=30.0)
    time.set_current(12.5)
    assert time.remaining == 17.5


@pytest.mark.parametrize(
    "fields",
    [
        {"current": -1},
        {"maximum": -0.5},
        {"increase_amount": -1},
        {"current": math.nan},
        {"maximum": math.inf},
        {"increase_amount": math.nan},
        {"name": ""},
        {"unknown": 1},
    ],
)
def test_invalid_flag_fields_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidPayloadError):
        BudgetFlag(**fields)


def test_iteration_flag_needs_whole_numbers() -> None:
    with pytest.raises(InvalidPayloadError, match="fractional"):
        IterationFlag(current=1.5)
    flag = IterationFlag(maximum=5)
    with pytest.raises(InvalidInputError, match="iterations step amount must be a whole number"):
        flag.step(1.5)
    assert flag.current == 0


@pytest.mark.parametrize("amount", [-1, math.nan, math.inf, -math.inf])
def test_bad_step_amounts_are_refused(amount: float) -> None:
    flag = BudgetFlag(maximum=10.0)
    with pytest.raises(InvalidInputError, match="budget step amount must be a finite number >= 0"):
        flag.step(amount)
    with pytest.raises(InvalidInputError, match="budget current value must be a finite number"):
        flag.set_current(amount)
    assert flag.current == 0


@pytest.mark.parametrize("amount", [True, "1", None])
def test_non_numbers_are_refused(amount: object) -> None:
    flag = IterationFlag()
    with pytest.raises(InvalidInputError, match="must be a number"):
        flag.step(amount)  # type: ignore[arg-type]
    assert flag.current == 0


def test_assignment_is_validated() -> None:
    flag = BudgetFlag(maximum=1.0)
    with pytest.raises(InvalidPayloadError):
        flag.maximum = -1.0
    with pytest.raises(InvalidPayloadError):
        flag.current = math.nan
    assert (flag.current, flag.maximum) == (0.0, 1.0)


def test_flag_json_round_trip() -> None:
    flag = IterationFlag(current=3, maximum=10, increase_amount=5)
    data = json.loads(json.dumps(flag.to_dict()))
    assert data == {"name": "iterations", "current": 3, "maximum": 10, "increase_amount": 5}
    restored = IterationFlag.from_dict(data)
    assert restored == flag
    assert type(restored) is IterationFlag
    with pytest.raises(InvalidPayloadError, match="invalid IterationFlag: current"):
        IterationFlag.from_dict({"current": -3})


# -- the container -----------------------------------------------------------------------------


def test_limits_check_raises_the_first_reached_limit() -> None:
    limits = Limits(
        iterations=IterationFlag(maximum=10),
        budget=BudgetFlag(maximum=1.0),
        tokens=TokenFlag(maximum=100),
    )
    limits.check()
    assert limits.reached() == []
    limits.tokens.set_current(100)  # type: ignore[union-attr]
    with pytest.raises(LimitReachedError, match="tokens"):
        limits.check()
    limits.budget.set_current(2.0)  # type: ignore[union-attr]
    with pytest.raises(LimitReachedError, match="budget"):
        limits.check()
    assert [flag.name for flag in limits.reached()] == ["budget", "tokens"]


def test_limits_defaults_and_flags() -> None:
    limits = Limits()
    assert [flag.name for flag in limits.flags()] == ["iterations"]
    assert limits.iterations.maximum is None
    limits.check()
    full = Limits(budget=BudgetFlag(), tokens=TokenFlag(), time=TimeFlag())
    assert [flag.name for flag in full.flags()] == ["iterations", "budget", "tokens", "time"]


def test_limits_increase_limits() -> None:
    limits = Limits(
        iterations=IterationFlag(current=5, maximum=5, increase_amount=5),
        budget=BudgetFlag(current=1.0, maximum=1.0, increase_amount=0.5),
        time=TimeFlag(maximum=60.0, increase_amount=60.0),
    )
    assert not limits.increase_limits(headless=True)
    assert len(limits.reached()) == 2
    assert limits.increase_limits(headless=False)
    assert limits.reached() == []
    assert limits.iterations.maximum == 10
    assert limits.budget is not None
    assert limits.budget.maximum == 1.5
    assert limits.time is not None
    assert limits.time.maximum == 60.0  # not reached, not raised


def test_limits_json_round_trip_and_errors() -> None:
    limits = Limits(iterations=IterationFlag(current=2, maximum=9), budget=BudgetFlag(maximum=3))
    text = json.dumps(limits.to_dict(), allow_nan=False)
    restored = Limits.from_dict(json.loads(text))
    assert restored == limits
    assert restored.tokens is None
    assert isinstance(restored.budget, BudgetFlag)
    with pytest.raises(InvalidPayloadError, match=r"invalid limits: budget\.maximum"):
        Limits.from_dict({"budget": {"maximum": -1}})
    with pytest.raises(InvalidPayloadError):
        Limits.from_dict({"speed": {}})
    with pytest.raises(InvalidPayloadError):
        Limits.from_dict([1, 2])


# -- properties ------------------------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("step"), st.integers(min_value=0, max_value=4)),
        st.tuples(st.just("increase"), st.booleans()),
    ),
    max_size=40,
)


@given(
    maximum=st.integers(min_value=0, max_value=20),
    increase=st.integers(min_value=0, max_value=5),
    ops=OPS,
)
def test_iteration_steps_never_pass_the_maximum(
    maximum: int, increase: int, ops: list[tuple[str, int | bool]]
) -> None:
    flag = IterationFlag(maximum=maximum, increase_amount=increase)
    for op, arg in ops:
        before = flag.model_copy()
        assert before.maximum is not None
        if op == "step":
            amount = int(arg)
            if before.reached_limit() or before.current + amount > before.maximum:
                with pytest.raises(LimitReachedError):
                    flag.step(amount)
                assert flag == before
            else:
                flag.step(amount)
                assert flag.current == before.current + amount
        else:
            headless = bool(arg)
            expected = not headless and before.reached_limit() and increase > 0
            assert flag.increase_limit(headless=headless) is expected
            assert flag.maximum == before.maximum + (increase if expected else 0)
            assert flag.current == before.current
        assert flag.maximum is not None
        assert flag.current <= flag.maximum


@given(
    maximum=st.floats(min_value=0, max_value=1e6),
    amounts=st.lists(st.floats(min_value=0, max_value=1e5), max_size=30),
    headless=st.booleans(),
)
def test_budget_steps_never_pass_the_maximum(
    maximum: float, amounts: list[float], headless: bool
) -> None:
    flag = BudgetFlag(maximum=maximum, increase_amount=1.0)
    for amount in amounts:
        before = flag.current
        try:
            flag.step(amount)
        except LimitReachedError:
            assert flag.current == before
            expected = not headless and flag.reached_limit()
            assert flag.increase_limit(headless=headless) is expected
        assert flag.maximum is not None
        assert flag.current <= flag.maximum
        assert flag.remaining is not None
        assert flag.remaining >= 0
    if headless:
        assert flag.maximum == maximum


def test_raise_to_sets_a_higher_maximum_headless_or_not() -> None:
    flag = BudgetFlag(maximum=1.0)
    flag.set_current(1.2)
    with pytest.raises(InvalidInputError, match=r"leaves no room, 1\.2 is used"):
        flag.raise_to(1.1)
    with pytest.raises(InvalidInputError, match="must be a finite number"):
        flag.raise_to(float("nan"))
    assert flag.maximum == 1.0
    flag.raise_to(2.0)
    assert flag.maximum == 2.0
    assert not flag.reached_limit()
    with pytest.raises(InvalidInputError, match="never lowers"):
        flag.raise_to(1.5)
    with pytest.raises(InvalidInputError, match="whole number"):
        IterationFlag(maximum=2).raise_to(2.5)
    with pytest.raises(InvalidInputError, match="unlimited"):
        TokenFlag().raise_to(10)


def test_limit_error_takes_a_hint() -> None:
    error = LimitReachedError("budget", 1.2, 1.0, hint="call raise_limits('r', budget=...)")
    assert str(error) == "budget limit reached: 1.2 of 1; call raise_limits('r', budget=...)"
