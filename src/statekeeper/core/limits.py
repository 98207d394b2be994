"""Control flags: iteration, budget, token and wall-time limits. Pure, no I/O.

A `ControlFlag` holds a current value, an optional maximum and the amount by which the
maximum may be raised. `ControlFlag.step` never takes the value past the maximum: a
step that would pass it raises `LimitReachedError` and changes nothing. Values driven
from outside (spend, tokens, elapsed time) are recorded with `ControlFlag.set_current`,
which may go past the maximum (the spend already happened); `reached_limit` then says so.

What the run does next is the caller's policy (see `statekeeper.core.lifecycle.status_on_limit`):
the runner stops it, resumable, and it goes on only once the maximum was raised —
explicitly with `ControlFlag.raise_to`, or by `increase_limit` (the automatic raise of
interactive runs, by ``increase_amount``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar, Self

from pydantic import ConfigDict, Field, ValidationError

from statekeeper.core.typed import TypedModel, explain
from statekeeper.errors import InvalidInputError, InvalidPayloadError, LimitReachedError

__all__ = [
    "BudgetFlag",
    "ControlFlag",
    "IterationFlag",
    "Limits",
    "TimeFlag",
    "TokenFlag",
]


def _cause(exc: InvalidPayloadError) -> str:
    """The pydantic error behind a model's `InvalidPayloadError`, as one line."""
    cause = exc.__cause__
    return explain(cause) if isinstance(cause, ValidationError) else str(exc)


class ControlFlag(TypedModel):
    """A counter with an optional maximum (None = unlimited) that can be raised.

    ``increase_amount`` is how much `increase_limit` adds in interactive mode (0 = never).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    integral: ClassVar[bool] = False
    """Whether amounts must be whole numbers (iterations, tokens)."""

    name: str = Field(default="limit", min_length=1, max_length=128)
    current: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    maximum: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    increase_amount: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    # -- queries --------------------------------------------------------------------------

    def reached_limit(self) -> bool:
        """Whether the current value is at (or past) the maximum."""
        return self.maximum is not None and self.current >= self.maximum

    @property
    def remaining(self) -> float | None:
        """How much is left before the maximum (never negative); None when unlimited."""
        if self.maximum is None:
            return None
        return max(self.maximum - self.current, 0)

    # -- changes --------------------------------------------------------------------------

    def step(self, amount: float = 1) -> None:
        """Advance by ``amount``, or raise `LimitReachedError` and change nothing.

        Raises when the limit is already reached, and also when the step would pass the
        maximum (so ``current`` never exceeds ``maximum`` through `step`). A float sum
        within rounding error of the maximum lands exactly on it.
        """
        self._check_amount(amount, "step amount")
        new = self.current + amount
        if self.maximum is not None:
            if self.reached_limit() or (
                new > self.maximum and not math.isclose(new, self.maximum, rel_tol=1e-12)
            ):
                raise LimitReachedError(self.name, self.current, self.maximum)
            new = min(new, self.maximum)
        self.current = new

    def set_current(self, value: float) -> None:
        """Record an externally measured value (e.g. spend so far); may pass the maximum."""
        self._check_amount(value, "current value")
        self.current = value

    def check(self) -> None:
        """Raise `LimitReachedError` if the limit is reached."""
        if self.maximum is not None and self.reached_limit():
            raise LimitReachedError(self.name, self.current, self.maximum)

    def increase_limit(self, *, headless: bool) -> bool:
        """Raise the maximum by ``increase_amount``, only interactively and at the limit.

        The new maximum is ``max(maximum, current) + increase_amount``, so a value that
        overshot the old maximum still gets the full headroom. Headless runs never raise
        it. Returns whether the maximum changed.
        """
        if headless or self.maximum is None or not self.reached_limit():
            return False
        if self.increase_amount <= 0:
            return False
        self.maximum = max(self.maximum, self.current) + self.increase_amount
        return True

    def raise_to(self, maximum: float) -> None:
        """Set a higher maximum (an explicit raise, headless or not).

        `InvalidInputError`, changing nothing, when the flag has no maximum, or when
        ``maximum`` is below the current maximum or leaves no room above the current value.
        """
        self._check_amount(maximum, "new maximum")
        if self.maximum is None:
            raise InvalidInputError(f"{self.name} has no maximum to raise (it is unlimited)")
        if maximum <= self.current:
            raise InvalidInputError(
                f"{self.name}: a maximum of {maximum:g} leaves no room, {self.current:g} "
                f"is used already; give more than {self.current:g}"
            )
        if maximum < self.maximum:
            raise InvalidInputError(
                f"{self.name}: {maximum:g} is below the current maximum {self.maximum:g}; "
                "raising never lowers a limit"
            )
        self.maximum = maximum

    def _check_amount(self, value: float, what: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInputError(
                f"{self.name} {what} must be a number, got {type(value).__name__}"
            )
        if not math.isfinite(value) or value < 0:
            raise InvalidInputError(
                f"{self.name} {what} must be a finite number >= 0, got {value!r}"
            )
        if self.integral and value != int(value):
            raise InvalidInputError(f"{self.name} {what} must be a whole number, got {value!r}")

    # -- JSON -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The flag as plain JSON data."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: object) -> Self:
        """Read `to_dict` output; bad data raises `InvalidPayloadError`."""
        try:
            return cls.model_validate(data)
        except InvalidPayloadError as exc:
            raise InvalidPayloadError(f"invalid {cls.__name__}: {_cause(exc)}") from exc.__cause__


class IterationFlag(ControlFlag):
    """Counts agent steps (whole numbers)."""

    integral: ClassVar[bool] = True
    name: str = Field(default="iterations", min_length=1, max_length=128)
    current: int = Field(default=0, ge=0)
    maximum: int | None = Field(default=None, ge=0)
    increase_amount: int = Field(default=0, ge=0)


class BudgetFlag(ControlFlag):
    """Money spent (in the currency of the model prices, usually USD)."""

    name: str = Field(default="budget", min_length=1, max_length=128)


class TokenFlag(ControlFlag):
    """Tokens used (whole numbers)."""

    integral: ClassVar[bool] = True
    name: str = Field(default="tokens", min_length=1, max_length=128)
    current: int = Field(default=0, ge=0)
    maximum: int | None = Field(default=None, ge=0)
    increase_amount: int = Field(default=0, ge=0)


class TimeFlag(ControlFlag):
    """Wall-clock time used, in seconds."""

    name: str = Field(default="time", min_length=1, max_length=128)


class Limits(TypedModel):
    """The control flags of a run: iterations always, budget, tokens and time optional."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    iterations: IterationFlag = Field(default_factory=IterationFlag)
    budget: BudgetFlag | None = None
    tokens: TokenFlag | None = None
    time: TimeFlag | None = None

    def flags(self) -> Iterator[ControlFlag]:
        """The flags that are set, in the order iterations, budget, tokens, time."""
        for flag in (self.iterations, self.budget, self.tokens, self.time):
            if flag is not None:
                yield flag

    def reached(self) -> list[ControlFlag]:
        """The flags whose limit is reached."""
        return [flag for flag in self.flags() if flag.reached_limit()]

    def check(self) -> None:
        """Raise `LimitReachedError` for the first reached limit, if any."""
        for flag in self.flags():
            flag.check()

    def increase_limits(self, *, headless: bool) -> bool:
        """`ControlFlag.increase_limit` on every reached flag; whether any changed."""
        changed = [flag.increase_limit(headless=headless) for flag in self.reached()]
        return any(changed)

    def to_dict(self) -> dict[str, Any]:
        """The limits as plain JSON data (unset flags are null)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: object) -> Limits:
        """Read `to_dict` output; bad data raises `InvalidPayloadError`."""
        try:
            return cls.model_validate(data)
        except InvalidPayloadError as exc:
            raise InvalidPayloadError(f"invalid limits: {_cause(exc)}") from exc.__cause__
