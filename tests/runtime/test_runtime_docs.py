"""The snippets of docs/runtime.md that need the Redis and PostgreSQL servers run as
written (tests/test_docs_examples.py runs the others): the server names they use are made
unique here, so parallel runs do not meet, and cleaned up after."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import uuid
from pathlib import Path

import pytest
from services import POSTGRES_URL, REDIS_URL, drop_postgres_schema, drop_redis_prefix, require

ROOT = Path(__file__).resolve().parents[2]
SERVER_BLOCK = re.compile(
    r"<!-- not-run: needs the Redis and PostgreSQL[^>]*-->\n```python\n(.*?)```", re.S
)
SNIPPETS = SERVER_BLOCK.findall((ROOT / "docs/runtime.md").read_text())


def test_the_page_has_its_server_snippets() -> None:
    assert len(SNIPPETS) == 2


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet-{i}" for i in range(len(SNIPPETS))])
async def test_a_snippet_runs(code: str) -> None:
    unique = uuid.uuid4().hex[:10]
    names = {  # what the snippets write on the shared servers
        "docs-locks": f"docs-locks-{unique}",
        "docs-feed": f"docs-feed-{unique}",
        "docs_feed": f"docs_feed_{unique}",
        "docs_events": f"docs_events_{unique}",
    }
    await require(REDIS_URL)
    await require(POSTGRES_URL)
    # PostgreSQL advisory locks are server-wide: another run's session would be ours.
    for name, mine in {**names, '"session-1"': f'"session-{unique}"'}.items():
        code = code.replace(name, mine)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-W",
            "error",
            "-c",
            code,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
    finally:
        for prefix in (names["docs-locks"], names["docs-feed"]):
            await drop_redis_prefix(prefix)
        await drop_postgres_schema(names["docs_feed"])
