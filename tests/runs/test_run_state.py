"""`RunState` against frozen fixtures of every schema version, and its JSON round trip.

The fixtures in ``tests/fixtures/run_state`` are never regenerated: they are what each
schema version wrote (see their README). A new schema version adds a folder.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits, TimeFlag, TokenFlag
from statekeeper.core.messages import Role
from statekeeper.core.metrics import DelegationInfo, Metrics, ModelUsage, TokenUsage
from statekeeper.errors import InvalidInputError, InvalidPayloadError, SchemaVersionError
from statekeeper.runs.state import (
    CURRENT_SCHEMA_VERSION,
    MIGRATIONS,
    SCHEMA_VERSION_SUMMARIES,
    ApprovalDecision,
    ErrorDetails,
    GuardrailResult,
    Interruption,
    RunState,
    TraceState,
    migrate,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "run_state"
VERSIONED = sorted(FIXTURES.glob("v*/*.json"))


def read(rel: str) -> str:
    return (FIXTURES / rel).read_text(encoding="utf-8")


def load(rel: str) -> RunState:
    return RunState.from_json(read(rel))


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def plus_v6(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (an exported state older than v6) with what v6 added: every decision's
    ``edited_arguments: null``, and schema version 6."""
    decisions = [{**d, "edited_arguments": None} for d in raw.get("decisions", [])]
    settled = [{**d, "edited_arguments": None} for d in raw.get("settled_decisions", [])]
    return {**raw, "schema_version": 6, "decisions": decisions, "settled_decisions": settled}


# -- the fixtures themselves ------------------------------------------------------------


def test_fixtures_are_frozen() -> None:
    """Every fixture is listed in SHA256SUMS with its hash: editing one fails here.

    A new fixture gets a new line; an existing line never changes (see the README).
    """
    listed: dict[str, str] = {}
    for line in read("SHA256SUMS").splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name] = digest
    on_disk = {
        p.relative_to(FIXTURES).as_posix()
        for p in FIXTURES.rglob("*")
        if p.is_file() and p.name not in ("README.md", "SHA256SUMS", ".gitattributes")
    }
    assert on_disk == set(listed), "list every fixture in SHA256SUMS (and never edit one)"
    for name, digest in listed.items():
        actual = hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest()
        assert actual == digest, f"fixture {name} was edited; add a new fixture instead"


def test_every_schema_version_has_fixtures() -> None:
    for version in SCHEMA_VERSION_SUMMARIES:
        for name in ("minimal.json", "features.json"):
            assert (FIXTURES / f"v{version}" / name).is_file(), f"v{version}/{name} is missing"


@pytest.mark.parametrize("path", VERSIONED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_loads_to_the_current_version(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert f"v{raw['schema_version']}" == path.parent.name

    state = RunState.from_json(path.read_text(encoding="utf-8"))

    assert state.schema_version == CURRENT_SCHEMA_VERSION
    assert state.run_id == raw["run_id"]
    assert state.tenant == raw["tenant"]
    assert state.session_id == raw["session_id"]
    assert state.status == raw["status"]
    if "trace" in raw:
        assert state.trace.trace_id == raw["trace"]["trace_id"]
    else:  # v1 had none: the migration derives it from the run id
        assert state.trace.trace_id == f"trace_{raw['run_id']}"
    assert all(g.kind for g in state.guardrails)
    assert state.error is None or state.error.type
    assert len(state.messages()) == len(raw["items"])
    # Once loaded, it is a current state: its own export reads back the same.
    assert RunState.from_json(state.to_json()) == state


# -- version 1 --------------------------------------------------------------------------


def test_v1_minimal_migrates() -> None:
    state = load("v1/minimal.json")

    assert state.run_id == "run_minimal_v1"
    assert (state.tenant, state.session_id, state.agent) == (
        "tenant-a",
        "sess_minimal_v1",
        "assistant",
    )
    assert state.status == AgentStatus.INITIALIZING
    assert state.revision == 0
    assert state.delegation is None
    assert state.delegate_level == 0
    assert state.trace.spans == 0
    assert state.trace.current_span is None
    assert state.guardrails == []
    assert state.error is None
    assert state.limits == Limits()
    assert state.metrics == Metrics()
    assert state.created_at == when("2024-11-02T08:00:00Z")
    state.validate_for_resume()


def test_v1_features_migrate_through_the_chain() -> None:
    state = load("v1/features.json")

    # What the v1 -> v2 step adds.
    assert state.trace.trace_id.startswith("trace_")
    assert state.trace.spans == 0
    assert [(g.name, g.kind, g.triggered, g.turn) for g in state.guardrails] == [
        ("amount_limit", "input", True, 3),
        ("pii_filter", "input", False, 1),
    ]
    assert state.guardrails[0].info == {"amount": 250, "limit": 100}
    assert state.error == ErrorDetails(
        type="Error",
        message="budget limit reached: 0.75 of 0.75",
        turn=3,
        data={"limit": "budget"},
        at=when("2024-11-02T08:01:30Z"),
    )
    assert state.delegation is None
    assert state.revision == 0

    # What v1 already had, unchanged.
    assert state.group_id == "group_billing_3"
    assert state.status == AgentStatus.ERROR
    assert state.headless is False
    assert state.turn == 3
    assert state.limits.iterations.current == 3
    assert state.limits.iterations.maximum == 10
    assert state.limits.budget is not None
    assert state.limits.budget.reached_limit()
    assert state.limits.tokens is None
    assert state.metrics.accumulated_cost == 0.75
    assert state.metrics.usage == TokenUsage(input_tokens=5000, output_tokens=800)
    assert state.metrics.calls == 3
    assert state.tool_use == {"lookup_invoice": 2, "refund": 1}
    assert state.total_tool_calls == 3
    assert [i.call_id for i in state.interruptions] == ["call_refund_1", "call_refund_2"]
    assert state.interruptions[0].prompt == "Refund 250 on INV-9?"
    assert state.interruptions[0].message["content"][0]["id"] == "call_refund_1"
    assert len(state.decisions) == 1
    decision = state.decisions[0]
    assert (decision.call_id, decision.approved, decision.decided_by) == (
        "call_refund_1",
        False,
        "carol",
    )
    assert state.always == {"lookup_invoice": True}
    assert state.context == {"customer_id": "cus_881", "plan": "pro", "flags": ["vip"]}
    assert state.transcript_seq == 9
    assert [m.role for m in state.messages()] == [Role.SYSTEM, Role.USER]
    assert state.updated_at == when("2024-11-02T08:01:30Z")


def test_migrate_steps_one_version_at_a_time_without_touching_its_input() -> None:
    raw = json.loads(read("v1/features.json"))
    before = json.loads(read("v1/features.json"))

    migrated = migrate(raw)

    assert raw == before
    assert migrated["schema_version"] == CURRENT_SCHEMA_VERSION
    assert "kind" not in raw["guardrails"][0]
    assert migrated["guardrails"][0]["kind"] == "input"
    assert migrated["error"]["type"] == "Error"


def test_v1_guardrail_keeps_its_own_kind_if_it_had_one() -> None:
    raw = json.loads(read("v1/minimal.json"))
    raw["guardrails"] = [{"name": "tone", "kind": "output", "triggered": True}]
    state = RunState.from_data(raw)
    assert state.guardrails[0].kind == "output"


# -- version 2 ---------------------------------------------------------------------------


def test_v2_minimal() -> None:
    state = load("v2/minimal.json")

    assert state == RunState(
        run_id="run_minimal_v2",
        tenant="tenant-a",
        session_id="sess_minimal",
        agent="assistant",
        trace=TraceState(trace_id="trace_minimal_v2"),
        created_at=when("2025-03-14T09:26:53.589793Z"),
        updated_at=when("2025-03-14T09:26:53.589793Z"),
        items=[],
    )
    state.validate_for_resume()


def test_v2_features() -> None:
    state = load("v2/features.json")

    assert state.run_id == "run_features_v2"
    assert state.group_id == "group_incident_7"
    assert state.status == AgentStatus.ERROR
    assert (state.turn, state.revision, state.transcript_seq) == (4, 5, 12)
    assert state.headless is False
    assert state.limits == Limits(
        iterations=IterationFlag(current=4, maximum=20, increase_amount=10),
        budget=BudgetFlag(current=0.021875, maximum=2.5, increase_amount=1.0),
        tokens=TokenFlag(current=4070, maximum=100000),
        time=TimeFlag(current=11.5, maximum=600.0),
    )
    assert set(state.metrics.models) == {"gpt-4o", "gpt-4o-mini"}
    assert state.metrics.accumulated_cost == 0.021875
    assert state.metrics.calls == 5
    assert state.tool_use == {"search": 3, "send_email": 1, "delete_file": 0}
    assert {g.kind: g.name for g in state.guardrails} == {
        "input": "pii_filter",
        "output": "tone_check",
        "tool_input": "path_allowlist",
        "tool_output": "secret_scan",
    }
    assert state.guardrails[1].info == {"reason": "too informal", "score": 0.82}
    assert [i.call_id for i in state.interruptions] == ["call_send_1", "call_delete_2"]
    assert all(isinstance(i, Interruption) for i in state.interruptions)
    assert state.interruptions[0].message["id"] == "msg_0004"
    assert [(d.call_id, d.approved, d.always) for d in state.decisions] == [
        ("call_send_1", True, True),
        ("call_delete_2", False, False),
    ]
    assert state.always == {"send_email": True, "delete_file": False}
    assert state.error is not None
    assert state.error.type == "LimitReachedError"
    assert state.error.data == {"limit": "budget", "current": 2.5, "maximum": 2.5}
    assert state.context == {
        "user_id": "u-42",
        "locale": "en-GB",
        "preferences": {"tone": "brief"},
        "tags": ["incident", "p1"],
    }
    assert state.trace == TraceState(
        trace_id="trace_features_v2", spans=7, current_span="span_0007"
    )
    assert state.delegation is not None
    assert state.delegation.parent_run_id == "run_parent_v2"
    assert state.delegate_level == 1
    assert state.delegation.parent_iteration == 3
    assert state.delegation.parent_metrics_snapshot.accumulated_cost == 0.0125
    local = state.local_metrics
    assert local.models["gpt-4o"].calls == 2
    assert local.models["gpt-4o"].cost == 0.009
    assert local.models["gpt-4o-mini"].calls == 1
    assert state.pending_input[0]["id"] == "msg_0005"
    assert state.metadata == {"source": "fixture", "ticket": "INC-7", "priority": 1}
    assert [m.role for m in state.messages()] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.USER,
    ]
    assert state.messages()[2].tool_calls[0].name == "search"
    assert state.child_usage == {}  # what the v2 -> v3 step adds


def test_v2_export_is_v2_plus_what_v3_to_v6_added() -> None:
    for name in ("v2/minimal.json", "v2/features.json"):
        raw = json.loads(read(name))
        again = json.loads(load(name).to_json())
        trace = {**raw["trace"], "traceparent": None}
        added = {"child_usage": {}, "trace": trace, "settled_decisions": []}
        assert again == plus_v6({**raw, **added})


# -- version 3 --------------------------------------------------------------------------


def test_v3_minimal() -> None:
    state = load("v3/minimal.json")

    assert state == RunState(
        run_id="run_minimal_v3",
        tenant="tenant-a",
        session_id="sess_minimal",
        agent="assistant",
        trace=TraceState(trace_id="trace_minimal_v3"),
        created_at=when("2025-03-14T09:26:53.589793Z"),
        updated_at=when("2025-03-14T09:26:53.589793Z"),
        items=[],
    )
    state.validate_for_resume()


def test_v3_features() -> None:
    state = load("v3/features.json")
    v2 = load("v2/features.json")

    assert state.run_id == "run_features_v3"
    assert state.trace.trace_id == "trace_features_v3"
    assert state.delegation is not None
    assert state.delegation.parent_run_id == "run_parent_v3"
    # A grandchild's usage, rolled up: it is part of the metrics, and absorbing the
    # same report again changes nothing.
    assert set(state.child_usage) == {"run_grandchild_v3"}
    mini = state.child_usage["run_grandchild_v3"].models["gpt-4o-mini"]
    assert (mini.cost, mini.calls, mini.usage.input_tokens) == (0.000375, 1, 900)
    assert state.metrics == v2.metrics
    assert not state.absorb_child_usage(state.child_usage)
    assert state.metrics == v2.metrics
    same = ("limits", "tool_use", "guardrails", "interruptions", "decisions", "error")
    assert all(getattr(state, name) == getattr(v2, name) for name in same)
    assert state.messages() == v2.messages()


def test_v3_export_is_v3_plus_what_v4_to_v6_added() -> None:
    for name in ("v3/minimal.json", "v3/features.json"):
        raw = json.loads(read(name))
        trace = {**raw["trace"], "traceparent": None}  # never traced with OpenTelemetry
        added = {"trace": trace, "settled_decisions": []}
        assert json.loads(load(name).to_json()) == plus_v6({**raw, **added})


# -- version 4 --------------------------------------------------------------------------


def test_v4_minimal() -> None:
    state = load("v4/minimal.json")

    assert state == RunState(
        run_id="run_minimal_v4",
        tenant="tenant-a",
        session_id="sess_minimal",
        agent="assistant",
        trace=TraceState(trace_id="trace_minimal_v4"),
        created_at=when("2025-03-14T09:26:53.589793Z"),
        updated_at=when("2025-03-14T09:26:53.589793Z"),
        items=[],
    )


def test_v4_features_keep_the_w3c_trace() -> None:
    state = load("v4/features.json")
    v3 = load("v3/features.json")

    assert state.trace == TraceState(
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        spans=7,
        current_span="53995c3f42cd8ad8",
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    same = ("metrics", "limits", "tool_use", "guardrails", "error")
    assert all(getattr(state, name) == getattr(v3, name) for name in same)
    assert state.messages() == v3.messages()


def test_v4_export_is_v4_plus_what_v5_and_v6_added() -> None:
    for name in ("v4/minimal.json", "v4/features.json"):
        raw = json.loads(read(name))
        again = json.loads(load(name).to_json())
        assert again == plus_v6({**raw, "settled_decisions": []})


# -- version 5 --------------------------------------------------------------------------


def test_v5_minimal() -> None:
    state = load("v5/minimal.json")

    assert state == RunState(
        run_id="run_minimal_v5",
        tenant="tenant-a",
        session_id="sess_minimal",
        agent="assistant",
        trace=TraceState(trace_id="trace_minimal_v5"),
        created_at=when("2025-03-14T09:26:53.589793Z"),
        updated_at=when("2025-03-14T09:26:53.589793Z"),
        items=[],
    )


def test_v5_features_keep_the_settled_decisions() -> None:
    state = load("v5/features.json")
    v4 = load("v4/features.json")

    wire, lookup = state.settled_decisions
    assert (wire.call_id, wire.tool, wire.approved) == ("call_wire_0", "wire_money", True)
    assert (wire.decided_by, wire.reason) == ("key ops-bot", "invoice INC-7 checked")
    assert wire.decided_at == when("2025-03-14T09:26:58.589793Z")
    assert (lookup.call_id, lookup.decided_by) == ("call_lookup_0", "policy")
    assert state.decision_history == [wire, lookup, *v4.decisions]
    same = ("metrics", "limits", "tool_use", "guardrails", "error", "trace", "decisions")
    assert all(getattr(state, name) == getattr(v4, name) for name in same)
    assert state.messages() == v4.messages()


def test_v5_export_is_v5_plus_what_v6_added() -> None:
    for name in ("v5/minimal.json", "v5/features.json"):
        raw = json.loads(read(name))
        assert json.loads(load(name).to_json()) == plus_v6(raw)
    assert all(d.edited_arguments is None for d in load("v5/features.json").decision_history)


# -- version 6 (current) ----------------------------------------------------------------


def test_v6_minimal() -> None:
    state = load("v6/minimal.json")

    assert state == RunState(
        run_id="run_minimal_v6",
        tenant="tenant-a",
        session_id="sess_minimal",
        agent="assistant",
        trace=TraceState(trace_id="trace_minimal_v6"),
        created_at=when("2025-03-14T09:26:53.589793Z"),
        updated_at=when("2025-03-14T09:26:53.589793Z"),
        items=[],
    )


def test_v6_features_keep_an_edited_approval() -> None:
    state = load("v6/features.json")
    v5 = load("v5/features.json")

    wire = state.settled_decisions[0]
    assert (wire.call_id, wire.approved, wire.decided_by) == ("call_wire_0", True, "key ops-bot")
    assert wire.arguments == '{"amount": 120, "to": "ACME Ltd"}'  # the call it answers
    assert wire.edited_arguments == '{"amount": 100, "to": "ACME Ltd"}'  # what ran
    assert [d.edited_arguments for d in state.decision_history[1:]] == [None, None, None]
    unedited = [d.model_copy(update={"edited_arguments": None}) for d in state.decision_history]
    assert unedited == v5.decision_history
    assert state.messages() == v5.messages()


def test_v6_export_is_byte_stable() -> None:
    """Reading and writing a current fixture again gives the same JSON data."""
    for name in ("v6/minimal.json", "v6/features.json"):
        raw = json.loads(read(name))
        assert json.loads(load(name).to_json()) == raw


def test_a_malformed_traceparent_is_refused() -> None:
    data = json.loads(read("v4/minimal.json"))
    data["trace"]["traceparent"] = "00-not-a-trace"
    with pytest.raises(InvalidPayloadError):
        RunState.from_data(data)


def test_checkpoint_data_drops_items_and_reads_back() -> None:
    state = load("v2/features.json")
    data = state.checkpoint_data()
    assert "items" not in data
    again = RunState.from_data(data)
    assert again.items is None
    assert again == state.model_copy(update={"items": None})


# -- property: round trip ---------------------------------------------------------------

_ids = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
_counts = st.integers(min_value=0, max_value=10**9)
_money = st.floats(min_value=0, max_value=10_000, allow_nan=False, allow_infinity=False)
_times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_usage = st.builds(
    TokenUsage,
    input_tokens=_counts,
    output_tokens=_counts,
    cache_read_tokens=_counts,
    cache_write_tokens=_counts,
    reasoning_tokens=_counts,
)
_model_usage = st.builds(
    ModelUsage,
    cost=_money,
    usage=_usage,
    calls=_counts,
    latency_seconds=_money,
)
_metrics = st.builds(Metrics, models=st.dictionaries(_ids, _model_usage, max_size=3))
_limits = st.builds(
    Limits,
    iterations=st.builds(IterationFlag, current=_counts, maximum=st.none() | _counts),
    budget=st.none() | st.builds(BudgetFlag, current=_money, maximum=st.none() | _money),
    tokens=st.none() | st.builds(TokenFlag, current=_counts, maximum=st.none() | _counts),
    time=st.none() | st.builds(TimeFlag, current=_money, increase_amount=_money),
)
_guardrail = st.builds(
    GuardrailResult,
    name=_ids,
    kind=st.sampled_from(["input", "output", "tool_input", "tool_output"]),
    triggered=st.booleans(),
    info=st.dictionaries(_ids, _json, max_size=2),
    turn=_counts,
)
_interruption = st.builds(
    Interruption,
    call_id=_ids,
    tool=_ids,
    arguments=st.text(max_size=20),
    agent=_ids,
    message=st.fixed_dictionaries({"role": st.just("assistant"), "id": _ids}),
    prompt=st.none() | st.text(max_size=10),
    requested_at=_times,
)
_decision = st.builds(
    ApprovalDecision,
    call_id=_ids,
    tool=_ids,
    arguments=st.text(max_size=20),
    approved=st.booleans(),
    always=st.booleans(),
    reason=st.none() | st.text(max_size=10),
    decided_by=st.none() | _ids,
    decided_at=_times,
    edited_arguments=st.none() | st.text(max_size=20),
)
_error = st.builds(
    ErrorDetails,
    type=_ids,
    message=st.text(max_size=30),
    turn=_counts,
    data=st.dictionaries(_ids, _json, max_size=2),
    at=_times,
)
_delegation = st.builds(
    DelegationInfo,
    parent_run_id=_ids,
    delegate_level=st.integers(min_value=1, max_value=8),
    parent_metrics_snapshot=_metrics,
    parent_iteration=_counts,
)


@st.composite
def run_states(draw: st.DrawFn) -> RunState:
    fields: dict[str, Any] = {
        "run_id": draw(_ids),
        "group_id": draw(st.none() | _ids),
        "tenant": draw(_ids),
        "session_id": draw(_ids),
        "agent": draw(_ids),
        "status": draw(st.sampled_from(list(AgentStatus))),
        "headless": draw(st.booleans()),
        "turn": draw(_counts),
        "revision": draw(_counts),
        "limits": draw(_limits),
        "metrics": draw(_metrics),
        "tool_use": draw(st.dictionaries(_ids, _counts, max_size=4)),
        "guardrails": draw(st.lists(_guardrail, max_size=3)),
        "interruptions": draw(st.lists(_interruption, max_size=2)),
        "decisions": draw(st.lists(_decision, max_size=2)),
        "always": draw(st.dictionaries(_ids, st.booleans(), max_size=2)),
        "error": draw(st.none() | _error),
        "context": draw(_json),
        "trace": draw(
            st.builds(TraceState, trace_id=_ids, spans=_counts, current_span=st.none() | _ids)
        ),
        "delegation": draw(st.none() | _delegation),
        "transcript_seq": draw(_counts),
        "output": draw(_json),
        "metadata": draw(st.dictionaries(_ids, _json, max_size=2)),
        "cancel_requested": draw(st.booleans()),
        "created_at": draw(_times),
        "updated_at": draw(_times),
    }
    return RunState(**fields)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=run_states())
def test_json_round_trip(state: RunState) -> None:
    text = state.to_json()
    again = RunState.from_json(text)

    assert again == state.model_copy(update={"items": []})
    assert again.to_json() == text
    assert again.total_tool_calls == state.total_tool_calls
    assert again.metrics.accumulated_cost == state.metrics.accumulated_cost
    assert again.delegate_level == state.delegate_level


# -- negative fixtures ------------------------------------------------------------------


def test_newer_version_names_both_versions() -> None:
    with pytest.raises(SchemaVersionError) as info:
        load("negative/newer_version.json")
    message = str(info.value)
    assert "999" in message
    assert f"up to {CURRENT_SCHEMA_VERSION}" in message
    assert "upgrade statekeeper" in message
    assert not isinstance(info.value, InvalidPayloadError)


@pytest.mark.parametrize(
    ("name", "error", "fragments"),
    [
        ("newer_version.json", SchemaVersionError, ["999", "newer"]),
        ("truncated.json", InvalidPayloadError, ["not valid JSON", "truncated"]),
        ("not_json.txt", InvalidPayloadError, ["not valid JSON"]),
        ("not_object.json", InvalidPayloadError, ["must be a JSON object", "list"]),
        (
            "wrong_types.json",
            InvalidPayloadError,
            ["invalid run state", "turn", "headless", "tool_use.search", "guardrails"],
        ),
        (
            "missing_fields.json",
            InvalidPayloadError,
            ["tenant: Field required", "session_id: Field required", "agent: Field required"],
        ),
        ("no_version.json", InvalidPayloadError, ["no valid schema_version"]),
    ],
)
def test_negative_fixture_raises_a_typed_error(
    name: str, error: type[Exception], fragments: list[str]
) -> None:
    with pytest.raises(error) as info:
        load(f"negative/{name}")
    for fragment in fragments:
        assert fragment in str(info.value)


def test_negative_fixture_bytes_raise_the_same_errors() -> None:
    data = (FIXTURES / "negative" / "truncated.json").read_bytes()
    with pytest.raises(InvalidPayloadError):
        RunState.from_json(data)
    with pytest.raises(InvalidPayloadError, match="not valid JSON"):
        RunState.from_json(b"\xff\xfe{}")


def test_malformed_v1_guardrails_raise_invalid_payload() -> None:
    with pytest.raises(InvalidPayloadError):
        load("negative/v1_null_guardrails.json")


def test_nan_is_refused_on_read() -> None:
    with pytest.raises(InvalidPayloadError):
        load("negative/nan_context.json")


# -- validate_for_resume ----------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [AgentStatus.COMPLETED, AgentStatus.CANCELLED, AgentStatus.ERROR]
)
def test_finished_states_cannot_be_resumed(status: AgentStatus) -> None:
    state = load("v2/minimal.json")
    state.status = status
    with pytest.raises(InvalidInputError) as info:
        state.validate_for_resume()
    assert str(status) in str(info.value)
    assert "cannot be resumed" in str(info.value)
    assert "run_minimal_v2" in str(info.value)


def test_the_errored_fixtures_cannot_be_resumed() -> None:
    for name in ("v1/features.json", "v2/features.json", "v3/features.json"):
        with pytest.raises(InvalidInputError, match="cannot be resumed"):
            load(name).validate_for_resume()


@pytest.mark.parametrize(
    "status",
    [
        AgentStatus.INITIALIZING,
        AgentStatus.RUNNING,
        AgentStatus.WAITING_FOR_INPUT,
        AgentStatus.WAITING_FOR_APPROVAL,
        AgentStatus.PAUSED,
    ],
)
def test_unfinished_states_can_be_resumed(status: AgentStatus) -> None:
    state = load("v2/features.json")
    state.status = status
    state.validate_for_resume()


def test_duplicate_interruptions_are_refused() -> None:
    state = load("negative/duplicate_interruptions.json")
    assert state.status == AgentStatus.WAITING_FOR_APPROVAL
    with pytest.raises(InvalidPayloadError, match="duplicate pending call ids"):
        state.validate_for_resume()


def test_context_without_deserializer_is_refused() -> None:
    state = load("v2/features.json")
    state.status = AgentStatus.WAITING_FOR_APPROVAL
    with pytest.raises(InvalidInputError, match="context_deserializer"):
        state.validate_for_resume(has_deserializer=False)
    state.context = None
    state.validate_for_resume(has_deserializer=False)


def test_hostile_ids_are_refused_on_load() -> None:
    raw = json.loads(read("v2/minimal.json"))
    raw["tenant"] = "../other-tenant"
    with pytest.raises(InvalidPayloadError, match="tenant"):
        RunState.from_data(raw)


def test_alias_of_a_finished_status_cannot_be_resumed() -> None:
    state = load("negative/finished_alias_status.json")
    with pytest.raises(InvalidInputError):
        state.validate_for_resume()


# -- summaries and migrations -----------------------------------------------------------


def test_one_summary_line_per_version_and_a_migration_for_each_older_one() -> None:
    assert sorted(SCHEMA_VERSION_SUMMARIES) == list(range(1, CURRENT_SCHEMA_VERSION + 1))
    for version, summary in SCHEMA_VERSION_SUMMARIES.items():
        assert summary.strip(), f"version {version} has an empty summary"
        assert "\n" not in summary, f"version {version}'s summary is not one line"
    assert sorted(MIGRATIONS) == list(range(1, CURRENT_SCHEMA_VERSION))
    assert RunState.model_fields["schema_version"].default == CURRENT_SCHEMA_VERSION


@pytest.mark.parametrize("version", [0, -1, "2", 2.0, True, None])
def test_invalid_schema_versions(version: object) -> None:
    raw = json.loads(read("v2/minimal.json"))
    raw["schema_version"] = version
    with pytest.raises(InvalidPayloadError, match="no valid schema_version"):
        RunState.from_data(raw)
