"""Id validation and generation.

An id names a tenant, session, entry, record key or namespace. The rules are strict so
that an id can be used as a file name, a Redis key part or a SQL value without escaping,
and can never climb out of a directory.
"""

from __future__ import annotations

import os
import re
import threading
import time

from statekeeper.errors import InvalidIdError

__all__ = ["MAX_ID_LENGTH", "new_id", "validate_id"]

MAX_ID_LENGTH = 128

# Letters, digits and . _ : @ - ; starts with a letter or digit. No slashes, no spaces,
# no control characters; ".." is refused separately.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]*")


_KNOWN_VALID: set[str] = set()  # ids seen valid lately: an append checks a few of them
_KNOWN_LIMIT = 4096


def validate_id(value: object, kind: str = "id") -> str:
    """Return ``value`` if it is a valid id, else raise `InvalidIdError` naming the problem."""
    if type(value) is str and value in _KNOWN_VALID:
        return value
    if not isinstance(value, str):
        raise InvalidIdError(f"{kind} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdError(f"{kind} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidIdError(
            f"{kind} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}"
        )
    if not _ID_RE.fullmatch(value) or ".." in value:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise InvalidIdError(
            f"{kind} {shown!r} is not allowed: use letters, digits and . _ : @ - "
            "(starting with a letter or digit, no '..')"
        )
    if type(value) is str:  # not a subclass: its equality could lie
        if len(_KNOWN_VALID) >= _KNOWN_LIMIT:
            _KNOWN_VALID.clear()
        _KNOWN_VALID.add(value)
    return value


_last_ms = 0
_counter = 0
_RANDOM_CHUNK = 6 * 1024
_random = b""  # unused bytes from os.urandom, read in chunks: one system call per 1,024 ids
_random_at = 0
_lock = threading.Lock()


def _forget_random() -> None:
    # A forked child must not hand out the ids its parent will (the same buffered bytes).
    global _random, _random_at
    _random, _random_at = b"", 0


os.register_at_fork(after_in_child=_forget_random)


def new_id(prefix: str = "") -> str:
    """A new unique id, sortable by creation time within one process.

    48 bits of milliseconds, a per-millisecond counter and 48 random bits, in hex.
    """
    global _last_ms, _counter, _random, _random_at
    with _lock:  # threads must not take the same bytes
        ms = time.time_ns() // 1_000_000
        if ms == _last_ms:
            _counter += 1
        else:
            _last_ms, _counter = ms, 0
        if _random_at >= len(_random):
            _random, _random_at = os.urandom(_RANDOM_CHUNK), 0
        noise = _random[_random_at : _random_at + 6]
        _random_at += 6
        count = _counter
    body = f"{ms:012x}{count & 0xFFF:03x}{noise.hex()}"
    return f"{prefix}_{body}" if prefix else body
