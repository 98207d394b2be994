"""Declared input fields of state-handler agents (`InputField`), and `MISSING`.

An `InputField` is a descriptor on a `StateHandlerAgent` subclass: during a step it reads
and writes the value collected for it, which the agent keeps per step (the agent's
``_step_fields`` hook); outside a step it raises `AttributeError`.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, overload

from pydantic import JsonValue

__all__ = ["MISSING", "InputField", "Missing"]


class Missing(Enum):
    """The type of `MISSING`."""

    MISSING = "MISSING"


MISSING = Missing.MISSING
"""No default (an `InputField`), or no output given (`HandlerContext.complete`)."""


class InputField:
    """A value collected in WAITING_FOR_INPUT; declare it as a class attribute.

    ``parser`` turns the answer into the stored (JSON) value; ``validator`` checks it:
    True or None accepts, False or a string (the reason) rejects, as does a ValueError
    from either. Without a ``default`` a field is required; an optional one takes its
    default (or None) when the answer is a skip word. During a step ``agent.<field>``
    reads and writes the collected value (None if missing).
    """

    def __init__(
        self,
        prompt: str,
        *,
        required: bool | None = None,
        validator: Callable[[Any], bool | str | None] | None = None,
        parser: Callable[[str], JsonValue] | None = None,
        default: JsonValue | Missing = MISSING,
    ) -> None:
        self.prompt, self.validator, self.parser, self.default = prompt, validator, parser, default
        self.required = default is MISSING if required is None else required
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> InputField: ...
    @overload
    def __get__(self, instance: object, owner: type) -> Any: ...
    def __get__(self, instance: object, owner: type) -> Any:
        if instance is None:
            return self
        return _step_fields(instance, self.name).get(self.name, self.fallback)

    def __set__(self, instance: object, value: JsonValue) -> None:
        _step_fields(instance, self.name)[self.name] = value

    @property
    def fallback(self) -> JsonValue:
        """The value of a skipped or missing field."""
        return None if isinstance(self.default, Missing) else self.default

    def validate(self, text: str, skip_words: frozenset[str] = frozenset({"skip"})) -> JsonValue:
        """The value for answer ``text``; raises ``ValueError`` saying why it is invalid."""
        answer = text.strip()
        if not answer or answer.lower() in skip_words:
            if self.required:
                raise ValueError("an answer is required")
            return self.fallback
        try:
            value: JsonValue = self.parser(answer) if self.parser else answer
            verdict = self.validator(value) if self.validator else True
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc) or "not a valid value") from exc
        if verdict is False or isinstance(verdict, str):
            raise ValueError(verdict or "not a valid value")
        return value


def _step_fields(instance: object, name: str) -> dict[str, JsonValue]:
    hook: Callable[[str], dict[str, JsonValue]] | None = getattr(instance, "_step_fields", None)
    if hook is None:
        raise AttributeError(f"{name} is an InputField: declare it on a StateHandlerAgent")
    return hook(name)
