"""The OpenAPI description's additions (issue 22): links between operations, and the
form of ids, which must say exactly what the server accepts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.errors import InvalidIdError
from statekeeper.ids import validate_id
from statekeeper.longterm.rules import check_label
from statekeeper.server import ServerConfig, create_app
from statekeeper.server.links import ID_PATTERN, LABEL_PATTERN, LINKS, MAX_WHOLE

ID_CHARS = st.text(alphabet="aZ09._:@-/ \u00e9\x00\n", max_size=12)


def _matches(pattern: str, text: str) -> bool:
    """As JSON Schema (ECMA 262) reads ``pattern``: its ``$`` is the end, never before a
    final newline as Python's."""
    return re.search(pattern.removesuffix("$") + r"\Z", text) is not None


@pytest.fixture(scope="module")
def description() -> dict[str, Any]:
    return create_app(ServerConfig("memory://")).openapi()


def _accepted(check: Any, text: str) -> bool:
    try:
        check(text)
    except InvalidIdError:
        return False
    return True


@given(text=ID_CHARS | st.text(max_size=140))
def test_the_id_pattern_accepts_what_validate_id_accepts(text: str) -> None:
    declared = _matches(ID_PATTERN, text) and len(text) <= 128
    assert declared == _accepted(validate_id, text)


@given(text=ID_CHARS)
def test_the_label_pattern_accepts_what_check_label_accepts(text: str) -> None:
    assert _matches(LABEL_PATTERN, text) == _accepted(check_label, text)


def test_a_created_session_links_to_its_reads_appends_fork_and_delete(
    description: dict[str, Any],
) -> None:
    answer = description["paths"]["/api/v1/sessions"]["post"]["responses"]["201"]
    targets = {link["operationId"] for link in answer["links"].values()}
    paths = description["paths"]["/api/v1/sessions/{session_id}"]
    assert paths["get"]["operationId"] in targets
    assert paths["delete"]["operationId"] in targets
    assert len(targets) == 7
    for link in answer["links"].values():
        assert link["parameters"] == {"session_id": "$response.body#/session_id"}


def test_every_link_names_an_operation_and_its_parameters(description: dict[str, Any]) -> None:
    operations = {
        op["operationId"]: op for ops in description["paths"].values() for op in ops.values()
    }
    count = 0
    for ops in description["paths"].values():
        for op in ops.values():
            for answer in op["responses"].values():
                for link in answer.get("links", {}).values():
                    target = operations[link["operationId"]]
                    names = {p["name"] for p in target.get("parameters", [])}
                    assert set(link["parameters"]) <= names
                    count += 1
    assert count == sum(len(uses) for *_, uses, _ in LINKS)  # none dropped


def test_ids_in_paths_and_bodies_declare_the_pattern(description: dict[str, Any]) -> None:
    run = description["paths"]["/api/v1/runs/{run_id}"]["get"]["parameters"][0]
    assert run["schema"]["pattern"] == ID_PATTERN
    assert run["schema"]["maxLength"] == 128
    fork = description["components"]["schemas"]["Fork"]["properties"]["new_run_id"]
    assert fork["anyOf"][0]["pattern"] == ID_PATTERN
    stream = description["paths"]["/api/v1/stream"]["get"]["parameters"]
    assert all("pattern" not in str(p["schema"]) for p in stream)  # its key is the API key


def test_a_runs_pending_call_links_to_its_approval(description: dict[str, Any]) -> None:
    answer = description["paths"]["/api/v1/runs/{run_id}"]["get"]["responses"]["200"]
    approve = answer["links"]["PostRunsRun_idApprove"]
    assert approve["parameters"] == {"run_id": "$request.path.run_id"}
    assert approve["requestBody"] == {"call_id": "$response.body#/pending/0/call_id"}


def test_the_other_statuses_of_resume_and_fork_are_declared(description: dict[str, Any]) -> None:
    # A waited-for resume answers 200, a fork that runs 202: answers the description
    # did not declare before the fuzz reached them.
    runs = description["paths"]
    assert {"200", "202"} <= set(runs["/api/v1/runs/{run_id}/resume"]["post"]["responses"])
    assert {"201", "202"} <= set(runs["/api/v1/runs/{run_id}/fork"]["post"]["responses"])


def test_every_integer_of_the_input_declares_the_largest_whole_number(
    description: dict[str, Any],
) -> None:
    # So a fuzzer's invalid input tries 2**63 (10**20 tokens in a message was a 500).
    seq = description["paths"]["/api/v1/sessions/{session_id}/entries"]["get"]["parameters"][1]
    assert seq["name"] == "after_seq"
    assert seq["schema"]["maximum"] == MAX_WHOLE
    message = description["components"]["schemas"]["Append"]["properties"]["messages"]["items"]
    assert message["properties"]["tokens"]["anyOf"][0]["maximum"] == MAX_WHOLE
    limit = description["paths"]["/api/v1/runs"]["get"]["parameters"][2]
    assert (limit["name"], limit["schema"]["maximum"]) == ("limit", 500)  # its own kept
