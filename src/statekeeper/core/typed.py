"""Typed validation errors for the public models. Pure, no I/O.

pydantic raises `pydantic.ValidationError` for a bad field. statekeeper's rule is that
bad input raises a `StatekeeperError` subclass whose message names the fix, so the
models users build (messages, content blocks, control flags, limits) derive from
`TypedModel`: constructing, validating or assigning a bad value raises
`InvalidPayloadError` (also a `ValueError`), with the pydantic error chained as
``__cause__``. Models built inside the library from caller arguments (a session record
from ``create(metadata=...)``, a listing query) are built under `typed_input`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self, TypeVar

from pydantic import BaseModel, ValidationError

from statekeeper.errors import InvalidPayloadError
from statekeeper.jsoncodec import MAX_JSON_DEPTH

__all__ = ["TypedModel", "explain", "trusted", "typed_input"]

_SHOWN_LOC = 6  # a value nested thousands deep has a location thousands long


def _where(loc: tuple[int | str, ...]) -> str:
    # "dict" and "list" are the tags of JsonValue's union, not keys the caller wrote.
    parts = [str(part) for part in loc if part not in ("dict", "list")]
    if len(parts) > _SHOWN_LOC:
        parts = [*parts[:_SHOWN_LOC], "..."]
    return ".".join(parts) or "value"


def _one(error: Any) -> str:
    loc = tuple(error["loc"])
    if error["type"] == "recursion_depth_exceeded":
        return (
            f"{_where(loc[:1])}: nested too deeply; the limit is {MAX_JSON_DEPTH} levels: "
            "flatten it, or store the deep part as a string"
        )
    if loc and loc[-1] == "[key]":
        key = loc[-2] if len(loc) > 1 else error.get("input")
        return (
            f"{_where(loc[:-2])}: the key {key!r} is a {type(error.get('input')).__name__}; "
            f"JSON object keys must be strings (use {str(key)!r})"
        )
    text = f"{_where(loc)}: {error['msg']}"
    if "input" in error and error["type"] not in ("missing", "value_error", "assertion_error"):
        shown = repr(error["input"])
        text += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    return text


def explain(exc: Exception) -> str:
    """An error as one line (a pydantic error as ``field: message (got ...); ...``)."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    return "; ".join(_one(error) for error in exc.errors())


def _invalid(what: str, exc: ValidationError) -> InvalidPayloadError:
    error = InvalidPayloadError(f"invalid {what}: {explain(exc)}")
    error.__cause__ = exc
    return error


@contextmanager
def typed_input(what: str) -> Iterator[None]:
    """Turn a `pydantic.ValidationError` raised inside into `InvalidPayloadError`."""
    try:
        yield
    except ValidationError as exc:
        raise _invalid(what, exc) from exc


class TypedModel(BaseModel):
    """A pydantic model whose validation errors are `InvalidPayloadError`."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _invalid(type(self).__name__, exc) from exc

    # Marked as pydantic's own __init__ (as RootModel does), so a TypedModel nested in
    # another is validated by pydantic directly: the error is wrapped once, at the top.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(
        cls,
        obj: Any,
        *,
        strict: bool | None = None,
        extra: Any = None,
        from_attributes: bool | None = None,
        context: Any | None = None,
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        try:
            return super().model_validate(
                obj,
                strict=strict,
                extra=extra,
                from_attributes=from_attributes,
                context=context,
                by_alias=by_alias,
                by_name=by_name,
            )
        except ValidationError as exc:
            raise _invalid(cls.__name__, exc) from exc

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise _invalid(f"{type(self).__name__}.{name}", exc) from exc


M = TypeVar("M", bound=BaseModel)
_FIELD_NAMES: dict[type[BaseModel], set[str]] = {}


def trusted(cls: type[M], fields: dict[str, Any]) -> M:
    """An instance of ``cls`` holding ``fields``, which must be every field, each already
    valid (built from validated parts). Nothing is validated or copied: what pydantic's
    ``model_construct`` does, at a third of its cost, for the objects every append makes.
    """
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = set(cls.model_fields)
    instance = cls.__new__(cls)
    _set = object.__setattr__  # frozen models refuse their own __setattr__
    _set(instance, "__dict__", fields)
    _set(instance, "__pydantic_fields_set__", names)
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance
