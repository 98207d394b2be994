"""LangGraph on statekeeper: a checkpointer and a long-term store (extra ``langgraph``).

``StatekeeperSaver`` is a ``BaseCheckpointSaver`` (docs/integrations/langgraph-checkpointer.md);
``StatekeeperStore`` is a ``BaseStore`` over `statekeeper.LongTermStore`
(docs/integrations/langgraph.md).
"""

from statekeeper.integrations._owned import AdapterClosedError
from statekeeper.integrations.langgraph.checkpoint import PickleRefusedError, StatekeeperSaver
from statekeeper.integrations.langgraph.store import StatekeeperStore

__all__ = ["AdapterClosedError", "PickleRefusedError", "StatekeeperSaver", "StatekeeperStore"]
