"""Sessions and transcripts on top of a store.

See ``docs/sessions.md``; its reference table describes every name here.
"""

from statekeeper.sessions.compaction import CompactionResult, Summarizer
from statekeeper.sessions.manager import AppendOutcome, Session, SessionManager
from statekeeper.sessions.state import ScopedState
from statekeeper.sessions.view import TranscriptView

__all__ = [
    "AppendOutcome",
    "CompactionResult",
    "ScopedState",
    "Session",
    "SessionManager",
    "Summarizer",
    "TranscriptView",
]
