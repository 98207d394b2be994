"""Google ADK on statekeeper: `StatekeeperSessionService`, a drop-in ``BaseSessionService``
(extra ``adk``). See docs/integrations/adk.md for the mapping onto tenants."""

from __future__ import annotations

from statekeeper.errors import MissingExtraError

try:
    import google.adk.sessions  # noqa: F401  (fail here, with the extra's name)
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingExtraError("statekeeper.integrations.adk", "adk") from None

from statekeeper.integrations._owned import AdapterClosedError
from statekeeper.integrations.adk._codec import (
    AdkSessionExistsError,
    AdkSessionNotFoundError,
    AdkStaleSessionError,
)
from statekeeper.integrations.adk.service import StatekeeperSessionService

__all__ = [
    "AdapterClosedError",
    "AdkSessionExistsError",
    "AdkSessionNotFoundError",
    "AdkStaleSessionError",
    "StatekeeperSessionService",
]
