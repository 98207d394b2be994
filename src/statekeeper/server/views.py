"""The JSON shapes of the API (see docs/server.md), built from the library's records.

Pure functions of what was read: no I/O here, so each shape is defined once and the
routes only read and call these.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from statekeeper.core.limits import Limits
from statekeeper.core.messages import (
    Message,
    MessageCategory,
    Role,
    default_category,
    stored_message,
    utcnow,
)
from statekeeper.core.metrics import Metrics
from statekeeper.runs.approvals import settle
from statekeeper.runs.operations import timeline
from statekeeper.runs.state import ApprovalDecision, Interruption, RunState
from statekeeper.runs.store import CHECKPOINT_KIND, RunIndex
from statekeeper.runs.why import why_stopped
from statekeeper.stores.base import Entry, Event, SessionRecord

__all__ = [
    "entry_json",
    "event_json",
    "limits_json",
    "metrics_json",
    "pending_json",
    "run_detail",
    "run_summary",
    "session_summary",
    "tree_json",
]


def run_summary(index: RunIndex, state: RunState | None) -> dict[str, Any]:
    """A `RunSummary`: the index, with cost, budget and pending calls from the state."""
    live = index.owner is not None and index.lease_until is not None
    budget = state.limits.budget if state is not None else None
    return {
        "run_id": index.run_id,
        "session_id": index.session_id,
        "agent": index.agent,
        "status": index.status,
        "step": index.turn,
        "cost_usd": state.local_metrics.accumulated_cost if state is not None else 0.0,
        "budget_usd": budget.maximum if budget is not None else None,
        "pending_approvals": len(settle(state).pending) if state is not None else 0,
        "cancel_requested": index.cancel_requested,
        "failed_to_start": index.failed_to_start,  # its process died before a checkpoint
        "parent_run_id": index.parent_run_id,
        "stopped": None if (why := why_stopped(index, state)) is None else why.to_dict(),
        "owner": index.owner if live and index.lease_until > utcnow() else None,  # type: ignore[operator]
        "created_at": index.created_at.isoformat(),
        "updated_at": index.updated_at.isoformat(),
    }


def metrics_json(metrics: Metrics) -> dict[str, Any]:
    """Calls, tokens and cost, in total and per model."""
    usage = metrics.usage
    return {
        "calls": metrics.calls,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total,
        "cost_usd": metrics.accumulated_cost,
        "models": {
            name: {
                "calls": model.calls,
                "input_tokens": model.usage.input_tokens,
                "output_tokens": model.usage.output_tokens,
                "cost_usd": model.cost,
            }
            for name, model in sorted(metrics.models.items())
        },
    }


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _decision_json(decision: ApprovalDecision) -> dict[str, Any]:
    out = decision.model_dump(mode="json", exclude={"arguments"})
    if decision.edited_arguments is not None:  # what ran instead of the call's arguments
        out["edited_arguments"] = _arguments(decision.edited_arguments)
    return out


def limits_json(limits: Limits) -> list[dict[str, Any]]:
    """Each limit that is set: its name, how much is used, its maximum (null: none)."""
    return [{"name": f.name, "current": f.current, "limit": f.maximum} for f in limits.flags()]


def pending_json(state: RunState) -> list[dict[str, Any]]:
    """The calls ``state`` waits on a decision for (see `settle`), with any decision."""
    return [_pending_json(call, state) for call in settle(state).pending]


def _pending_json(call: Interruption, state: RunState) -> dict[str, Any]:
    decision = next((d for d in state.decisions if d.call_id == call.call_id), None)
    return {
        "call_id": call.call_id,
        "tool": call.tool,
        "arguments": _arguments(call.arguments),
        "prompt": call.prompt,
        "agent": call.agent,
        "requested_at": call.requested_at.isoformat(),
        "decision": None if decision is None else _decision_json(decision),
    }


def run_detail(
    index: RunIndex,
    state: RunState | None,
    events: Iterable[Event],
    children: list[dict[str, Any]],
) -> dict[str, Any]:
    """A `RunDetail`: the summary plus limits, metrics, calls, errors and children."""
    out = run_summary(index, state)
    out["timeline"] = timeline(list(events))
    out["children"] = children
    if state is None:
        out |= {"headless": index.headless, "limits": [], "metrics": metrics_json(Metrics())}
        out |= {"tool_use": {}, "error": None, "error_detail": None, "pending": []}
        out |= {"decisions": [], "output": None, "forked_from": None}
        return out
    error = state.error
    origin = state.metadata.get("forked_from")
    out |= {
        "headless": state.headless,
        "limits": limits_json(state.limits),
        "metrics": metrics_json(state.local_metrics),
        "tool_use": dict(state.tool_use),
        "error": None if error is None else f"{error.type}: {error.message}",
        "error_detail": None if error is None else error.model_dump(mode="json"),
        "pending": pending_json(state),
        "decisions": [_decision_json(d) for d in state.decision_history],
        "output": state.output,
        "forked_from": (
            {"run_id": origin.get("run_id"), "step": origin.get("step")}
            if isinstance(origin, dict)
            else None
        ),
    }
    return out


def event_json(event: Event, session_id: str | None) -> dict[str, Any]:
    """An `Event` of the API (and the ``data:`` of a stream message)."""
    return {
        "id": str(event.seq),
        "seq": event.seq,
        "run_id": event.log_id,
        "session_id": session_id,
        "stream": event.stream,
        "kind": event.kind,
        "type": f"{event.stream}/{event.kind}",
        "at": event.ts.isoformat(),
        "data": event.payload,
    }


def session_summary(record: SessionRecord) -> dict[str, Any]:
    """A `SessionSummary`."""
    fork = record.forked_from
    return {
        "session_id": record.id,
        "agent_id": record.agent_id,
        "title": record.title,
        "created_at": record.created_at.isoformat(),
        "last_active": record.last_active.isoformat(),
        "message_count": record.message_count,
        "total_tokens": record.total_tokens,
        "compaction_count": record.compaction_count,
        "head_seq": record.head_seq,
        "last_seq": record.last_seq,
        "continued_from": record.continued_from,
        "continued_to": record.continued_to,
        "forked_from": None if fork is None else {"session_id": fork.session_id, "seq": fork.seq},
        "metadata": record.metadata,
        "version": record.version,
    }


_NO_PAYLOAD = frozenset({"message", "compaction", CHECKPOINT_KIND})


def _message(entry: Entry) -> Message | None:
    """The message of a message entry, or the summary of a compaction (else None)."""
    if entry.kind == "message":
        return stored_message(entry.payload, entry.id, entry.created_at)
    summary = entry.payload.get("summary") if entry.kind == "compaction" else None
    return Message.from_dict(summary) if isinstance(summary, dict) else None


def _covers(entry: Entry, by_seq: dict[int, Entry]) -> list[int]:
    """The seqs a compaction entry stands for: its ancestors up to ``through_seq``,
    back to the previous compaction (which it summarised too), system and context
    messages left out (compaction never replaces them)."""
    through = entry.payload.get("through_seq")
    if entry.kind != "compaction" or not isinstance(through, int):
        return []
    kept = (MessageCategory.SYSTEM, MessageCategory.CONTEXT)
    covered: list[int] = []
    seq = entry.parent_seq
    while seq is not None and (parent := by_seq.get(seq)) is not None:
        if parent.seq <= through:
            message = _message(parent) if parent.kind == "message" else None
            if parent.kind == "compaction" or (
                message is not None and message.category not in kept
            ):
                covered.append(parent.seq)
            if parent.kind == "compaction":
                break
        seq = parent.parent_seq
    return sorted(covered)


_CATEGORY_NAMES = {category.value: category.name.lower() for category in MessageCategory}
_TEXT_ROLES = {role.value: default_category(role).value for role in Role}


def _json_time(iso: str) -> str:
    """A time as pydantic writes it in JSON, given its ``isoformat()``: UTC as ``Z``."""
    return iso[:-6] + "Z" if iso.endswith("+00:00") else iso


def _text_message(entry: Entry, created: str) -> dict[str, Any] | None:
    """`Message.to_dict` of the message a message entry holds, built from the payload
    when it is the usual text message (role and text, maybe tokens: what `stored_message`
    would read as it is), else None. Made from the `Message`, a page of 20 entries cost a
    third more than the rest of its request; tests hold the two to the same answer."""
    payload = entry.payload
    role, content, tokens = payload.get("role"), payload.get("content"), payload.get("tokens")
    if (
        type(role) is not str
        or role not in _TEXT_ROLES
        or type(content) is not str
        or len(payload) != 2 + ("tokens" in payload)
        or not (tokens is None or (type(tokens) is int and tokens >= 0))
        or not 0 < len(entry.id) <= 128
    ):
        return None
    return {
        "role": role,
        "content": content,
        "category": _TEXT_ROLES[role],
        "id": entry.id,
        "created_at": _json_time(created),
        "name": None,
        "metadata": {},
        "tokens": tokens,
    }


def entry_json(entry: Entry, by_seq: dict[int, Entry], branch: set[str]) -> dict[str, Any]:
    """An `Entry`: the stored message (or a compaction's summary) and its category."""
    created = entry.created_at.isoformat()
    data = _text_message(entry, created) if entry.kind == "message" else None
    if data is None:
        message = _message(entry)
        data = None if message is None else message.to_dict()
    return {
        "seq": entry.seq,
        "id": entry.id,
        "parent_seq": entry.parent_seq,
        "kind": entry.kind,
        "created_at": created,
        "on_branch": entry.id in branch,
        "category": None if data is None else _CATEGORY_NAMES[data["category"]],
        "message": data,
        "covers": _covers(entry, by_seq) if entry.kind == "compaction" else [],
        # A checkpoint's payload is a whole run state (maybe sealed): the run's routes show it.
        "payload": None if entry.kind in _NO_PAYLOAD else entry.payload,
    }


def tree_json(record: SessionRecord, entries: list[Entry], branch: set[str]) -> dict[str, Any]:
    """The transcript as a DAG: nodes, parent and summary edges, and session links."""
    by_seq = {e.seq: e for e in entries}
    nodes = [entry_json(e, by_seq, branch) for e in entries]
    edges: list[dict[str, Any]] = []
    for node in nodes:
        if node["parent_seq"] is not None:
            edges.append({"from": node["parent_seq"], "to": node["seq"], "type": "parent"})
        edges += [{"from": node["seq"], "to": s, "type": "summarizes"} for s in node["covers"]]
        del node["payload"]
    summary = session_summary(record)
    return {
        "session_id": record.id,
        "head_seq": record.head_seq,
        "nodes": nodes,
        "edges": edges,
        "links": {k: summary[k] for k in ("continued_from", "continued_to", "forked_from")},
    }
