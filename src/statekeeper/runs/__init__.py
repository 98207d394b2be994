"""Runs: run state, the runner, approvals, limits, delegation and resume."""

from statekeeper.runs.agent import (
    Action,
    Agent,
    AskInput,
    Cancel,
    Finish,
    Handoff,
    ModelCall,
    Respond,
    StepInput,
    Tool,
    ToolContext,
)
from statekeeper.runs.runner import EventSink, Runner, RunResult
from statekeeper.runs.state import (
    CURRENT_SCHEMA_VERSION,
    SCHEMA_VERSION_SUMMARIES,
    ApprovalDecision,
    ErrorDetails,
    GuardrailResult,
    Interruption,
    RunState,
    TraceState,
)
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.runs.writer import WriteMode

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "MISSING",
    "SCHEMA_VERSION_SUMMARIES",
    "Action",
    "Agent",
    "ApprovalDecision",
    "AskInput",
    "Cancel",
    "ErrorDetails",
    "EventSink",
    "Finish",
    "GuardrailResult",
    "HandlerContext",
    "HandlerError",
    "Handoff",
    "InputField",
    "Interruption",
    "ModelCall",
    "Respond",
    "RunIndex",
    "RunResult",
    "RunState",
    "RunStore",
    "Runner",
    "StateHandlerAgent",
    "StepInput",
    "Tool",
    "ToolContext",
    "TraceState",
    "WriteMode",
]
