"""statekeeper: durable, inspectable state for AI agents.

Sessions and transcripts, lifecycle, limits and metrics, on SQLite by default.
Start with `open_store` and `SessionManager`; see the README.
"""

from statekeeper import errors
from statekeeper.core import *  # noqa: F403  (the core's names are the public API)
from statekeeper.core import __all__ as _core_names
from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidIdError,
    InvalidInputError,
    InvalidPayloadError,
    InvalidTransitionError,
    LimitReachedError,
    MissingExtraError,
    NotFoundError,
    PayloadTooLargeError,
    SchemaVersionError,
    StatekeeperError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.longterm import LongTermStore, MemoryItem
from statekeeper.retry import retry_on_conflict
from statekeeper.sessions import (
    AppendOutcome,
    CompactionResult,
    ScopedState,
    Session,
    SessionManager,
    TranscriptView,
)
from statekeeper.stores import Durability, Store, open_store
from statekeeper.stores.base import DeliveryContext, Entry, SessionRecord
from statekeeper.stores.sealed import Keyring

__version__ = "0.1.0"

__all__ = [
    *_core_names,
    "AlreadyExistsError",
    "AppendOutcome",
    "CompactionResult",
    "ConflictError",
    "DeliveryContext",
    "Durability",
    "Entry",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidPayloadError",
    "InvalidTransitionError",
    "Keyring",
    "LimitReachedError",
    "LongTermStore",
    "MemoryItem",
    "MissingExtraError",
    "NotFoundError",
    "PayloadTooLargeError",
    "SchemaVersionError",
    "ScopedState",
    "Session",
    "SessionManager",
    "SessionRecord",
    "StatekeeperError",
    "Store",
    "StoreCorruptError",
    "StoreError",
    "StoreFullError",
    "StoreReadOnlyError",
    "StoreUnavailableError",
    "TranscriptView",
    "errors",
    "open_store",
    "retry_on_conflict",
]
