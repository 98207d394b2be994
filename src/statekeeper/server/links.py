"""What FastAPI's OpenAPI description lacks: links, which answer's ids the other
operations take (a created session's id for its reads, appends and delete, a run's id for
the run endpoints, ...), so a client generator or a stateful fuzzer (schemathesis) can
chain the calls; and the form of an id (`statekeeper.ids.validate_id`) where one is taken."""

from __future__ import annotations

from typing import Any, Final

from statekeeper.ids import MAX_ID_LENGTH

__all__ = [
    "ID_PARAMETERS",
    "ID_PATTERN",
    "LABEL_PATTERN",
    "LINKS",
    "MAX_WHOLE",
    "add_id_patterns",
    "add_links",
]

ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_:@-]*(\.[A-Za-z0-9_:@-]+)*\.?$"
"""`validate_id`'s rule as a JSON Schema pattern: letters, digits and ``. _ : @ -``,
starting with a letter or digit, no ``..``."""
ID_PARAMETERS: Final = frozenset(
    {"session_id", "run_id", "new_run_id", "agent_id", "agent", "store", "profile_id"}
)
"""The parameters and body fields that are ids (path, query or JSON body); a record's
namespace and key are ids in a path too."""
_PATH_IDS: Final = frozenset({"namespace", "key"})
LABEL_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_:@-]*$"
"""A memory namespace's label (`statekeeper.longterm.rules.check_label`)."""

_SESSION: Final = "/api/v1/sessions/{session_id}"
_RUN: Final = "/api/v1/runs/{run_id}"
_SESSION_USES: Final = [
    ("get", _SESSION),
    ("get", f"{_SESSION}/entries"),
    ("get", f"{_SESSION}/tree"),
    ("post", f"{_SESSION}/messages"),
    ("post", f"{_SESSION}/fork"),
    ("get", f"{_SESSION}/export"),
    ("delete", _SESSION),
]
_RUN_USES: Final = [
    ("get", _RUN),
    ("get", f"{_RUN}/checkpoints"),
    ("get", f"{_RUN}/events"),
    ("post", f"{_RUN}/approve"),
    ("post", f"{_RUN}/reject"),
    ("post", f"{_RUN}/resume"),
    ("post", f"{_RUN}/cancel"),
    ("post", f"{_RUN}/limits"),
    ("post", f"{_RUN}/fork"),
    ("post", f"{_RUN}/followups"),
    ("get", _RUN + "/checkpoints/{step}"),
    ("post", "/api/v1/subagents/{run_id}/kill"),
    ("post", "/api/v1/subagents/{run_id}/steer"),
]
_RECORD: Final = "/api/v1/records/{namespace}/{key}"
_MEMORY: Final = "/api/v1/memories/item"

_MADE: Final = {"session_id": "$response.body#/session_id"}
_FIRST: Final = {"session_id": "$response.body#/items/0/session_id"}

_PENDING: Final = {
    "run_id": "$request.path.run_id",
    "requestBody": {"call_id": "$response.body#/pending/0/call_id"},
}

Uses = list[tuple[str, str]]
LINKS: Final[list[tuple[str, str, str, Uses, dict[str, Any]]]] = [
    # (method, path, status of the answer, the operations it feeds, parameter: expression;
    # "requestBody": the body, its values expressions too)
    ("post", "/api/v1/sessions", "201", _SESSION_USES, _MADE),
    ("get", "/api/v1/sessions", "200", _SESSION_USES, _FIRST),
    ("post", f"{_SESSION}/fork", "201", _SESSION_USES, _MADE),
    ("post", "/api/v1/sessions/import", "201", _SESSION_USES, _MADE),
    ("get", _RUN, "200", [("get", _SESSION)], _MADE),
    ("get", _RUN, "200", [("post", f"{_RUN}/approve"), ("post", f"{_RUN}/reject")], _PENDING),
    ("post", "/api/v1/runs", "202", _RUN_USES, {"run_id": "$response.body#/run_id"}),
    ("get", "/api/v1/runs", "200", _RUN_USES, {"run_id": "$response.body#/items/0/run_id"}),
    ("post", f"{_RUN}/fork", "201", _RUN_USES, {"run_id": "$response.body#/run_id"}),
    ("post", f"{_RUN}/fork", "202", _RUN_USES, {"run_id": "$response.body#/run_id"}),
    ("post", f"{_RUN}/resume", "202", _RUN_USES, {"run_id": "$response.body#/run_id"}),
    (
        "put",
        _RECORD,
        "200",
        [("get", _RECORD), ("delete", _RECORD)],
        {"namespace": "$request.path.namespace", "key": "$request.path.key"},
    ),
    (
        "put",
        _MEMORY,
        "200",
        [("get", _MEMORY), ("delete", _MEMORY)],
        {"namespace": "$response.body#/namespace", "key": "$response.body#/key"},
    ),
]
"""The links of the description: an answer's ids, by the operations that take them."""


def _name(method: str, path: str) -> str:
    tail = path.removeprefix("/api/v1/").replace("{", "").replace("}", "")
    words = [w for w in tail.replace("-", "/").split("/") if w]
    return method.capitalize() + "".join(w[:1].upper() + w[1:] for w in words)


def add_links(description: dict[str, Any]) -> dict[str, Any]:
    """``description`` (FastAPI's OpenAPI document) with `LINKS` on its answers, in place."""
    paths = description.get("paths", {})
    for method, path, status, uses, parameters in LINKS:
        answers = paths.get(path, {}).get(method, {}).get("responses", {})
        if status not in answers:
            continue
        links = answers[status].setdefault("links", {})
        for use_method, use_path in uses:
            target = paths.get(use_path, {}).get(use_method)
            if target is None:
                continue
            names = {p["name"] for p in target.get("parameters", []) if p.get("in") != "header"}
            wanted = {k: v for k, v in parameters.items() if k in names}
            if not wanted:
                continue
            link: dict[str, Any] = {"operationId": target["operationId"], "parameters": wanted}
            if "requestBody" in parameters:
                link["requestBody"] = parameters["requestBody"]
            links.setdefault(_name(use_method, use_path), link)
    return description


def _id_form(schema: dict[str, Any]) -> None:
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "string":
            branch.setdefault("pattern", ID_PATTERN)
            branch.setdefault("maxLength", MAX_ID_LENGTH)


def _labels(schema: dict[str, Any]) -> None:
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        schema["items"].setdefault("pattern", LABEL_PATTERN)


_ANSWERS: Final = frozenset({"SubagentStatus", "ErrorBody", "ErrorDetail"})
"""The components that are answers, not input."""
MAX_WHOLE: Final = 2**63 - 1
"""The largest whole number the API takes (every backend's integers hold it)."""


def _bounded(schema: Any) -> None:
    """Every integer in ``schema`` (at any depth) with `MAX_WHOLE` as its maximum."""
    if isinstance(schema, dict):
        if schema.get("type") == "integer":
            schema.setdefault("maximum", MAX_WHOLE)
        for value in schema.values():
            _bounded(value)
    elif isinstance(schema, list):
        for value in schema:
            _bounded(value)


def add_id_patterns(description: dict[str, Any]) -> dict[str, Any]:
    """``description`` with `ID_PATTERN` on the `ID_PARAMETERS`, `LABEL_PATTERN` on a
    memory's namespace labels and `MAX_WHOLE` on every integer of the input, in place."""
    for path, operations in description.get("paths", {}).items():
        if path.endswith("/stream"):  # its `key` is the API key, its ids are checked
            continue
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                name, where = parameter.get("name"), parameter.get("in")
                if (name in ID_PARAMETERS and where != "header") or (
                    name in _PATH_IDS and where == "path"
                ):
                    _id_form(parameter.get("schema", {}))
                elif name == "namespace" and where == "query":  # a memory's labels
                    _labels(parameter.get("schema", {}))
                _bounded(parameter.get("schema"))
    for title, schema in description.get("components", {}).get("schemas", {}).items():
        for name, field in schema.get("properties", {}).items():
            if name in ID_PARAMETERS and title != "SubagentStatus":  # an answer, not input
                _id_form(field)
            elif name == "namespace" and title == "MemoryWrite":
                _labels(field)
        if title not in _ANSWERS:
            _bounded(schema)
    return description
