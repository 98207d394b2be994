"""One `StatekeeperSession` from many threads, each with its own event loop, in the
shapes the OpenAI Agents SDK's own tests and users make (run by ``oai_threads.py`` in
another process: a call that hangs fails the test, it never hangs the suite).

``owned``: the session opened its store (``from_url``); ``caller``: the caller opened the
store on its loop, which then blocks in the thread pool, as the SDK's test blocks its
test's loop."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from test_from_url import run_script
from test_oai_parity import store_with_url

MODES = ["owned", "caller"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres", "redis"])
async def test_the_sdks_concurrent_access_test_stores_all_ten_items(
    backend: str, mode: str, tmp_path: Path
) -> None:
    # Five threads, each making a new event loop for one add_items of one item.
    async with store_with_url(backend, tmp_path) as (_, url):
        out = await run_script("oai_threads.py", url, "concurrent", mode)
    contents = [item["content"] for item in out["items"]]
    assert sorted(contents) == sorted(f"Message {n}" for n in range(10)), contents


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
async def test_runner_run_sync_from_a_thread_pool(backend: str, mode: str, tmp_path: Path) -> None:
    # Eight Runner.run_sync calls on four threads at once, each on its thread's own loop.
    async with store_with_url(backend, tmp_path) as (_, url):
        out = await run_script("oai_threads.py", url, "run_sync", mode)
    assert out["results"] == [f"Answer {n}" for n in range(8)]
    said = Counter(
        item["content"] if item.get("role") == "user" else item["content"][0]["text"]
        for item in out["items"]
    )
    expected = [f"Question {n}" for n in range(8)] + [f"Answer {n}" for n in range(8)]
    assert said == Counter(expected)  # every run's input and output, each once
