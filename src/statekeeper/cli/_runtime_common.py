"""Helpers shared by the runtime commands (events, subagents, lanes, profiles)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["clip", "reflow", "span", "utc"]


def reflow(func: F) -> F:
    """Join the lines of each paragraph of a command's docstring.

    Typer keeps the single line breaks of a help text's later paragraphs, which then
    wrap raggedly; the source keeps them to stay within the line length.
    """
    if func.__doc__:
        paragraphs = inspect.cleandoc(func.__doc__).split("\n\n")
        func.__doc__ = "\n\n".join(
            " ".join(line.strip() for line in paragraph.splitlines()) for paragraph in paragraphs
        )
    return func


def utc(when: datetime) -> datetime:
    return when.astimezone(UTC) if when.tzinfo is not None else when.replace(tzinfo=UTC)


def span(seconds: float) -> str:
    """A duration, short: ``45s``, ``3m05s``, ``2h03m``, ``1d04h``."""
    total = int(abs(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# -- events ---------------------------------------------------------------------------------
