"""The server's own errors, and how every typed error becomes an HTTP answer.

An error answer is ``{"error": {"type": <the error class name>, "message": ...}}`` with the
status of the most specific class in `STATUS` (the library's names, so a client matches
on the same names as Python code does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel

from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    InvalidTransitionError,
    LimitReachedError,
    NotFoundError,
    PayloadTooLargeError,
    SessionLockTimeoutError,
    StatekeeperError,
    StoreCorruptError,
    StoreError,
)

__all__ = [
    "ERROR_RESPONSES",
    "STATUS",
    "AuthenticationError",
    "ErrorBody",
    "PermissionDeniedError",
    "error_body",
    "redact",
    "reported",
    "status_of",
    "store_locations",
]


class AuthenticationError(StatekeeperError):
    """No API key, or a key the server does not know (or that was revoked)."""


class PermissionDeniedError(StatekeeperError):
    """The API key's scope does not allow the operation."""


STATUS: Final[dict[type[StatekeeperError], int]] = {
    AuthenticationError: 401,
    PermissionDeniedError: 403,
    NotFoundError: 404,
    ConflictError: 409,
    AlreadyExistsError: 409,
    InvalidTransitionError: 409,
    LimitReachedError: 409,
    SessionLockTimeoutError: 409,
    PayloadTooLargeError: 413,
    InvalidInputError: 422,
    StoreCorruptError: 500,  # a stored row cannot be decoded: retrying will not help
    StoreError: 503,
}


def status_of(error: StatekeeperError) -> int:
    """The HTTP status of ``error``: that of its nearest class in `STATUS` (500 if none)."""
    for cls in type(error).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_body(type_name: str, message: str) -> dict[str, dict[str, str]]:
    """The JSON body of an error answer."""
    return {"error": {"type": type_name, "message": message}}


class ErrorDetail(BaseModel):
    """What went wrong: the error class name and a message that names the fix."""

    type: str
    message: str


class ErrorBody(BaseModel):
    """The body of every error answer."""

    error: ErrorDetail


ERROR_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (401, "no API key, or an unknown or revoked one (AuthenticationError)"),
        (403, "the key's scope is too low (PermissionDeniedError)"),
        (404, "not found for this tenant (NotFoundError)"),
        (409, "a conflict: already decided, taken, stale, not allowed now"),
        (413, "over the store's size limit (PayloadTooLargeError)"),
        (422, "bad input (InvalidInputError and its subclasses)"),
        (500, "a bug, or stored data that cannot be decoded (StoreCorruptError)"),
        (503, "the store failed or cannot be reached (StoreError)"),
    )
}
"""The error answers every route may give, for the OpenAPI description."""


def store_locations(url: str) -> list[str]:
    """The spellings of the store's location an error message may carry (its URL, its
    host part with any credentials, its file path as given and made absolute), longest
    first."""
    parts = urlsplit(url)
    found = {url, parts.netloc}
    if parts.scheme in ("sqlite", "files"):
        location = unquote(parts.netloc + parts.path)
        for path in (location, location[1:]):  # sqlite:///rel/x.db names rel/x.db
            found.add(path)
            with contextlib.suppress(OSError, ValueError):
                found.add(str(Path(path).resolve()))
    return sorted((f for f in found if len(f) > 3), key=len, reverse=True)


def redact(message: str, locations: Sequence[str]) -> str:
    """``message`` without the store's location: clients learn what failed, the server's
    log (which keeps the full message) where."""
    for location in locations:
        message = message.replace(location, "<store>")
    return message


def reported(items: Sequence[Any], locations: Sequence[str]) -> list[dict[str, Any]]:
    """Damaged items (`CorruptItem`s or their JSON) as a listing answers them: their
    errors without the store's location."""
    out = []
    for item in items:
        data = dict(item) if isinstance(item, dict) else item.model_dump(mode="json")
        if isinstance(data.get("error"), str):
            data["error"] = redact(data["error"], locations)
        out.append(data)
    return out
