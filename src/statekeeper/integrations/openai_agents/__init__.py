"""The OpenAI Agents SDK on statekeeper (extra ``openai-agents``).

- `StatekeeperSession`: the SDK's ``Session`` over any statekeeper store, items stored
  verbatim; pass it to ``Runner.run(..., session=...)`` where a ``SQLiteSession`` went.
- `RunStateStore`: the SDK's ``RunState`` saved when a run stops for tool approval,
  listed with its pending calls, decided from any process and restored to resume.

See ``docs/integrations/openai-agents.md``.
"""

from statekeeper.integrations.openai_agents._sdk import require_sdk

require_sdk()

from statekeeper.integrations.openai_agents.run_states import (  # noqa: E402
    PendingApproval,
    RunStateStore,
    SavedRunList,
    SavedRunState,
)
from statekeeper.integrations.openai_agents.session import StatekeeperSession  # noqa: E402

__all__ = [
    "PendingApproval",
    "RunStateStore",
    "SavedRunList",
    "SavedRunState",
    "StatekeeperSession",
]
