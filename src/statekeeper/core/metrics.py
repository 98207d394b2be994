"""Cost and token usage per model, and the delegation (parent / child run) record.

Pure, no I/O. Costs are kept rounded to 1e-9 (nano-units of the currency) and latencies
to 1e-6 seconds, so sums and differences of metrics are exact: ``(a + b) - a == b``.
A child run's own usage is its total minus the parent's snapshot taken when it started.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import (
    AliasChoices,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from statekeeper.core.typed import TypedModel
from statekeeper.errors import InvalidInputError, InvalidPayloadError
from statekeeper.ids import validate_id

__all__ = [
    "COST_DIGITS",
    "DelegationInfo",
    "Metrics",
    "ModelUsage",
    "TokenUsage",
    "local_metrics",
]

COST_DIGITS = 9
"""Decimal places kept for costs."""
_LATENCY_DIGITS = 6


def _explain(exc: Exception) -> str:
    """An error as one line (a pydantic error as ``field: message; ...``)."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())


def _count(*names: str) -> Any:
    return Field(default=0, ge=0, validation_alias=AliasChoices(*names))


class TokenUsage(TypedModel):
    """Token counts of one or more model calls. Immutable; ``+`` adds, ``-`` never goes below 0.

    ``input_tokens`` and ``output_tokens`` also read as ``prompt_tokens`` and
    ``completion_tokens``. The cache and reasoning counts are kept as the provider
    reports them; `total` is input + output.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = _count("input_tokens", "prompt_tokens")
    output_tokens: int = _count("output_tokens", "completion_tokens")
    cache_read_tokens: int = _count("cache_read_tokens")
    cache_write_tokens: int = _count("cache_write_tokens")
    reasoning_tokens: int = _count("reasoning_tokens")

    @property
    def total(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def is_zero(self) -> bool:
        """Whether every count is 0."""
        return not any(self.model_dump().values())

    def __add__(self, other: TokenUsage) -> TokenUsage:
        if not isinstance(other, TokenUsage):
            return NotImplemented
        mine, theirs = self.model_dump(), other.model_dump()
        return TokenUsage(**{k: v + theirs[k] for k, v in mine.items()})

    def __sub__(self, other: TokenUsage) -> TokenUsage:
        if not isinstance(other, TokenUsage):
            return NotImplemented
        mine, theirs = self.model_dump(), other.model_dump()
        return TokenUsage(**{k: max(v - theirs[k], 0) for k, v in mine.items()})


class ModelUsage(TypedModel):
    """What calls to one model used: cost, tokens, number of calls, total latency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cost: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    usage: TokenUsage = Field(default_factory=TokenUsage)
    calls: int = Field(default=0, ge=0)
    latency_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    @field_validator("cost")
    @classmethod
    def _round_cost(cls, value: float) -> float:
        return round(value, COST_DIGITS)

    @field_validator("latency_seconds")
    @classmethod
    def _round_latency(cls, value: float) -> float:
        return round(value, _LATENCY_DIGITS)

    def is_zero(self) -> bool:
        """Whether nothing was recorded."""
        return not (self.cost or self.calls or self.latency_seconds) and self.usage.is_zero()

    def __add__(self, other: ModelUsage) -> ModelUsage:
        if not isinstance(other, ModelUsage):
            return NotImplemented
        return ModelUsage(
            cost=self.cost + other.cost,
            usage=self.usage + other.usage,
            calls=self.calls + other.calls,
            latency_seconds=self.latency_seconds + other.latency_seconds,
        )

    def __sub__(self, other: ModelUsage) -> ModelUsage:
        if not isinstance(other, ModelUsage):
            return NotImplemented
        return ModelUsage(
            cost=max(0.0, round(self.cost - other.cost, COST_DIGITS)),
            usage=self.usage - other.usage,
            calls=max(self.calls - other.calls, 0),
            latency_seconds=max(
                0.0, round(self.latency_seconds - other.latency_seconds, _LATENCY_DIGITS)
            ),
        )


def _model_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > 256:
        raise InvalidInputError(
            f"a model name must be a non-empty string of at most 256 characters, got {name!r}"
        )
    return name


class Metrics(TypedModel):
    """Accumulated usage of a run, per model. `add` records a call; arithmetic makes copies.

    Entries with nothing recorded are dropped, so equal usage means equal metrics.
    """

    model_config = ConfigDict(extra="forbid")

    models: dict[str, ModelUsage] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in self.models:
            _model_name(name)
        self._drop_empty()
        return self

    def _drop_empty(self) -> None:
        for name in [n for n, u in self.models.items() if u.is_zero()]:
            del self.models[name]

    # -- totals ---------------------------------------------------------------------------

    @property
    def accumulated_cost(self) -> float:
        """Total cost over all models."""
        return round(sum(u.cost for u in self.models.values()), COST_DIGITS)

    @property
    def usage(self) -> TokenUsage:
        """Total token usage over all models."""
        total = TokenUsage()
        for entry in self.models.values():
            total += entry.usage
        return total

    @property
    def calls(self) -> int:
        """Total number of model calls."""
        return sum(u.calls for u in self.models.values())

    # -- recording ------------------------------------------------------------------------

    def add(
        self,
        model: str,
        *,
        cost: float = 0.0,
        usage: TokenUsage | None = None,
        latency: float | None = None,
        calls: int = 1,
    ) -> None:
        """Record ``calls`` call(s) to ``model`` with their cost, tokens and latency (s)."""
        try:
            entry = ModelUsage(
                cost=cost,
                usage=usage if usage is not None else TokenUsage(),
                calls=calls,
                latency_seconds=latency or 0.0,
            )
        except (ValidationError, InvalidPayloadError) as exc:
            raise InvalidInputError(f"invalid usage for model {model!r}: {_explain(exc)}") from exc
        self.merge(Metrics(models={_model_name(model): entry}))

    def merge(self, other: Metrics) -> None:
        """Add ``other``'s usage into this one, in place."""
        for name, entry in other.models.items():
            current = self.models.get(name)
            self.models[name] = entry if current is None else current + entry
        self._drop_empty()

    def snapshot(self) -> Metrics:
        """An independent deep copy (e.g. a parent's metrics when a child run starts)."""
        return self.model_copy(deep=True)

    def diff(self, snapshot: Metrics) -> Metrics:
        """What was added since ``snapshot``: this minus it, per model, never negative."""
        return Metrics(
            models={
                name: entry - snapshot.models.get(name, ModelUsage())
                for name, entry in self.models.items()
            }
        )

    def __add__(self, other: Metrics) -> Metrics:
        if not isinstance(other, Metrics):
            return NotImplemented
        total = self.snapshot()
        total.merge(other)
        return total

    def __sub__(self, other: Metrics) -> Metrics:
        if not isinstance(other, Metrics):
            return NotImplemented
        return self.diff(other)

    # -- JSON -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; ``accumulated_cost`` is included for readers and ignored on read."""
        data = self.model_dump(mode="json", by_alias=False)
        return {"accumulated_cost": self.accumulated_cost, **data}

    @classmethod
    def from_dict(cls, data: object) -> Metrics:
        """Read `to_dict` output; bad data raises `InvalidPayloadError`."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != "accumulated_cost"}
        try:
            return cls.model_validate(data)
        except (ValidationError, InvalidInputError) as exc:
            raise InvalidPayloadError(f"invalid metrics: {_explain(exc)}") from exc


def local_metrics(total: Metrics, snapshot: Metrics) -> Metrics:
    """A child run's own usage: ``total`` minus the parent's ``snapshot`` at its start."""
    return total.diff(snapshot)


class DelegationInfo(TypedModel):
    """Where a run sits in a delegation tree, and what its parent had used when it started.

    A root run has level 0 and no parent; a child has ``delegate_level = parent + 1``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    parent_run_id: str | None = None
    delegate_level: int = Field(default=0, ge=0)
    parent_metrics_snapshot: Metrics = Field(default_factory=Metrics)
    parent_iteration: int = Field(default=0, ge=0)

    @field_validator("parent_run_id")
    @classmethod
    def _valid_run_id(cls, value: str | None) -> str | None:
        return None if value is None else validate_id(value, "parent_run_id")

    @model_validator(mode="after")
    def _root_has_no_parent(self) -> Self:
        if self.delegate_level == 0 and self.parent_run_id is not None:
            raise ValueError("a root run (delegate_level 0) cannot have a parent_run_id")
        return self

    @classmethod
    def child_of(
        cls,
        parent: DelegationInfo | int,
        metrics: Metrics,
        iteration: int,
        *,
        parent_run_id: str | None = None,
    ) -> DelegationInfo:
        """The record of a child started now by a parent at ``parent`` (info or level).

        ``metrics`` are the parent's metrics (copied), ``iteration`` its iteration count.
        """
        level = parent.delegate_level if isinstance(parent, DelegationInfo) else parent
        if isinstance(level, bool) or not isinstance(level, int) or level < 0:
            raise InvalidInputError(f"the parent's delegate level must be an int >= 0: {level!r}")
        try:
            return cls(
                parent_run_id=parent_run_id,
                delegate_level=level + 1,
                parent_metrics_snapshot=metrics.snapshot(),
                parent_iteration=iteration,
            )
        except (ValidationError, InvalidPayloadError) as exc:
            raise InvalidInputError(f"invalid delegation: {_explain(exc)}") from exc

    @property
    def is_root(self) -> bool:
        """Whether this run was not delegated."""
        return self.delegate_level == 0

    def local_metrics(self, total: Metrics) -> Metrics:
        """The child's own usage: ``total`` minus the parent's snapshot."""
        return total.diff(self.parent_metrics_snapshot)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        data = self.model_dump(mode="json")
        data["parent_metrics_snapshot"] = self.parent_metrics_snapshot.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: object) -> DelegationInfo:
        """Read `to_dict` output; bad data raises `InvalidPayloadError`."""
        if isinstance(data, dict) and isinstance(data.get("parent_metrics_snapshot"), dict):
            snap = Metrics.from_dict(data["parent_metrics_snapshot"])
            data = {**data, "parent_metrics_snapshot": snap}
        try:
            return cls.model_validate(data)
        except (ValidationError, InvalidInputError) as exc:
            raise InvalidPayloadError(f"invalid delegation info: {_explain(exc)}") from exc
