"""A scripted agent (no model) for demos, tests and dry runs.

Each step returns the next action of its script. A script item may also be a function
of the `StepInput` returning an action, to react to what the run has seen so far.
Where a script item is an action, the agent counts which one it is on from the run's
turn, so a resumed run continues the script where the stopped one left off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from statekeeper.core.messages import Message, utcnow
from statekeeper.errors import InvalidInputError
from statekeeper.ids import new_id
from statekeeper.runs.agent import Action, Finish, Handoff, Respond, StepInput

__all__ = ["ScriptedAgent"]

ScriptItem = Action | Callable[[StepInput], Action]


class ScriptedAgent:
    """Plays ``script``: step ``n`` of a run (its turn) returns item ``n - 1 - offset``."""

    def __init__(self, name: str, script: Sequence[ScriptItem], *, offset: int = 0) -> None:
        if not script:
            raise InvalidInputError("a scripted agent needs at least one action")
        self.name = name
        self.script = list(script)
        self.offset = offset

    async def step(self, run: StepInput) -> Action:
        """The script item for this turn (the last item repeats if the run goes on)."""
        index = min(max(run.state.turn - 1 - self.offset, 0), len(self.script) - 1)
        item = self.script[index]
        action = item(run) if callable(item) and not isinstance(item, Finish) else item
        # A script may repeat an action: every message it returns is a new message.
        if isinstance(action, Respond):
            return replace(action, messages=[_fresh(m) for m in action.messages])
        if isinstance(action, Finish | Handoff) and action.message is not None:
            return replace(action, message=_fresh(action.message))
        return action


def _fresh(message: Message) -> Message:
    return message.model_copy(update={"id": new_id("msg"), "created_at": utcnow()})
