"""``make demo``: a scripted support conversation on the embedded SQLite store.

It crosses a session boundary, compacts, forks, packs a context window and prints what
it did. Run it twice: the second run finds the first run's sessions on disk.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.errors import MissingExtraError
from statekeeper.sessions import Session, SessionManager
from statekeeper.stores import open_store

DEMO_DB = Path(os.environ.get("STATEKEEPER_DEMO_DB", ".statekeeper/demo.db"))

SCRIPT: list[tuple[str, str]] = [
    ("My order 1042 has not arrived.", "Sorry to hear that. Let me look up order 1042."),
    ("It was due on Monday.", "The carrier shows it left the depot on Tuesday."),
    ("Can you send it again?", "I can open a replacement request once the carrier confirms."),
    ("How long will that take?", "Usually one business day."),
    ("Fine, please go ahead.", "Done: replacement request R-77 is open."),
    ("Will I get an email?", "Yes, a confirmation goes to the address on the order."),
]


async def summarize(messages: list[Message]) -> str:
    """A stand-in for an LLM summary call: keeps the first line of each user turn."""
    asks = [m.text.split(".")[0] for m in messages if m.role == "user"]
    return "Summary of earlier conversation: the customer said: " + "; ".join(asks) + "."


async def run() -> None:
    """The whole demo: a conversation's life, then a run that waits for approval."""
    try:
        from rich.console import Console
    except ImportError as exc:  # pragma: no cover - the demo is run with the dev extra
        raise MissingExtraError("the demo", "cli") from exc

    console = Console()
    store = await open_store(f"sqlite:///{DEMO_DB}")
    try:
        manager = SessionManager(store, "demo-user", agent_id="support-bot", max_messages=10)
        session = await start_session(manager, console)
        await converse(session, console)
        await show_session_features(manager, session, console)
        await print_sessions(manager, session, console)
    finally:
        await store.close()
    await run_demo_run(console)
    waiting = await leave_runs_to_explore(console)
    print_next_steps(console, waiting)


async def start_session(manager: SessionManager, console: Any) -> Session:
    """Say what earlier runs left on disk, then open this run's conversation."""
    earlier = [r async for r in manager.iter()]
    if earlier:
        console.print(
            f"[green]Found {len(earlier)} session(s) from earlier runs in {DEMO_DB}: "
            "the data survived the restart.[/]"
        )
    else:
        console.print(f"First run: creating {DEMO_DB}")
    # Only the conversations carry a run number (the approval run's session does not).
    numbers = [n for r in earlier if isinstance(n := r.metadata.get("run"), int)]
    run_no = max(numbers, default=0) + 1
    session = await manager.create(
        title=f"Order 1042 (demo run {run_no})",
        metadata={"run": run_no, "channel": "web"},
        messages=[
            Message.system("You are a courteous support agent for an online shop."),
            Message.context("Policy: replacements ship after the carrier confirms loss."),
        ],
    )
    console.print(f"Created session [bold]{session.id}[/]")
    return session


async def show_session_features(manager: SessionManager, session: Session, console: Any) -> None:
    """The boundary the conversation crossed, then compaction, a fork and a context window."""
    view = await session.view()
    carried = sum(1 for m in view.messages if m.category.name in ("SYSTEM", "CONTEXT"))
    console.print(
        f"Boundary: after {manager.max_messages} messages the conversation moved on to "
        f"[bold]{session.id}[/] (continuation {session.record.continuation_index}, "
        f"continued_from={session.record.continued_from}); it carried over "
        f"{carried} system/context messages and a transition marker."
    )

    result = await session.compact(summarize, keep_last=2)
    console.print(
        f"Compacted: {result.replaced} messages became one summary; view tokens "
        f"{result.tokens_before} -> {result.tokens_after} (freed {result.tokens_freed}). "
        "The originals are still stored."
    )

    branch = await session.branch()
    fork_at = branch[len(branch) // 2].seq
    fork = await session.fork(at=fork_at, title="What if the customer asked for a refund?")
    await fork.append(Message.user("Actually, I would rather have a refund."))
    await fork.append(Message.assistant("Understood: I have started refund F-12 instead."))
    console.print(
        f"Forked {session.id} at entry {fork_at} into [bold]{fork.id}[/] without copying "
        f"history; the fork sees {len(await fork.messages())} messages."
    )

    window = await session.context_window(budget=120)
    console.print(
        f"Context window under 120 tokens: {len(window.messages)} messages, "
        f"{window.tokens} tokens, {len(window.dropped)} dropped, {len(window.elided)} elided."
    )


async def print_sessions(manager: SessionManager, session: Session, console: Any) -> None:
    """Every session of the demo user, then the active view of this run's conversation."""
    from rich.table import Table

    table = Table(title=f"Sessions of demo-user in {DEMO_DB}")
    for column in ("id", "title", "msgs", "tokens", "compactions", "links"):
        table.add_column(column)
    async for record in manager.iter():
        links = []
        if record.continued_from:
            links.append(f"from {record.continued_from[-6:]}")
        if record.continued_to:
            links.append(f"to {record.continued_to[-6:]}")
        if record.forked_from:
            links.append(f"fork of {record.forked_from.session_id[-6:]}")
        table.add_row(
            record.id,
            record.title or "",
            str(record.message_count),
            str(record.total_tokens),
            str(record.compaction_count),
            ", ".join(links),
        )
    console.print(table)
    console.print("Active view of the continued session:")
    for message in await session.messages():
        console.print(f"  [cyan]{message.role:>9}[/] {message.text[:90]}")


async def converse(session: Session, console: Any) -> None:
    """Play the scripted conversation, with one tool call and its result."""
    for turn, (question, answer) in enumerate(SCRIPT):
        await session.append(Message.user(question))
        if turn == 0:
            call = ToolCallBlock(id="call_1", name="lookup_order", arguments='{"order": 1042}')
            await session.append(
                Message.assistant("Looking it up.", tool_calls=[call]),
                Message.tool_result("call_1", '{"status": "in transit", "eta": "Thursday"}'),
            )
        await session.append(Message.assistant(answer))


async def run_demo_run(console: Any) -> None:
    """A run that stops for approval, then finishes in a separate process."""
    from statekeeper.demo_app import make_runner
    from statekeeper.runs.inspect import RunInspector

    store = await open_store(f"sqlite:///{DEMO_DB}")
    try:
        runner = make_runner(store, "demo-user")
        first = await runner.start("support", "Order 1042 never arrived. Can I get my money back?")
        console.print(f"\nRun [bold]{first.run_id}[/] stopped: [yellow]{first.status}[/]")
        for pending in first.interruptions:
            console.print(f"  pending {pending.tool}({pending.arguments}): {pending.prompt}")
        await runner.approve(first.run_id, "c-refund", by="demo-operator", reason="lost parcel")
        console.print("Approved by demo-operator; resuming in a separate process ...")
    finally:
        await store.close()

    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "statekeeper.demo",
        "resume",
        first.run_id,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the resuming process failed:\n{err.decode()}")
    console.print(f"  [dim]child process: {out.decode().strip()}[/]")

    store = await open_store(f"sqlite:///{DEMO_DB}")
    try:
        runner = make_runner(store, "demo-user")
        inspector = RunInspector(runner.runs, first.run_id)
        state = await inspector.state()
        console.print(f"Run finished: [green]{state.status}[/], output {state.output}")
        console.print("Transcript:")
        for message in (await inspector.items()).messages:
            console.print(f"  [cyan]{message.role:>9}[/] {message.text[:90]}")
        timeline = " -> ".join([c.target for c in await inspector.timeline()])
        console.print(f"Status timeline: initializing -> {timeline}")
        console.print(f"Tool calls: {await inspector.tool_counts()}")
        usage = state.metrics.usage
        console.print(
            f"Cost: ${state.metrics.accumulated_cost:.6f} over {state.metrics.calls} model calls "
            f"({usage.input_tokens} in / {usage.output_tokens} out tokens)"
        )
    finally:
        await store.close()


async def resume_in_child(run_id: str) -> None:
    """The separate process of the demo: resume an approved run."""
    from statekeeper.demo_app import make_runner

    store = await open_store(f"sqlite:///{DEMO_DB}")
    try:
        result = await make_runner(store, "demo-user").resume(run_id)
        print(f"pid {os.getpid()} resumed {run_id}: {result.status}")
    finally:
        await store.close()


async def leave_runs_to_explore(console: Any) -> str:
    """Runs an operator finds waiting: a decision, a limit, a parent with children.

    Returns the id of the run that waits for a decision."""
    from statekeeper.core.limits import IterationFlag, Limits
    from statekeeper.demo_app import make_runner

    store = await open_store(f"sqlite:///{DEMO_DB}")
    try:
        runner = make_runner(store, "demo-user")
        waiting = await runner.start(
            "support", "My order 1042 is lost too. Can I have my money back?", headless=False
        )
        paused = await runner.start(
            "support",
            "Where is my order 1042?",
            headless=False,
            limits=Limits(iterations=IterationFlag(maximum=1)),
        )
        parent = await runner.start("triage", "Escalated: orders 1042, 1043.", headless=False)
    finally:
        await store.close()
    console.print("\nLeft for you to look at:")
    console.print(f"  {waiting.run_id}  waits for a decision on issue_refund")
    console.print(f"  {paused.run_id}  paused at its iteration limit (1 step)")
    console.print(f"  {parent.run_id}  {parent.status}, with 2 delegated child runs")
    return waiting.run_id


def print_next_steps(console: Any, waiting: str) -> None:
    """The commands that open the demo's data in the CLI and the control UI, as run."""
    # The CLI's default store is .statekeeper/state.db; the demo keeps its own database.
    found = Path(sys.executable).with_name("statekeeper")
    program = "statekeeper"
    if found.exists():
        program = os.path.relpath(found) if found.is_relative_to(Path.cwd()) else str(found)
    base = f"{shlex.quote(program)} --store {shlex.quote(f'sqlite:///{DEMO_DB}')}"
    commands = [
        f"{base} --tenant demo-user sessions list",
        f"{base} --tenant demo-user runs list",
        f"{base} --tenant demo-user runs show {waiting}",
        f"{base} keys create --tenant demo-user --scope operate --label demo",
        f"{base} serve --app statekeeper.demo_app:make_runner",
    ]
    console.print("\nExplore it (the last two open the control UI on this data):")
    for command in commands:
        console.print(f"  $ {command}", soft_wrap=True, markup=False, highlight=False)
    console.print(
        "  then open http://127.0.0.1:8321/ui/ and paste the key that `keys create` printed.",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )


def main() -> None:
    """Entry point of ``python -m statekeeper.demo``."""
    if len(sys.argv) == 3 and sys.argv[1] == "resume":
        asyncio.run(resume_in_child(sys.argv[2]))
        return
    asyncio.run(run())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
