"""Instructions per append, counted by valgrind's callgrind: a figure the machine's load
does not move.

Both sides run in a fresh interpreter under ``valgrind --tool=callgrind``, each twice: with
``SMALL`` and with ``LARGE`` appends after the same warm-up, so that start-up, imports and
the warm-up cancel out of the difference; instructions per append are
``(I(LARGE) - I(SMALL)) / (LARGE - SMALL)``.

- **ours**: `Session.append` of the realistic mix (`bench.sessions.message_dict`, each
  built into a `Message` as a user would) on ``sqlite:///`` with ``durability=process``
  and the default page size;
- **raw**: the baseline of `bench.sessions` (``json.dumps`` of the same dicts, one
  ``INSERT`` per transaction into a plain rowid table, WAL, ``synchronous=NORMAL``).

Target (issue 21): ours / raw <= 2.0. Skipped, with the reason, where valgrind is missing.

    python -m bench instructions
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Verdicts

SMALL, LARGE = 100, 400
WARMUP = 200
TARGET = 2.0


async def _ours(folder: Path, count: int) -> None:
    from bench.sessions import as_message, message_dict
    from statekeeper.sessions import SessionManager
    from statekeeper.stores import open_store

    dicts = [message_dict(n) for n in range(WARMUP + count)]
    async with open_store(f"sqlite:///{folder / 'ours.db'}", durability="process") as store:
        session = await SessionManager(store, "bench", max_messages=None).create()
        for data in dicts:
            await session.append(as_message(data))


def _raw(folder: Path, count: int) -> None:
    from bench.sessions import Raw, message_dict

    raw = Raw(folder / "raw.db", "NORMAL")
    for n in range(WARMUP + count):
        raw.append(message_dict(n))
    raw.db.close()


def child(side: str, count: int) -> None:
    """What runs under valgrind: ``count`` appends after the warm-up, on one side."""
    with tempfile.TemporaryDirectory(prefix="statekeeper-instructions-") as folder:
        if side == "ours":
            asyncio.run(_ours(Path(folder), count))
        else:
            _raw(Path(folder), count)


def instructions(side: str, count: int) -> int:
    """Instructions callgrind counts for one run of `child`."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={Path(out) / 'callgrind.out'}",
                sys.executable,
                "-m",
                "bench.instructions",
                side,
                str(count),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


async def run() -> dict[str, float] | None:
    """Instructions per append on each side (None without valgrind)."""
    if shutil.which("valgrind") is None:
        return None
    per_append = {}
    for side in ("ours", "raw"):
        small, large = instructions(side, SMALL), instructions(side, LARGE)
        per_append[side] = (large - small) / (LARGE - SMALL)
    return per_append


def report(results: dict[str, float] | None) -> list[str]:
    """Print the counts and the verdict; return the missed target."""
    if results is None:
        print("skipped: valgrind is not installed (apt-get install valgrind)")
        return []
    print(f"ours {results['ours']:,.0f}, raw {results['raw']:,.0f} instructions per append")
    verdicts = Verdicts()
    verdicts.at_most("process append / raw, instructions", results["ours"] / results["raw"], TARGET)
    return [f"instructions {name}" for name in verdicts.missed]


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]))
