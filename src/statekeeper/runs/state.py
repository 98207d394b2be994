"""`RunState`: everything needed to continue a run exactly where it stopped. Pure data.

The stored checkpoint is a `RunState` without ``items``: small, pointing into the
session's transcript by ``transcript_seq``. `RunState.to_json` adds the items (the
transcript messages the run sees), making a self-contained snapshot that can move a run
between stores and machines; `RunState.from_json` reads it back, migrating older
schema versions step by step and refusing newer ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from statekeeper.core.lifecycle import AgentStatus, parse_status
from statekeeper.core.limits import Limits
from statekeeper.core.messages import Message, utcnow
from statekeeper.core.metrics import DelegationInfo, Metrics
from statekeeper.errors import InvalidInputError, InvalidPayloadError, SchemaVersionError
from statekeeper.ids import new_id, validate_id
from statekeeper.jsoncodec import loads

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "FAILED_TO_START",
    "SCHEMA_VERSION_SUMMARIES",
    "ApprovalDecision",
    "ErrorDetails",
    "GuardrailResult",
    "Interruption",
    "RunState",
    "TraceState",
    "migrate",
]

SCHEMA_VERSION_SUMMARIES: dict[int, str] = {
    1: "Initial schema: run, status, turn, limits, metrics, tools, approvals, context.",
    2: "Added trace state, guardrail kinds and delegation info; error details got a type.",
    3: "Added child_usage: what each delegated child run used, rolled up into the metrics.",
    4: "Added trace.traceparent: the W3C traceparent of the run's OpenTelemetry span.",
    5: "Added settled_decisions: the decisions on tool calls the run settled, kept for good.",
    6: "Added edited_arguments to approval decisions: an approval with edited arguments.",
}
"""One line per schema version; a new version must add its line (checked at import)."""

CURRENT_SCHEMA_VERSION = max(SCHEMA_VERSION_SUMMARIES)

FAILED_TO_START = "FailedToStart"
"""``error.type`` of a run whose process stopped before its first checkpoint (a view of
it: such a run has no checkpoint; see `statekeeper.runs.index.started_view`)."""


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    # Derived from the run id, so every load of the same v1 state has the same trace.
    data["trace"] = {"trace_id": f"trace_{data['run_id']}", "spans": 0, "current_span": None}
    data["guardrails"] = [
        {"name": g.get("name", "guardrail"), "kind": "input", **g}
        for g in data.pop("guardrails", [])
    ]
    data.setdefault("delegation", None)
    data.setdefault("revision", 0)
    error = data.get("error")
    if isinstance(error, dict) and "type" not in error:
        data["error"] = {"type": "Error", **error}
    return data


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    # No child had rolled up into a v2 run: its metrics are its own.
    return {**data, "child_usage": {}}


def _v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    # A v3 run was never traced with OpenTelemetry: its next drive starts its trace.
    trace = data.get("trace")
    if isinstance(trace, dict):
        data = {**data, "trace": {**trace, "traceparent": None}}
    return data


def _v4_to_v5(data: dict[str, Any]) -> dict[str, Any]:
    # A v4 run kept no decision past its settling: none are known.
    return {**data, "settled_decisions": []}


def _v5_to_v6(data: dict[str, Any]) -> dict[str, Any]:
    # No v5 decision edited its call's arguments.
    def plain(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**d, "edited_arguments": None} for d in decisions]

    return {
        **data,
        "decisions": plain(data.get("decisions", [])),
        "settled_decisions": plain(data.get("settled_decisions", [])),
    }


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
    5: _v5_to_v6,
}
"""``version -> function`` turning a state of that version into the next one."""

if sorted(SCHEMA_VERSION_SUMMARIES) != list(range(1, CURRENT_SCHEMA_VERSION + 1)) or set(
    MIGRATIONS
) != set(range(1, CURRENT_SCHEMA_VERSION)):
    raise RuntimeError("every schema version needs a summary, and every older one a migration")


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Bring stored run-state data to the current schema version."""
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidPayloadError(
            f"run state has no valid schema_version ({version!r}); it is not a statekeeper "
            "run state or it was edited by hand"
        )
    if version > CURRENT_SCHEMA_VERSION:
        raise SchemaVersionError(
            f"run state schema version {version} is newer than this statekeeper "
            f"(knows up to {CURRENT_SCHEMA_VERSION}: "
            f"{SCHEMA_VERSION_SUMMARIES[CURRENT_SCHEMA_VERSION]}); upgrade statekeeper"
        )
    while version < CURRENT_SCHEMA_VERSION:
        try:
            data = MIGRATIONS[version](data)
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            raise InvalidPayloadError(
                f"run state of schema version {version} is malformed and cannot be "
                f"migrated: {exc!r}"
            ) from exc
        version += 1
        data["schema_version"] = version
    return data


_MODEL = ConfigDict(extra="forbid", validate_assignment=True)
_TRACEPARENT = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"


class Interruption(BaseModel):
    """A tool call waiting for a human decision.

    ``message`` is the assistant message that made the call: it is written to the
    transcript only together with the results, so no call is ever stored without them.
    """

    model_config = _MODEL
    call_id: str
    tool: str
    arguments: str
    agent: str
    message: dict[str, Any]
    prompt: str | None = None
    requested_at: AwareDatetime = Field(default_factory=utcnow)


class ApprovalDecision(BaseModel):
    """A human's answer to an `Interruption`, bound to the exact call it answers.

    ``arguments`` are the call's own (what binds the decision to it); an approval with
    ``edited_arguments`` (JSON object text) runs the tool with those instead.
    """

    model_config = _MODEL
    call_id: str
    tool: str
    arguments: str
    approved: bool
    always: bool = False
    reason: str | None = None
    decided_by: str | None = None
    decided_at: AwareDatetime = Field(default_factory=utcnow)
    edited_arguments: str | None = None


class GuardrailResult(BaseModel):
    """The outcome of one guardrail check."""

    model_config = _MODEL
    name: str
    kind: Literal["input", "output", "tool_input", "tool_output"]
    triggered: bool
    info: dict[str, JsonValue] = Field(default_factory=dict)
    turn: int = 0


class ErrorDetails(BaseModel):
    """Why a run ended in ERROR."""

    model_config = _MODEL
    type: str
    message: str
    turn: int = 0
    data: dict[str, JsonValue] = Field(default_factory=dict)
    at: AwareDatetime = Field(default_factory=utcnow)


class TraceState(BaseModel):
    """The run's trace: a resumed run continues the same trace (see ``docs/tracing.md``).

    With OpenTelemetry tracing on, ``trace_id`` is the W3C trace id (32 hex digits) of
    the run's span, ``traceparent`` that span's W3C traceparent (every resumed drive's
    span is its child) and ``current_span`` the id of the latest step's span (16 hex
    digits); without, ``trace_id`` is statekeeper's own and ``current_span`` counts steps.
    """

    model_config = _MODEL
    trace_id: str = Field(default_factory=lambda: new_id("trace"))
    spans: int = 0
    current_span: str | None = None
    traceparent: str | None = Field(default=None, pattern=_TRACEPARENT)


class RunState(BaseModel):
    """A run's state at a checkpoint. See the module docstring."""

    model_config = _MODEL

    schema_version: int = CURRENT_SCHEMA_VERSION
    run_id: str = Field(default_factory=lambda: new_id("run"))
    group_id: str | None = None
    tenant: str
    session_id: str
    agent: str
    status: str = AgentStatus.INITIALIZING
    headless: bool = True
    turn: int = Field(default=0, ge=0)
    revision: int = Field(default=0, ge=0)
    """Checkpoints written so far (each write has the next revision)."""
    limits: Limits = Field(default_factory=Limits)
    metrics: Metrics = Field(default_factory=Metrics)
    tool_use: dict[str, int] = Field(default_factory=dict)
    guardrails: list[GuardrailResult] = Field(default_factory=list)
    interruptions: list[Interruption] = Field(default_factory=list)
    decisions: list[ApprovalDecision] = Field(default_factory=list)
    """Decisions on the pending ``interruptions`` (emptied as the run settles them)."""
    settled_decisions: list[ApprovalDecision] = Field(default_factory=list)
    """Every decision on a call the run has settled, oldest first, kept for good: who
    approved or rejected which call, when, why (``decided_by`` ``"policy"``: a call of
    the same message that needed no approval; ``"always rule"``: an ``always`` rule)."""
    always: dict[str, bool] = Field(default_factory=dict)
    error: ErrorDetails | None = None
    context: JsonValue = None
    trace: TraceState = Field(default_factory=TraceState)
    delegation: DelegationInfo | None = None
    child_usage: dict[str, Metrics] = Field(default_factory=dict)
    """What each delegated child run used (its ``local_metrics``), by child run id; it is
    included in ``metrics`` (see `absorb_child_usage`)."""
    transcript_seq: int = Field(default=0, ge=0)
    pending_input: list[dict[str, Any]] = Field(default_factory=list)
    output: JsonValue = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    cancel_requested: bool = False
    created_at: AwareDatetime = Field(default_factory=utcnow)
    updated_at: AwareDatetime = Field(default_factory=utcnow)
    items: list[dict[str, Any]] | None = None
    """Transcript messages, only in exported snapshots (`to_json`)."""
    events: list[dict[str, Any]] | None = None
    """The run's event log (model responses, status timeline ...), only in exported
    snapshots (`to_json`): each ``{"stream", "kind", "ts", "payload"}``."""

    @field_validator("run_id", "session_id", "tenant")
    @classmethod
    def _valid_id(cls, value: str, info: ValidationInfo) -> str:
        return validate_id(value, str(info.field_name).replace("_", " "))

    @field_validator("status", mode="before")
    @classmethod
    def _canonical_status(cls, value: Any) -> Any:
        # Other systems' names (finished, stopped ...) mean our statuses; custom stay as is.
        if isinstance(value, str):
            try:
                return str(parse_status(value))
            except InvalidInputError:
                return value.lower()
        return value

    @field_validator("tool_use")
    @classmethod
    def _counts_not_negative(cls, value: dict[str, int]) -> dict[str, int]:
        if any(n < 0 for n in value.values()):
            raise ValueError("tool call counts cannot be negative")
        return value

    # -- views ---------------------------------------------------------------------------

    @property
    def decision_history(self) -> list[ApprovalDecision]:
        """Every decision of the run, oldest first: the settled ones, then those on
        the calls still pending."""
        return [*self.settled_decisions, *self.decisions]

    @property
    def total_tool_calls(self) -> int:
        """Tool calls made so far, all tools."""
        return sum(self.tool_use.values())

    @property
    def delegate_level(self) -> int:
        """0 for a root run, parent + 1 for a delegated one."""
        return self.delegation.delegate_level if self.delegation else 0

    @property
    def local_metrics(self) -> Metrics:
        """This run's own usage (a child's total minus its parent's snapshot)."""
        return self.delegation.local_metrics(self.metrics) if self.delegation else self.metrics

    # -- spend ---------------------------------------------------------------------------

    def absorb_child_usage(self, reported: Mapping[str, Metrics]) -> bool:
        """Roll children's reported usage into ``metrics`` (and the budget and token
        limits); whether anything changed.

        A report is a child's whole usage so far, so absorbing it again, or an older
        report, changes nothing: only what it adds to the last one absorbed is added.
        """
        changed = False
        for child, usage in reported.items():
            before = self.child_usage.get(child, Metrics())
            added = usage - before
            if not added.models:
                continue
            self.metrics.merge(added)
            self.child_usage = {**self.child_usage, child: before + added}
            changed = True
        if changed:
            self.measure_spend()
        return changed

    def measure_spend(self) -> None:
        """Set the budget and token limits to this run's own usage (`local_metrics`:
        with its children's, without its parent's)."""
        budget, tokens = self.limits.budget, self.limits.tokens
        if budget is None and tokens is None:
            return
        own = self.local_metrics
        if budget is not None:
            budget.set_current(own.accumulated_cost)
        if tokens is not None:
            tokens.set_current(own.usage.total)

    @property
    def own_metrics(self) -> Metrics:
        """What this run spent itself: `local_metrics` without its children's usage."""
        own = self.local_metrics
        for usage in self.child_usage.values():
            own = own - usage
        return own

    def messages(self) -> list[Message]:
        """The exported items as messages (empty for a stored checkpoint)."""
        try:
            return [Message.model_validate(item) for item in self.items or []]
        except (ValidationError, InvalidPayloadError) as exc:
            raise InvalidPayloadError(f"run state items are not valid messages: {exc}") from exc

    def copy_state(self) -> RunState:
        """An independent copy (4x cheaper than ``model_copy(deep=True)``)."""
        return RunState.model_validate(self.model_dump())

    # -- checks --------------------------------------------------------------------------

    def validate_for_resume(self, *, has_deserializer: bool = True) -> None:
        """Check the state can be resumed; raise a typed error naming what is wrong."""
        validate_id(self.run_id, "run id")
        validate_id(self.session_id, "session id")
        validate_id(self.tenant, "tenant")
        if self.revision == 0 and self.error is not None and self.error.type == FAILED_TO_START:
            raise InvalidInputError(
                f"run {self.run_id} failed to start: nothing of it was saved, so there is "
                f"nothing to resume or fork. Start a new run, and delete this one "
                f"(`statekeeper runs delete {self.run_id}`)"
            )
        if self.status in (AgentStatus.COMPLETED, AgentStatus.CANCELLED, AgentStatus.ERROR):
            raise InvalidInputError(
                f"run {self.run_id} is {self.status}; a finished run cannot be resumed. "
                f"Fork it from an earlier checkpoint to try again: runner.fork("
                f"{self.run_id!r}, at=STEP) or `statekeeper runs fork {self.run_id} --at "
                f"STEP` (`statekeeper runs history {self.run_id}` lists the steps)"
            )
        ids = [i.call_id for i in self.interruptions]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise InvalidPayloadError(
                f"run {self.run_id} has duplicate pending call ids: {', '.join(twice)}"
            )
        if self.context is not None and not has_deserializer:
            raise InvalidInputError(
                f"run {self.run_id} has a user context but no context_deserializer was given"
            )

    # -- serialisation -------------------------------------------------------------------

    def checkpoint_data(self) -> dict[str, Any]:
        """The stored checkpoint: JSON data without items."""
        return self.model_dump(mode="json", exclude={"items", "events"})

    def to_json(
        self,
        items: list[Message] | None = None,
        *,
        events: list[dict[str, Any]] | None = None,
        indent: int | None = None,
    ) -> str:
        """A self-contained JSON snapshot, with the transcript ``items`` and the run's
        ``events`` if given."""
        data = self.checkpoint_data()
        data["items"] = [m.to_dict() for m in items] if items is not None else (self.items or [])
        if events is not None or self.events is not None:
            data["events"] = events if events is not None else self.events
        return json.dumps(data, ensure_ascii=False, allow_nan=False, indent=indent)

    @classmethod
    def from_data(cls, data: object) -> RunState:
        """Validate stored or exported data (migrating older schema versions)."""
        if not isinstance(data, dict):
            raise InvalidPayloadError(f"run state must be a JSON object, got {type(data).__name__}")
        migrated = migrate(data)
        try:
            return cls.model_validate(migrated)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
            )
            raise InvalidPayloadError(f"invalid run state: {problems}") from exc

    @classmethod
    def from_json(cls, text: str | bytes) -> RunState:
        """Read a snapshot made by `to_json` (or an older version of it)."""
        try:
            data = loads(text)
        except ValueError as exc:
            raise InvalidPayloadError(
                f"run state is not valid JSON ({exc}); the file is truncated or was edited"
            ) from exc
        return cls.from_data(data)
