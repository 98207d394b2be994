"""``statekeeper events tail``: a run's event log, optionally followed until it ends."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    JsonFlag,
    console,
    fail,
    ids_whole,
    run,
    stamp,
    wants_json,
)
from statekeeper.cli._runtime_common import clip, utc
from statekeeper.errors import NotFoundError
from statekeeper.ids import validate_id
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.stores import Store
from statekeeper.stores.base import Event

__all__ = ["events_app", "pause", "stdout_is_terminal"]


_PAGE = 500
_PAYLOAD_WIDTH = 240
_HIDDEN_KEYS = ("trace_id", "span_id")  # on runner events; kept in --json output
_OVERVIEW_RUNS = 10

events_app = typer.Typer(
    help="Read the event logs of runs (one log per run).", no_args_is_help=True
)


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal, which turns ``--follow`` on by default (tests replace
    this)."""
    return sys.stdout.isatty()


async def pause(seconds: float) -> None:
    """The wait between two polls of the log while following (tests replace this)."""
    await asyncio.sleep(seconds)


def _terminal(event: Event) -> bool:
    return event.stream == "lifecycle" and event.kind in ("end", "abort")


def event_json(event: Event) -> dict[str, Any]:
    """An event as the JSON object ``--json`` prints (one per line)."""
    return {
        "run_id": event.log_id,
        "seq": event.seq,
        "ts": utc(event.ts).isoformat(),
        "stream": event.stream,
        "kind": event.kind,
        "payload": event.payload,
    }


def _payload_text(event: Event) -> str:
    """The payload as compact JSON without the trace and span ids, clipped ("" when empty)."""
    payload = {k: v for k, v in event.payload.items() if k not in _HIDDEN_KEYS}
    if not payload:
        return ""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str)
    return clip(text, _PAYLOAD_WIDTH)


def event_line(event: Event) -> str:
    """An event as one line: seq, UTC time, stream/kind, compact payload (no trace id)."""
    when = utc(event.ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"{event.seq:>5}  {when}  {event.stream}/{event.kind}  {_payload_text(event)}".rstrip()


def _emit(event: Event, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(event_json(event), ensure_ascii=False, default=str))
    else:
        typer.echo(event_line(event))  # echo flushes: a follower sees each event at once


async def _pages(store: Store, tenant: str, run_id: str, after: int) -> AsyncIterator[list[Event]]:
    """The run's logged events after seq ``after``, page by page."""
    while page := await store.read_events(tenant, run_id, after_seq=after, limit=_PAGE):
        yield page
        after = page[-1].seq


async def _run_known(store: Store, tenant: str, run_id: str) -> bool:
    """Whether the run has an event log or is in the runs index."""
    validate_id(run_id, "run id")
    if await store.read_events(tenant, run_id, limit=1):
        return True
    try:
        await RunStore(store, tenant).index(run_id)
    except NotFoundError:
        return False
    return True


@dataclass
class _Latest:
    index: RunIndex
    last_seq: int = 0
    event: Event | None = None


def _overview(
    ctx: typer.Context, streams: frozenset[str] | None, count: int, as_json: bool
) -> None:
    async def work(store: Store, tenant: str) -> list[_Latest]:
        runs = await RunStore(store, tenant).list(limit=sys.maxsize)
        runs.sort(key=lambda index: (index.updated_at, index.run_id), reverse=True)
        found: list[_Latest] = []
        for index in runs[:count]:
            latest = _Latest(index)
            async for page in _pages(store, tenant, index.run_id, 0):
                latest.last_seq = page[-1].seq
                for event in reversed(page):
                    if streams is None or event.stream in streams:
                        latest.event = event
                        break
            found.append(latest)
        return found

    found = run(ctx, work)
    if as_json:
        for item in found:
            typer.echo(json.dumps(_latest_json(item), ensure_ascii=False, default=str))
    elif found:
        out = console()
        out.print(_overview_table(found))
        out.print(Text("show one run's events: statekeeper events tail --run ID [--follow]"))
    else:
        console().print("No runs.")


def _latest_json(item: _Latest) -> dict[str, Any]:
    index = item.index
    return {
        "run_id": index.run_id,
        "status": index.status,
        "agent": index.agent,
        "session_id": index.session_id,
        "updated_at": index.updated_at.isoformat(),
        "last_seq": item.last_seq,
        "last_event": None if item.event is None else event_json(item.event),
    }


def _overview_table(found: list[_Latest]) -> Table:
    table = Table(title=f"Latest event of the {len(found)} most recently updated run(s)")
    for column in ("run", "status", "agent", "updated (UTC)", "events", "latest event"):
        table.add_column(column, justify="right" if column == "events" else "left")
    for item in found:
        event = item.event
        latest = f"#{event.seq} {event.stream}/{event.kind} {_payload_text(event)}" if event else ""
        table.add_row(
            Text(item.index.run_id),
            Text(item.index.status),
            Text(item.index.agent),
            stamp(item.index.updated_at),
            str(item.last_seq),
            Text(latest.rstrip()),
        )
    return ids_whole(table)


RunOption = Annotated[
    str | None,
    typer.Option(
        "--run",
        metavar="ID",
        help="The run whose events to print. Without it: the latest event of each of "
        "the most recently updated runs (from the runs index).",
        show_default=False,
    ),
]
FromOption = Annotated[
    int, typer.Option("--from", min=0, metavar="SEQ", help="Only events after this seq.")
]
StreamOption = Annotated[
    list[str] | None,
    typer.Option(
        "--stream",
        metavar="S",
        help="Only events of this stream (repeat for several): lifecycle, tool, "
        "assistant, error, compaction or a custom stream.",
        show_default=False,
    ),
]
FollowOption = Annotated[
    bool | None,
    typer.Option(
        "--follow/--no-follow",
        "-f",
        help="Keep polling the log and print new events until the run's lifecycle "
        "end/abort event (or Ctrl-C, which exits with code 0). Default: on when --run "
        "is given and stdout is a terminal, off otherwise (pipes, scripts).",
        show_default=False,
    ),
]
IntervalOption = Annotated[
    float, typer.Option(min=0.01, help="Seconds between two polls while following.")
]
LimitOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        metavar="N",
        help="With --run: only the last N of the events already logged (like tail -n; "
        "events that arrive while following are all printed). Without --run: this "
        f"many runs (default {_OVERVIEW_RUNS}).",
        show_default=False,
    ),
]


@dataclass
class _Tail:
    """One ``events tail --run``: prints the log, then follows it if asked to."""

    run_id: str
    after: int
    streams: frozenset[str] | None
    following: bool
    interval: float
    limit: int | None
    as_json: bool
    ended: bool = False
    last: int = 0
    printed: int = 0

    def _wanted(self, event: Event) -> bool:
        return self.streams is None or event.stream in self.streams

    async def __call__(self, store: Store, tenant: str) -> int:
        """Print the events; returns how many were printed. A follower of a run that has
        not started yet waits for it (a run started right after its watcher)."""
        if not await _run_known(store, tenant, self.run_id):
            if not self.following:
                fail(
                    f"no run {self.run_id!r}: it has no event log and is not in the runs "
                    "index (see `statekeeper runs list`, or add --follow to wait for it)"
                )
            console(stderr=True).print(
                Text(f"waiting for run {self.run_id} to start (Ctrl-C to stop)")
            )
        await self._backlog(store, tenant)
        if self.following:
            await self._follow(store, tenant)
        return self.printed

    async def _backlog(self, store: Store, tenant: str) -> None:
        """Print the last ``limit`` events after ``after`` that are logged already."""
        backlog: deque[Event] = deque(maxlen=self.limit)
        # A follower reads from the start, to know whether the run has already ended.
        start = 0 if self.following else self.after
        async for page in _pages(store, tenant, self.run_id, start):
            for event in page:
                self.ended = self.ended or _terminal(event)
                if event.seq > self.after and self._wanted(event):
                    backlog.append(event)
            self.last = page[-1].seq
        for event in backlog:
            _emit(event, self.as_json)
        self.printed += len(backlog)

    async def _follow(self, store: Store, tenant: str) -> None:
        """Poll for new events and print them until the run's lifecycle ends."""
        self.last = max(self.last, self.after)
        while not self.ended:
            await pause(self.interval)
            async for page in _pages(store, tenant, self.run_id, self.last):
                for event in page:
                    self.ended = self.ended or _terminal(event)
                    if self._wanted(event):
                        _emit(event, self.as_json)
                        self.printed += 1
                self.last = page[-1].seq


def _need_run(follow: bool | None, from_seq: int) -> None:
    """Refuse options that only make sense for one run's log."""
    for given, name in ((follow, "--follow"), (from_seq, "--from")):
        if given:
            raise typer.BadParameter(
                f"{name} needs --run ID: the store keeps one event log per run "
                "(find run ids with `statekeeper runs list`)",
                param_hint=name,
            )


@events_app.command("tail")
def tail(
    ctx: typer.Context,
    run_id: RunOption = None,
    from_seq: FromOption = 0,
    streams: StreamOption = None,
    follow: FollowOption = None,
    interval: IntervalOption = 0.5,
    limit: LimitOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Print a run's events (seq, UTC time, stream/kind, payload) from its event log.

    The store keeps one event log per run and cannot list logs: without --run this
    shows the latest event of recent runs from the runs index instead (runs that only
    ever published through an EventBus, with no runner, need --run). --json prints one
    JSON object per line; text lines leave out the payload's trace_id and span_id.
    """
    as_json = wants_json(ctx, json_output)
    wanted = frozenset(streams) if streams else None
    if run_id is None:
        _need_run(follow, from_seq)
        _overview(ctx, wanted, limit or _OVERVIEW_RUNS, as_json)
        return
    following = stdout_is_terminal() if follow is None else follow
    job = _Tail(run_id, from_seq, wanted, following, interval, limit, as_json)
    try:
        printed = run(ctx, job)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    if printed == 0 and not as_json and not following:
        console().print(Text(f"No events of run {run_id} after seq {from_seq}."))
