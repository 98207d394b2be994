"""Token usage, per-model metrics, snapshots / diffs and delegation records."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.core.metrics import (
    DelegationInfo,
    Metrics,
    ModelUsage,
    TokenUsage,
    local_metrics,
)
from statekeeper.errors import InvalidInputError, InvalidPayloadError, StatekeeperError

# -- token usage ---------------------------------------------------------------------------


def test_token_usage_total_and_arithmetic() -> None:
    a = TokenUsage(input_tokens=100, output_tokens=20, cache_read_tokens=50, reasoning_tokens=5)
    b = TokenUsage(input_tokens=10, output_tokens=30, cache_write_tokens=7)
    assert a.total == 120
    assert a + b == TokenUsage(
        input_tokens=110,
        output_tokens=50,
        cache_read_tokens=50,
        cache_write_tokens=7,
        reasoning_tokens=5,
    )
    assert (a + b) - b == a
    assert b - a == TokenUsage(output_tokens=10, cache_write_tokens=7)  # clamped at 0
    assert TokenUsage().is_zero()
    assert not b.is_zero()


def test_token_usage_reads_prompt_and_completion_names() -> None:
    usage = TokenUsage.model_validate({"prompt_tokens": 12, "completion_tokens": 3})
    assert (usage.input_tokens, usage.output_tokens) == (12, 3)
    assert usage.model_dump() == {
        "input_tokens": 12,
        "output_tokens": 3,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
    }


@pytest.mark.parametrize("fields", [{"input_tokens": -1}, {"output_tokens": 1.5}, {"x": 1}])
def test_token_usage_refuses_bad_counts_with_a_typed_error(fields: dict[str, object]) -> None:
    (name,) = fields
    with pytest.raises(InvalidPayloadError, match=name):
        TokenUsage.model_validate(fields)
    with pytest.raises(InvalidPayloadError, match=name):
        TokenUsage(**fields)  # type: ignore[arg-type]


def test_token_usage_is_immutable() -> None:
    usage = TokenUsage(input_tokens=1)
    with pytest.raises(InvalidPayloadError, match="frozen"):
        usage.input_tokens = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ModelUsage(cost=-1), "cost"),
        (lambda: ModelUsage(calls=-2), "calls"),
        (lambda: Metrics(models={"m": {"calls": -1}}), "calls"),
        (lambda: DelegationInfo(delegate_level=-1), "delegate_level"),
    ],
)
def test_metrics_models_raise_typed_errors(build: Callable[[], object], field: str) -> None:
    with pytest.raises(InvalidPayloadError, match=field) as caught:
        build()
    assert isinstance(caught.value, StatekeeperError)


# -- metrics --------------------------------------------------------------------------------


def test_add_accumulates_per_model() -> None:
    metrics = Metrics()
    metrics.add("gpt-4o", cost=0.1, usage=TokenUsage(input_tokens=10, output_tokens=5), latency=1.5)
    metrics.add("gpt-4o", cost=0.2, usage=TokenUsage(input_tokens=1))
    metrics.add("claude", cost=0.05, latency=0.25)
    assert metrics.models["gpt-4o"] == ModelUsage(
        cost=0.3,
        usage=TokenUsage(input_tokens=11, output_tokens=5),
        calls=2,
        latency_seconds=1.5,
    )
    assert metrics.accumulated_cost == 0.35  # 0.1 + 0.2 + 0.05 is not 0.35 in raw floats
    assert metrics.usage == TokenUsage(input_tokens=11, output_tokens=5)
    assert metrics.calls == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cost": -0.01}, "cost: Input should be greater than or equal to 0"),
        ({"cost": math.nan}, "cost: Input should be a finite number"),
        ({"latency": math.inf}, "latency_seconds"),
        ({"calls": -1}, "calls"),
    ],
)
def test_add_refuses_bad_values(kwargs: dict[str, float], message: str) -> None:
    metrics = Metrics()
    with pytest.raises(InvalidInputError, match=message):
        metrics.add("m", **kwargs)  # type: ignore[arg-type]
    assert metrics == Metrics()


@pytest.mark.parametrize("model", ["", 3, "x" * 300])
def test_add_refuses_bad_model_names(model: object) -> None:
    with pytest.raises(InvalidInputError, match="model name"):
        Metrics().add(model, cost=1.0)  # type: ignore[arg-type]


def test_snapshot_is_independent() -> None:
    metrics = Metrics()
    metrics.add("m", cost=1.0)
    snapshot = metrics.snapshot()
    metrics.add("m", cost=2.0)
    metrics.add("n", cost=1.0)
    assert snapshot.accumulated_cost == 1.0
    assert set(snapshot.models) == {"m"}


def test_diff_gives_usage_since_snapshot_and_never_negative() -> None:
    metrics = Metrics()
    metrics.add("m", cost=1.0, usage=TokenUsage(input_tokens=100))
    snapshot = metrics.snapshot()
    metrics.add("m", cost=0.5, usage=TokenUsage(input_tokens=20))
    metrics.add("n", cost=0.25)
    local = metrics - snapshot
    assert local == metrics.diff(snapshot)
    assert local.models == {
        "m": ModelUsage(cost=0.5, usage=TokenUsage(input_tokens=20), calls=1),
        "n": ModelUsage(cost=0.25, calls=1),
    }
    assert snapshot - metrics == Metrics()  # nothing negative, empty entries dropped


def test_empty_entries_are_dropped() -> None:
    metrics = Metrics(models={"m": ModelUsage(), "n": ModelUsage(calls=1)})
    assert set(metrics.models) == {"n"}
    metrics.add("z", calls=0)
    assert "z" not in metrics.models


def test_merge_adds_in_place() -> None:
    a = Metrics()
    a.add("m", cost=1.0)
    b = Metrics()
    b.add("m", cost=2.0)
    b.add("n", usage=TokenUsage(output_tokens=4))
    total = a + b
    a.merge(b)
    assert a == total
    assert a.accumulated_cost == 3.0
    assert a.models["n"].usage.output_tokens == 4


def test_metrics_json_round_trip() -> None:
    metrics = Metrics()
    metrics.add("m", cost=0.1, usage=TokenUsage(input_tokens=3, cache_read_tokens=2), latency=0.2)
    data = json.loads(json.dumps(metrics.to_dict(), allow_nan=False))
    assert data["accumulated_cost"] == 0.1
    assert data["models"]["m"]["usage"]["cache_read_tokens"] == 2
    assert Metrics.from_dict(data) == metrics


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"models": {"m": {"cost": -1}}},
        {"models": {"m": {"cost": "NaN"}}},
        {"models": {"": {"cost": 1}}},
        {"model": {}},
    ],
)
def test_metrics_from_dict_refuses_bad_payloads(data: object) -> None:
    with pytest.raises(InvalidPayloadError, match="invalid metrics"):
        Metrics.from_dict(data)


# -- delegation -------------------------------------------------------------------------------


def test_child_of_level_and_info() -> None:
    parent_metrics = Metrics()
    parent_metrics.add("m", cost=1.0)
    child = DelegationInfo.child_of(0, parent_metrics, 7, parent_run_id="run_a")
    assert (child.delegate_level, child.parent_iteration, child.parent_run_id) == (1, 7, "run_a")
    grandchild = DelegationInfo.child_of(child, Metrics(), 2, parent_run_id="run_b")
    assert grandchild.delegate_level == 2
    root = DelegationInfo()
    assert root.is_root
    assert not child.is_root
    assert DelegationInfo.child_of(root, Metrics(), 0).delegate_level == 1


def test_child_records_a_copy_of_the_parent_metrics() -> None:
    shared = Metrics()
    shared.add("m", cost=1.0, usage=TokenUsage(input_tokens=100))
    child = DelegationInfo.child_of(0, shared, 3)
    shared.add("m", cost=0.5, usage=TokenUsage(input_tokens=10))  # the child's own call
    assert child.parent_metrics_snapshot.accumulated_cost == 1.0
    local = child.local_metrics(shared)
    assert local == local_metrics(shared, child.parent_metrics_snapshot)
    assert local.accumulated_cost == 0.5
    assert local.usage == TokenUsage(input_tokens=10)


@pytest.mark.parametrize(
    ("parent", "iteration", "run_id", "message"),
    [
        (-1, 0, None, "delegate level"),
        (True, 0, None, "delegate level"),
        (0, -1, None, "parent_iteration"),
        (0, 0, "../x", "parent_run_id"),
    ],
)
def test_child_of_refuses_bad_input(
    parent: int, iteration: int, run_id: str | None, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        DelegationInfo.child_of(parent, Metrics(), iteration, parent_run_id=run_id)


def test_root_cannot_have_a_parent() -> None:
    with pytest.raises(InvalidPayloadError, match="root run"):
        DelegationInfo(parent_run_id="run_a")


def test_delegation_json_round_trip() -> None:
    metrics = Metrics()
    metrics.add("m", cost=0.3, usage=TokenUsage(output_tokens=9))
    info = DelegationInfo.child_of(1, metrics, 4, parent_run_id="run_x")
    data = json.loads(json.dumps(info.to_dict(), allow_nan=False))
    assert data["delegate_level"] == 2
    assert data["parent_metrics_snapshot"]["accumulated_cost"] == 0.3
    assert DelegationInfo.from_dict(data) == info
    with pytest.raises(InvalidPayloadError, match="invalid delegation info"):
        DelegationInfo.from_dict({**data, "delegate_level": -1})
    with pytest.raises(InvalidPayloadError, match="invalid metrics"):
        DelegationInfo.from_dict({**data, "parent_metrics_snapshot": {"models": 1}})


# -- properties -------------------------------------------------------------------------------

COUNTS = st.integers(min_value=0, max_value=10**9)
USAGES = st.builds(
    TokenUsage,
    input_tokens=COUNTS,
    output_tokens=COUNTS,
    cache_read_tokens=COUNTS,
    cache_write_tokens=COUNTS,
    reasoning_tokens=COUNTS,
)
MODEL_USAGES = st.builds(
    ModelUsage,
    cost=st.floats(min_value=0, max_value=1e5),
    usage=USAGES,
    calls=st.integers(min_value=0, max_value=10**6),
    latency_seconds=st.floats(min_value=0, max_value=1e5),
)
METRICS = st.builds(
    Metrics, models=st.dictionaries(st.sampled_from(["a", "b", "gpt-4o", "claude"]), MODEL_USAGES)
)


@given(a=METRICS, b=METRICS)
def test_sum_minus_part_is_the_other_part(a: Metrics, b: Metrics) -> None:
    assert (a + b) - a == b
    assert (a + b) - b == a
    assert a + b == b + a


@given(a=METRICS, b=METRICS)
def test_diff_is_never_negative(a: Metrics, b: Metrics) -> None:
    for entry in (a - b).models.values():
        assert entry.cost >= 0
        assert entry.calls >= 0
        assert entry.latency_seconds >= 0
        assert all(count >= 0 for count in entry.usage.model_dump().values())
    assert a - a == Metrics()


@given(
    parent=METRICS,
    calls=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "new"]),
            st.floats(min_value=0, max_value=100),
            USAGES,
        ),
        max_size=10,
    ),
)
def test_snapshot_diff_gives_child_only_usage(
    parent: Metrics, calls: list[tuple[str, float, TokenUsage]]
) -> None:
    info = DelegationInfo.child_of(0, parent, 0)
    child_only = Metrics()
    for model, cost, usage in calls:
        parent.add(model, cost=cost, usage=usage)
        child_only.add(model, cost=cost, usage=usage)
    assert info.local_metrics(parent) == child_only


@given(metrics=METRICS)
def test_metrics_json_round_trip_property(metrics: Metrics) -> None:
    text = json.dumps(metrics.to_dict(), allow_nan=False)
    assert Metrics.from_dict(json.loads(text)) == metrics
