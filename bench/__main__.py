"""Run every benchmark and report ratios against baselines measured in the same run."""

from __future__ import annotations

import asyncio
import sys

from bench import runs, sessions


def main() -> int:
    """Run, report, and exit non-zero if a target was missed."""
    print("== sessions on SQLite vs raw sqlite3 ==")
    failed = sessions.report(asyncio.run(sessions.run()))
    print("\n== run checkpoints and resume on SQLite ==")
    failed += runs.report(asyncio.run(runs.run()))
    if failed:
        print(f"\n{len(failed)} target(s) missed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
