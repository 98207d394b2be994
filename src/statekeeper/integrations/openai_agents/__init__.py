"""The OpenAI Agents SDK on statekeeper (extra ``openai-agents``).

- `StatekeeperSession`: the SDK's ``Session`` over any statekeeper store, items stored
  verbatim; pass it to ``Runner.run(..., session=...)`` where a ``SQLiteSession`` went
  (``StatekeeperSession.from_url(session_id, url)`` opens, and closes, a store of its own).
- `RunStateStore`: the SDK's ``RunState`` saved when a run stops for tool approval,
  listed with its pending calls, decided from any process and restored to resume.

See ``docs/integrations/openai-agents.md``.
"""

from statekeeper.integrations.openai_agents._sdk import require_sdk

require_sdk()

from statekeeper.integrations._owned import AdapterClosedError  # noqa: E402
from statekeeper.integrations.openai_agents.run_states import (  # noqa: E402
    PendingApproval,
    RunStateStore,
    SavedRunList,
    SavedRunState,
)
from statekeeper.integrations.openai_agents.session import (  # noqa: E402
    InvalidItemsError,
    InvalidSessionSettingsError,
    StatekeeperSession,
)

__all__ = [
    "AdapterClosedError",
    "InvalidItemsError",
    "InvalidSessionSettingsError",
    "PendingApproval",
    "RunStateStore",
    "SavedRunList",
    "SavedRunState",
    "StatekeeperSession",
]
