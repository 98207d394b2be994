"""Lifecycle: statuses, aliases, the transition table, custom states and the timeline."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.core.lifecycle import (
    DEFAULT_TRANSITIONS,
    STATUS_ALIASES,
    AgentStatus,
    Lifecycle,
    Transition,
    TransitionTable,
    parse_status,
    status_on_limit,
)
from statekeeper.errors import (
    InvalidIdError,
    InvalidInputError,
    InvalidPayloadError,
    InvalidTransitionError,
)

# The table exactly as DESIGN.md ("Lifecycle") prints it.
DESIGN_TABLE = """
    INITIALIZING         -> RUNNING, WAITING_FOR_INPUT, WAITING_FOR_APPROVAL, PAUSED, COMPLETED, ERROR
    RUNNING              -> COMPLETED, ERROR, PAUSED, WAITING_FOR_INPUT, WAITING_FOR_APPROVAL
    WAITING_FOR_INPUT    -> RUNNING, WAITING_FOR_APPROVAL, PAUSED, COMPLETED, ERROR, WAITING_FOR_INPUT
    WAITING_FOR_APPROVAL -> RUNNING, WAITING_FOR_INPUT, WAITING_FOR_APPROVAL, PAUSED, COMPLETED, CANCELLED, ERROR
    PAUSED               -> INITIALIZING, RUNNING, WAITING_FOR_INPUT, WAITING_FOR_APPROVAL, CANCELLED, ERROR
    COMPLETED            -> (terminal)
    ERROR                -> CANCELLED
    CANCELLED            -> (terminal)
"""  # noqa: E501


def _design_rows() -> dict[str, set[str]]:
    rows: dict[str, set[str]] = {}
    for line in DESIGN_TABLE.strip().splitlines():
        source, targets = (part.strip() for part in line.split("->"))
        rows[source] = set() if targets == "(terminal)" else {t.strip() for t in targets.split(",")}
    return rows


DESIGN_ROWS = _design_rows()
ALL_PAIRS = [(s, t) for s in DESIGN_ROWS for t in DESIGN_ROWS]
T0 = datetime(2024, 1, 1, tzinfo=UTC)


# -- statuses and aliases -----------------------------------------------------------------


def test_agent_status_names_and_values() -> None:
    assert [s.name for s in AgentStatus] == list(DESIGN_ROWS)
    assert all(s.value == s.name.lower() for s in AgentStatus)


@pytest.mark.parametrize("status", list(AgentStatus))
def test_parse_status_accepts_names_and_values_in_any_case(status: AgentStatus) -> None:
    for text in (status.name, status.value, status.value.title(), status):
        parsed = parse_status(text)
        assert parsed is status


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("LOADING", AgentStatus.INITIALIZING),
        ("AWAITING_USER_INPUT", AgentStatus.WAITING_FOR_INPUT),
        ("AWAITING_USER_CONFIRMATION", AgentStatus.WAITING_FOR_APPROVAL),
        ("FINISHED", AgentStatus.COMPLETED),
        ("STOPPED", AgentStatus.CANCELLED),
        ("RUNNING", AgentStatus.RUNNING),
        ("PAUSED", AgentStatus.PAUSED),
        ("ERROR", AgentStatus.ERROR),
    ],
)
def test_other_systems_names_are_aliases(alias: str, expected: AgentStatus) -> None:
    assert parse_status(alias) is expected
    assert parse_status(alias.lower()) is expected
    assert DEFAULT_TRANSITIONS.parse(alias) is expected


def test_alias_table_is_read_only_and_complete() -> None:
    assert set(STATUS_ALIASES) == {
        "loading",
        "awaiting_user_input",
        "awaiting_user_confirmation",
        "finished",
        "stopped",
    }
    with pytest.raises(TypeError):
        STATUS_ALIASES["done"] = AgentStatus.COMPLETED  # type: ignore[index]


def test_unknown_status_lists_valid_names() -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_status("sleeping")
    message = str(info.value)
    assert "'sleeping'" in message
    for status in AgentStatus:
        assert status.value in message
    assert "loading" in message


def test_non_string_status_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="must be a string, got int"):
        parse_status(3)


# -- the default table ---------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), ALL_PAIRS)
def test_default_table_matches_design_exactly(source: str, target: str) -> None:
    expected = target in DESIGN_ROWS[source]
    assert DEFAULT_TRANSITIONS.allows(source, target) is expected
    assert DEFAULT_TRANSITIONS.allows(source.lower(), target.lower()) is expected


def test_default_table_rows_and_terminal_states() -> None:
    assert set(DEFAULT_TRANSITIONS.states) == {s.value for s in AgentStatus}
    for source, targets in DESIGN_ROWS.items():
        assert DEFAULT_TRANSITIONS.allowed(source) == {t.lower() for t in targets}
    terminal = {s for s in DEFAULT_TRANSITIONS.states if DEFAULT_TRANSITIONS.is_terminal(s)}
    assert terminal == {AgentStatus.COMPLETED, AgentStatus.CANCELLED}


def test_table_to_dict_is_sorted_json() -> None:
    data = DEFAULT_TRANSITIONS.to_dict()
    assert data["error"] == ["cancelled"]
    assert data["completed"] == []
    assert data["running"] == sorted(data["running"])
    assert json.loads(json.dumps(data)) == data
    assert TransitionTable.from_dict(data) == DEFAULT_TRANSITIONS


def test_table_is_immutable() -> None:
    with pytest.raises(AttributeError, match="immutable"):
        DEFAULT_TRANSITIONS._rows = {}
    assert isinstance(DEFAULT_TRANSITIONS.allowed("running"), frozenset)


def test_table_queries_refuse_unknown_states() -> None:
    with pytest.raises(InvalidInputError, match="'nope'"):
        DEFAULT_TRANSITIONS.allowed("nope")
    with pytest.raises(InvalidInputError):
        DEFAULT_TRANSITIONS.allows("running", "nope")


# -- custom states and derived tables ------------------------------------------------------


def test_custom_state_is_known_only_to_its_table() -> None:
    table = DEFAULT_TRANSITIONS.with_state("Review", to=["running", "error"], from_=["running"])
    parsed = table.parse("REVIEW")
    assert parsed == "review"
    assert type(parsed) is str
    assert parse_status("review", table) == "review"
    with pytest.raises(InvalidInputError, match="unknown status 'review'"):
        parse_status("review")
    with pytest.raises(InvalidInputError):
        DEFAULT_TRANSITIONS.parse("review")
    assert table.allows("running", "review")
    assert table.allowed("review") == {"running", "error"}
    assert "review" not in DEFAULT_TRANSITIONS.states


def test_unknown_custom_name_error_lists_table_states() -> None:
    table = DEFAULT_TRANSITIONS.with_state("review", from_=["running"])
    with pytest.raises(InvalidInputError) as info:
        table.parse("reviw")
    assert "review" in str(info.value)


def test_with_state_self_loop_and_extension() -> None:
    table = DEFAULT_TRANSITIONS.with_state("triage", to=["running"], from_=["triage", "paused"])
    assert table.allows("triage", "triage")
    assert table.allows("paused", "triage")
    extended = table.with_state("triage", to=["cancelled"])
    assert extended.allowed("triage") == {"running", "triage", "cancelled"}
    assert table.allowed("triage") == {"running", "triage"}


@pytest.mark.parametrize("bad", ["has space", "../escape", "", "x/y", "a" * 200])
def test_custom_state_names_are_validated_like_ids(bad: str) -> None:
    with pytest.raises(InvalidIdError, match="state name"):
        DEFAULT_TRANSITIONS.with_state(bad)


def test_with_state_refuses_unknown_sources_and_targets() -> None:
    with pytest.raises(InvalidInputError, match="'ghost'"):
        DEFAULT_TRANSITIONS.with_state("review", from_=["ghost"])
    with pytest.raises(InvalidInputError, match="target 'ghost' of state 'review'"):
        DEFAULT_TRANSITIONS.with_state("review", to=["ghost"])


def test_alias_names_always_mean_the_builtin_state() -> None:
    table = DEFAULT_TRANSITIONS.with_state("finished", to=["running"])
    assert table.states == DEFAULT_TRANSITIONS.states
    assert table.allows("completed", "running")


def test_with_transitions_replaces_rows_and_keeps_original() -> None:
    strict = DEFAULT_TRANSITIONS.with_transitions({"RUNNING": ["completed", "error"]})
    assert strict.allowed("running") == {"completed", "error"}
    assert DEFAULT_TRANSITIONS.allows("running", "paused")
    assert strict.allowed("paused") == DEFAULT_TRANSITIONS.allowed("paused")
    added = strict.with_transitions({"review": ["completed"], "running": ["review"]})
    assert added.allows("running", "review")
    assert not added.allows("running", "completed")


def test_table_requires_a_row_for_every_target() -> None:
    with pytest.raises(InvalidInputError, match="target 'completed' of state 'running'"):
        TransitionTable({"running": ["completed"]})
    with pytest.raises(InvalidInputError, match="must be a list of state names, got str"):
        TransitionTable({"running": "completed"})
    with pytest.raises(InvalidInputError, match="must be a mapping"):
        TransitionTable([("running", [])])  # type: ignore[arg-type]


def test_small_custom_table() -> None:
    table = TransitionTable({"start": ["work"], "work": ["done", "work"], "done": []})
    assert table.states == ("start", "work", "done")
    assert table.is_terminal("done")
    lifecycle = Lifecycle("start", table=table)
    lifecycle.transition_to("work")
    with pytest.raises(InvalidTransitionError):
        lifecycle.transition_to("start")
    with pytest.raises(InvalidInputError, match="not a state of this table"):
        lifecycle.transition_to("running")


@pytest.mark.parametrize(
    "data",
    [[], {"running": "completed"}, {"running": [1]}, {"running": ["ghost"]}, {"bad name": []}],
)
def test_table_from_dict_refuses_bad_payloads(data: object) -> None:
    with pytest.raises(InvalidPayloadError):
        TransitionTable.from_dict(data)


def test_table_from_dict_accepts_aliases() -> None:
    table = TransitionTable.from_dict({"LOADING": ["finished"], "finished": []})
    assert table.allows("initializing", "completed")


# -- the lifecycle --------------------------------------------------------------------------


def test_transition_records_history() -> None:
    lifecycle = Lifecycle()
    assert isinstance(lifecycle.status, AgentStatus)
    assert lifecycle.status == "initializing"
    step = lifecycle.transition_to("running", "started", at=T0)
    assert step == Transition(source="initializing", target="running", at=T0, reason="started")
    assert lifecycle.status == "running"
    assert lifecycle.history == (step,)
    assert lifecycle.initial_status is AgentStatus.INITIALIZING
    lifecycle.transition_to("FINISHED")
    assert lifecycle.status is AgentStatus.COMPLETED
    assert lifecycle.is_terminal


def test_default_time_is_now_utc() -> None:
    before = datetime.now(UTC)
    step = Lifecycle().transition_to("running")
    assert before <= step.at <= datetime.now(UTC)
    assert step.at.utcoffset() == timedelta(0)


def test_invalid_transition_raises_and_changes_nothing() -> None:
    lifecycle = Lifecycle()
    lifecycle.transition_to("running", at=T0)
    before = lifecycle.history
    with pytest.raises(InvalidTransitionError) as info:
        lifecycle.transition_to("initializing")
    assert info.value.source == "running"
    assert info.value.target == "initializing"
    assert info.value.allowed == DEFAULT_TRANSITIONS.allowed("running")
    assert str(info.value) == (
        "cannot move from 'running' to 'initializing'; allowed from 'running': "
        "completed, error, paused, waiting_for_approval, waiting_for_input"
    )
    assert lifecycle.status is AgentStatus.RUNNING
    assert lifecycle.history == before


def test_terminal_state_error_message() -> None:
    lifecycle = Lifecycle("completed")
    with pytest.raises(InvalidTransitionError, match=r"none \(terminal state\)"):
        lifecycle.transition_to("running")


def test_unknown_target_is_an_input_error() -> None:
    lifecycle = Lifecycle()
    with pytest.raises(InvalidInputError, match="unknown status 'flying'"):
        lifecycle.transition_to("flying")
    assert lifecycle.history == ()


def test_naive_time_is_refused() -> None:
    lifecycle = Lifecycle()
    with pytest.raises(InvalidInputError, match="timezone"):
        lifecycle.transition_to("running", at=datetime(2024, 1, 1))
    assert lifecycle.status is AgentStatus.INITIALIZING


def test_history_is_a_copy() -> None:
    lifecycle = Lifecycle()
    lifecycle.transition_to("running")
    history = lifecycle.history
    assert isinstance(history, tuple)
    assert lifecycle.history == history


class StrictLifecycle(Lifecycle):
    """Never goes back to collecting input once running (OneValet-style override)."""

    def can_transition(self, target: str) -> bool:
        if self.status == AgentStatus.RUNNING and target == AgentStatus.WAITING_FOR_INPUT:
            return False
        return super().can_transition(target)


class ReopeningLifecycle(Lifecycle):
    """Lets a completed agent be reopened, which the table forbids."""

    def can_transition(self, target: str) -> bool:
        if self.status == AgentStatus.COMPLETED and target == AgentStatus.RUNNING:
            return True
        return super().can_transition(target)


def test_subclass_can_restrict_transitions() -> None:
    lifecycle = StrictLifecycle("running")
    assert not lifecycle.can_transition("waiting_for_input")
    with pytest.raises(InvalidTransitionError) as info:
        lifecycle.transition_to("waiting_for_input")
    assert "waiting_for_input" not in info.value.allowed
    assert lifecycle.allowed_targets() == DEFAULT_TRANSITIONS.allowed("running") - {
        "waiting_for_input"
    }
    assert lifecycle.status == "running"
    lifecycle.transition_to("paused")
    assert lifecycle.status is AgentStatus.PAUSED


def test_subclass_can_widen_transitions() -> None:
    lifecycle = ReopeningLifecycle("completed")
    lifecycle.transition_to("running", "reopened")
    assert lifecycle.status is AgentStatus.RUNNING
    restored = ReopeningLifecycle.from_dict(lifecycle.to_dict())
    assert type(restored) is ReopeningLifecycle
    assert restored == lifecycle


def test_constructor_checks_history_chain() -> None:
    a = Transition(source="initializing", target="running", at=T0)
    b = Transition(source="paused", target="running", at=T0)
    with pytest.raises(InvalidInputError, match="not a chain: transition 1 starts at 'paused'"):
        Lifecycle("running", history=[a, b])
    with pytest.raises(InvalidInputError, match="history ends at 'running' but the status is"):
        Lifecycle("paused", history=[a])
    with pytest.raises(InvalidInputError, match="TransitionTable"):
        Lifecycle(table={"running": []})  # type: ignore[arg-type]


# -- JSON ------------------------------------------------------------------------------------


def test_to_dict_omits_default_table_and_includes_custom_one() -> None:
    lifecycle = Lifecycle()
    lifecycle.transition_to("running", "go", at=T0)
    data = lifecycle.to_dict()
    assert data == {
        "status": "running",
        "history": [
            {
                "source": "initializing",
                "target": "running",
                "at": "2024-01-01T00:00:00Z",
                "reason": "go",
            }
        ],
    }
    table = DEFAULT_TRANSITIONS.with_state("review", from_=["running"], to=["running"])
    custom = Lifecycle(table=table)
    assert custom.to_dict()["table"] == table.to_dict()


def test_from_dict_accepts_aliases() -> None:
    data = {
        "status": "FINISHED",
        "history": [
            {"source": "LOADING", "target": "RUNNING", "at": "2024-01-01T00:00:00Z"},
            {"source": "running", "target": "finished", "at": "2024-01-01T00:00:01+00:00"},
        ],
    }
    lifecycle = Lifecycle.from_dict(data)
    assert lifecycle.status is AgentStatus.COMPLETED
    assert [t.target for t in lifecycle.history] == ["running", "completed"]
    assert lifecycle.initial_status is AgentStatus.INITIALIZING


def test_from_dict_table_argument_overrides_stored_table() -> None:
    table = DEFAULT_TRANSITIONS.with_state("review", from_=["initializing"], to=["running"])
    lifecycle = Lifecycle(table=table)
    lifecycle.transition_to("review")
    data = lifecycle.to_dict()
    assert Lifecycle.from_dict(data).table == table
    other = table.with_transitions({"review": []})
    assert Lifecycle.from_dict(data, table=other).table == other
    del data["table"]
    with pytest.raises(InvalidPayloadError, match="unknown status 'review'"):
        Lifecycle.from_dict(data)


@pytest.mark.parametrize(
    "data",
    [
        None,
        {"history": []},
        {"status": "running", "extra": 1},
        {"status": "running", "history": "x"},
        {"status": "nope"},
        {"status": "running", "history": [{"source": "initializing", "target": "running"}]},
        {
            "status": "running",
            "history": [
                {"source": "initializing", "target": "running", "at": "2024-01-01T00:00:00"}
            ],
        },
        {"status": "running", "table": {"running": ["ghost"]}},
    ],
)
def test_from_dict_refuses_bad_payloads(data: object) -> None:
    with pytest.raises(InvalidPayloadError):
        Lifecycle.from_dict(data)


def test_status_on_limit() -> None:
    assert status_on_limit(headless=True) is AgentStatus.PAUSED  # resumable once raised
    assert status_on_limit(headless=False) is AgentStatus.PAUSED
    assert DEFAULT_TRANSITIONS.allows("running", status_on_limit(True))
    assert DEFAULT_TRANSITIONS.allows("running", status_on_limit(False))


# -- properties ------------------------------------------------------------------------------

CUSTOM_TABLE = DEFAULT_TRANSITIONS.with_state(
    "review", to=["running", "cancelled", "review"], from_=["running", "paused"]
).with_state("archived", from_=["completed", "review"])

TARGET_NAMES = st.sampled_from(
    [*CUSTOM_TABLE.states, *STATUS_ALIASES, "Running", "REVIEW", "unknown", "bad name"]
)


@given(
    table=st.sampled_from([DEFAULT_TRANSITIONS, CUSTOM_TABLE]),
    start=st.sampled_from(list(AgentStatus)),
    targets=st.lists(TARGET_NAMES, max_size=30),
)
def test_random_transitions_follow_the_table(
    table: TransitionTable, start: AgentStatus, targets: list[str]
) -> None:
    lifecycle = Lifecycle(start, table=table)
    for name in targets:
        before_status, before_history = lifecycle.status, lifecycle.history
        try:
            target = table.parse(name)
        except InvalidInputError:
            with pytest.raises(InvalidInputError):
                lifecycle.transition_to(name)
            assert (lifecycle.status, lifecycle.history) == (before_status, before_history)
            continue
        if table.allows(before_status, target):
            step = lifecycle.transition_to(name)
            assert (step.source, step.target) == (before_status, target)
            assert lifecycle.status == target
            assert lifecycle.history == (*before_history, step)
        else:
            with pytest.raises(InvalidTransitionError):
                lifecycle.transition_to(name)
            assert lifecycle.status == before_status
            assert lifecycle.history == before_history

    # The history replays to the current status, through allowed moves only.
    replay = Lifecycle(lifecycle.initial_status, table=table)
    for step in lifecycle.history:
        assert replay.status == step.source
        replay.transition_to(step.target, step.reason, at=step.at)
    assert replay == lifecycle

    # JSON round trip is the identity.
    text = json.dumps(lifecycle.to_dict(), allow_nan=False)
    assert Lifecycle.from_dict(json.loads(text)) == lifecycle


CUSTOM_NAMES = st.from_regex(r"[a-z][a-z0-9_.:-]{0,12}", fullmatch=True).filter(
    lambda n: ".." not in n and n not in STATUS_ALIASES and n not in set(AgentStatus)
)


@given(
    rows=st.dictionaries(
        CUSTOM_NAMES,
        st.lists(st.integers(min_value=0, max_value=20), max_size=5),
        min_size=1,
        max_size=6,
    )
)
def test_random_tables_round_trip_through_json(rows: dict[str, list[int]]) -> None:
    names = [*rows, *AgentStatus]
    table = DEFAULT_TRANSITIONS.with_transitions(
        {name: [names[i % len(names)] for i in targets] for name, targets in rows.items()}
    )
    data = json.loads(json.dumps(table.to_dict()))
    assert TransitionTable.from_dict(data) == table
    assert all(target in table.states for state in table.states for target in table.allowed(state))
    for name in rows:
        assert table.parse(name.upper()) == name
