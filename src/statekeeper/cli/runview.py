"""How ``statekeeper runs show`` prints a run: fields, approvals, usage, errors, timeline."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import FINISHED_RUNS, console, fields_table, ids_whole, stamp
from statekeeper.core.messages import utcnow
from statekeeper.runs.operations import timeline
from statekeeper.runs.recovery import CORRUPT_EVENT_TYPE
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunIndex
from statekeeper.runs.why import why_stopped
from statekeeper.stores.base import Event

__all__ = ["RunView", "print_run", "recoveries", "runs_table", "timeline"]


@dataclass
class RunView:
    """What ``runs show`` read: the index, the latest checkpoint (if any) and the event log."""

    index: RunIndex
    state: RunState | None
    events: list[Event]


def recoveries(events: list[Event]) -> list[dict[str, Any]]:
    """The corrupt checkpoints loading skipped, as the run's event log reports them."""
    return [
        {"seq": event.seq, "ts": event.ts.isoformat(), **event.payload}
        for event in events
        if event.stream == "error" and event.payload.get("type") == CORRUPT_EVENT_TYPE
    ]


def _describe(row: dict[str, Any]) -> str:
    if row["kind"] == "status" and "from" in row and "to" in row:
        return f"{row['from']} -> {row['to']}"
    details = {k: v for k, v in row.items() if k not in ("seq", "ts", "kind", "turn")}
    return f"{row['kind']} " + " ".join(f"{k}={v}" for k, v in details.items())


def _decision_of(state: RunState, call_id: str) -> str:
    for decision in state.decisions:
        if decision.call_id == call_id:
            verdict = "approved" if decision.approved else "rejected"
            if decision.edited_arguments is not None:
                verdict += f" with edited arguments {decision.edited_arguments}"
            return verdict + (f" ({decision.reason})" if decision.reason else "")
    rule = state.always.get(next((i.tool for i in state.interruptions if i.call_id == call_id), ""))
    if rule is not None:
        return "always " + ("approved" if rule else "rejected")
    return "pending"


def print_run(view: RunView) -> None:
    """Print a run for people (``runs show`` without --json)."""
    index, state = view.index, view.state
    out = console()
    rows: list[tuple[str, object]] = [
        ("run", index.run_id),
        ("status", Text(index.status, style="bold")),
        ("why stopped", None if (why := why_stopped(index, state)) is None else why.text),
        ("agent", index.agent),
        ("session", index.session_id),
        ("turn", index.turn),
        ("created", stamp(index.created_at) + " UTC"),
        ("updated", stamp(index.updated_at) + " UTC"),
        ("group", index.group_id),
        ("parent run", index.parent_run_id),
        ("cancel requested", "yes" if index.cancel_requested else None),
    ]
    if index.owner and index.lease_until and index.lease_until > utcnow():
        rows.append(("lease", f"{index.owner} until {stamp(index.lease_until)} UTC"))
    if state is not None:
        limits = [
            f"{flag.name} {flag.current:g}/{'∞' if flag.maximum is None else f'{flag.maximum:g}'}"
            for flag in state.limits.flags()
        ]
        stopped = state.status not in FINISHED_RUNS
        at_limit = [flag.name for flag in state.limits.reached()] if stopped else []
        rows += [
            ("mode", "headless" if state.headless else "interactive"),
            ("delegate level", state.delegate_level or None),
            ("limits", ", ".join(limits)),
            (
                "limit reached",
                f"{', '.join(at_limit)} (raise with `statekeeper runs raise-limit`)"
                if at_limit
                else None,
            ),
            ("trace", state.trace.trace_id),
            ("cancel reason", state.metadata.get("cancel_reason")),
            ("forked from", _forked_from(state)),
            ("output", None if state.output is None else json.dumps(state.output)),
        ]
    else:
        rows.append(("checkpoint", "none yet (the run never completed a step)"))
    out.print(fields_table(rows, title=f"Run {index.run_id}"))

    if state is not None:
        _print_state(state)
    _print_recoveries(view.events)
    lifecycle = timeline(view.events)
    if lifecycle:
        table = Table(title="Status timeline")
        table.add_column("seq", justify="right")
        table.add_column("time (UTC)")
        table.add_column("event", overflow="fold")
        for row in lifecycle:
            table.add_row(str(row["seq"]), row["ts"][:19].replace("T", " "), Text(_describe(row)))
        out.print(table)


def _forked_from(state: RunState) -> str | None:
    origin = state.metadata.get("forked_from")
    if not isinstance(origin, dict):
        return None
    return f"run {origin.get('run_id')} at step {origin.get('step')}"


def _print_recoveries(events: list[Event]) -> None:
    rows = recoveries(events)
    if not rows:
        return
    table = Table(title="Recovered from corrupt checkpoints", style="yellow")
    for column in ("time (UTC)", "skipped", "entry", "loaded instead", "why"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            row["ts"][:19].replace("T", " "),
            Text(str(row.get("checkpoint", "?"))),
            str(row.get("seq", "?")),
            Text(f"{row.get('loaded', '?')} (turn {row.get('turn', '?')})"),
            Text(str(row.get("message", ""))),
        )
    console().print(ids_whole(table))


def _print_state(state: RunState) -> None:
    out = console()
    tables = (_approvals(state), _decisions(state), _tool_calls(state), _usage(state))
    for table in (*tables, _guardrails(state)):
        if table is not None:
            out.print(table)
    if state.error is not None:
        error = state.error
        rows: list[tuple[str, object]] = [
            ("type", error.type),
            ("message", error.message),
            ("turn", error.turn),
            ("at", stamp(error.at) + " UTC"),
            ("data", json.dumps(error.data) if error.data else None),
        ]
        out.print(fields_table(rows, title="Error"), style="red")


def _approvals(state: RunState) -> Table | None:
    if not state.interruptions:
        return None
    table = Table(title="Pending approvals")
    for column in ("call id", "tool", "arguments", "prompt", "decision"):
        table.add_column(column, overflow="fold")
    for item in state.interruptions:
        table.add_row(
            Text(item.call_id),
            Text(item.tool),
            Text(item.arguments),
            Text(item.prompt or ""),
            Text(_decision_of(state, item.call_id)),
        )
    return ids_whole(table)


def _decisions(state: RunState) -> Table | None:
    """The decisions on calls the run settled (kept for good), oldest first."""
    if not state.settled_decisions:
        return None
    table = Table(title="Approval decisions")
    edited = any(d.edited_arguments is not None for d in state.settled_decisions)
    columns = ("call id", "tool", "decision", "by", "at (UTC)", "reason")
    for column in (*columns, "ran with (edited)") if edited else columns:
        table.add_column(column, overflow="fold")
    for decision in state.settled_decisions:
        verdict = "approved" if decision.approved else "rejected"
        if decision.edited_arguments is not None:
            verdict += " with edits"
        row: list[Text | str] = [
            Text(decision.call_id),
            Text(decision.tool),
            Text(verdict + (" (always)" if decision.always else "")),
            Text(decision.decided_by or ""),
            stamp(decision.decided_at),
            Text(decision.reason or ""),
        ]
        if edited:
            row.append(Text(decision.edited_arguments or ""))
        table.add_row(*row)
    return ids_whole(table)


def _tool_calls(state: RunState) -> Table | None:
    if not state.tool_use:
        return None
    table = Table(title="Tool calls")
    table.add_column("tool")
    table.add_column("calls", justify="right")
    for tool, count in sorted(state.tool_use.items()):
        table.add_row(Text(tool), str(count))
    return table


def _usage(state: RunState) -> Table | None:
    metrics = state.local_metrics  # a delegated run's own: not its parent's before it
    if not metrics.models:
        return None
    delegated = metrics - state.own_metrics
    title = "Cost and tokens per model" + (" (with delegated runs)" if delegated.models else "")
    table = Table(title=title)
    for column in ("model", "calls", "input", "output", "total tokens", "cost"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, usage in sorted(metrics.models.items()):
        table.add_row(
            Text(name),
            str(usage.calls),
            str(usage.usage.input_tokens),
            str(usage.usage.output_tokens),
            str(usage.usage.total),
            f"{usage.cost:.6f}",
        )
    total = metrics.usage
    table.add_row(
        "total",
        str(metrics.calls),
        str(total.input_tokens),
        str(total.output_tokens),
        str(total.total),
        f"{metrics.accumulated_cost:.6f}",
        style="bold",
    )
    if delegated.models:
        spent = delegated.usage
        row = (str(delegated.calls), str(spent.input_tokens), str(spent.output_tokens))
        table.add_row(
            "of which delegated", *row, str(spent.total), f"{delegated.accumulated_cost:.6f}"
        )
    return table


def _guardrails(state: RunState) -> Table | None:
    triggered = [g for g in state.guardrails if g.triggered]
    if not triggered:
        return None
    table = Table(title="Triggered guardrails")
    for column in ("name", "kind", "turn", "info"):
        table.add_column(column, overflow="fold")
    for g in triggered:
        table.add_row(Text(g.name), g.kind, str(g.turn), Text(json.dumps(g.info)))
    return table


def runs_table(runs: list[RunIndex]) -> Table:
    """The table ``runs list`` prints: one row per run."""
    now = utcnow()
    table = Table()
    for column in ("id", "status", "agent", "turn", "session", "updated (UTC)", "notes"):
        table.add_column(column, justify="right" if column == "turn" else "left")
    for index in runs:
        notes = []
        if index.failed_to_start:
            notes.append("failed to start")
        if index.cancel_requested and index.status != "cancelled":
            notes.append("cancel requested")
        if index.owner and index.lease_until and index.lease_until > now:
            notes.append(f"running on {index.owner}")
        if index.parent_run_id:
            notes.append(f"child of {index.parent_run_id}")
        table.add_row(
            Text(index.run_id),
            Text(index.status),
            Text(index.agent),
            str(index.turn),
            Text(index.session_id),
            stamp(index.updated_at),
            Text(", ".join(notes)),
        )
    return ids_whole(table)
