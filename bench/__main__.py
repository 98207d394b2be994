"""Run every benchmark and report ratios against baselines measured in the same run.

python -m bench              # all of them
python -m bench sessions redis ...  # the named ones (see SUITES below)
python -m bench load --sessions 200 --seconds 15  # options after the name go to that suite
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import sys

SUITES = {
    "sessions": "sessions on SQLite vs raw sqlite3",
    "runs": "run checkpoints and resume on SQLite",
    "runs_pg": "a runner step calling a tool on PostgreSQL vs a DBOS durable step",
    "lanes": "command lanes vs a bare asyncio.Queue worker",
    "events": "event bus vs asyncio.Queue fan-out and raw sqlite3",
    "postgres": "PostgreSQL store vs raw psycopg",
    "redis": "Redis store vs raw redis-py",
    "files": "plain-file store vs raw file appends",
    "tracing": "a runner step with tracing off, the OpenTelemetry API alone, the SDK",
    "longterm": "long-term store (LangGraph BaseStore) on SQLite vs LangGraph's AsyncSqliteStore",
    "openai_agents": "OpenAI Agents SDK session vs the SDK's SQLiteSession",
    "adk": "Google ADK session service vs ADK's own SQLite services",
    "server": "the HTTP server vs the library calls, and SSE fan-out latency",
    "langgraph": "LangGraph checkpointer vs SqliteSaver (MessagesState)",
    "sealed": "encryption at rest: a sealed SQLite store vs the same store plain",
    "floor": "the SQL floor of an append: raw insert, our statements alone, Session.append",
    "instructions": "instructions per append (callgrind): Session.append vs raw sqlite3",
    "threads": "one store from 8 threads with their own loops vs 8 tasks on one loop",
    "load": "many agent sessions through 2 server processes vs the library and raw psycopg",
}
TAKE_OPTIONS = {"load"}  # suites with a `configure(argv)`: `python -m bench load --sessions 200`


def main(argv: list[str]) -> int:
    """Run the chosen suites, report, and exit non-zero if a target was missed."""
    names = list(itertools.takewhile(lambda arg: not arg.startswith("-"), argv))
    chosen, options = names or list(SUITES), argv[len(names) :]
    if options and not (len(names) == 1 and names[0] in TAKE_OPTIONS):
        print(f"options {' '.join(options)!r} go after one suite that takes them (load)")
        return 2
    failed: list[str] = []
    for name in chosen:
        if name not in SUITES:
            print(f"unknown benchmark {name!r}; choose from {', '.join(SUITES)}")
            return 2
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError:
            print(f"\n== {SUITES[name]} ==\n(not available in this checkout)")
            continue
        if options:  # only a suite with a `configure(argv)` takes options
            module.configure(options)
        print(f"\n== {SUITES[name]} ==")
        failed += [f"{name}: {m}" for m in module.report(asyncio.run(module.run()))]
    if failed:
        print(f"\n{len(failed)} target(s) missed:\n  " + "\n  ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
