"""Formatting shared by the runtime commands (events, subagents, lanes, profiles)."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["clip", "span", "utc"]


def utc(when: datetime) -> datetime:
    """``when`` in UTC; a naive time is taken to be UTC already."""
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
    """``text`` cut to ``width`` characters, ending in an ellipsis when it was longer."""
    return text if len(text) <= width else text[: width - 1] + "…"
