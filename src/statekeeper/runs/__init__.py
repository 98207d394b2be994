"""Runs: run state, the runner, approvals, limits, delegation and resume.

See ``docs/runs.md``; its reference table describes every name here.
"""

from statekeeper.runs.agent import (
    Action,
    Agent,
    AskInput,
    Cancel,
    Finish,
    Handoff,
    ModelCall,
    RateLimited,
    Respond,
    StepHandle,
    StepInput,
    Tool,
    ToolContext,
)
from statekeeper.runs.compaction import AutoCompaction
from statekeeper.runs.coordination import Coordination
from statekeeper.runs.guardrails import Guardrails, GuardrailTripped
from statekeeper.runs.handlers import (
    MISSING,
    HandlerContext,
    HandlerError,
    InputField,
    StateHandlerAgent,
)
from statekeeper.runs.history import CheckpointInfo, checkpoint_state
from statekeeper.runs.index import RunList
from statekeeper.runs.options import CheckpointOptions, ContextCodec, RunPolicy
from statekeeper.runs.recovery import CheckpointCorruptError
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
from statekeeper.runs.stats import RunUsage, SessionStats, session_stats
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.runs.traffic import TrafficControlState, traffic_control_state
from statekeeper.runs.writer import WriteMode

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "MISSING",
    "SCHEMA_VERSION_SUMMARIES",
    "Action",
    "Agent",
    "ApprovalDecision",
    "AskInput",
    "AutoCompaction",
    "Cancel",
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointOptions",
    "ContextCodec",
    "Coordination",
    "ErrorDetails",
    "EventSink",
    "Finish",
    "GuardrailResult",
    "GuardrailTripped",
    "Guardrails",
    "HandlerContext",
    "HandlerError",
    "Handoff",
    "InputField",
    "Interruption",
    "ModelCall",
    "RateLimited",
    "Respond",
    "RunIndex",
    "RunList",
    "RunPolicy",
    "RunResult",
    "RunState",
    "RunStore",
    "RunUsage",
    "Runner",
    "SessionStats",
    "StateHandlerAgent",
    "StepHandle",
    "StepInput",
    "Tool",
    "ToolContext",
    "TraceState",
    "TrafficControlState",
    "WriteMode",
    "checkpoint_state",
    "session_stats",
    "traffic_control_state",
]
