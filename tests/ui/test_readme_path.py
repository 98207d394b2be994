"""The README's way into the control UI, as a new user runs it: `make demo` (the demo),
then the shell block of "A run that needs a human" in order, in a fresh directory, and a
browser that ends on the run waiting for a decision (the screenshot `readme-approval`)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from playwright.async_api import async_playwright, expect

import statekeeper

from .conftest import CHROMIUM_ARGS, ROOT, VIEWPORT, _free_port, _wait_ready, chromium_path
from .test_browser import WAIT, shot


def readme_commands() -> list[str]:
    """The README's shell block that starts with ``SK=...``, as written."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    block = next(b for b in blocks if b.startswith("SK="))
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def expand(line: str, sk: list[str], run_id: str) -> list[str]:
    """One README line as argv: ``$SK`` is what the block's first line set, RUN the run."""
    words = shlex.split(line.replace("RUN", run_id))
    return [*sk, *words[1:]] if words[0] == "$SK" else words


async def test_the_readme_path_ends_on_a_decision_in_the_browser(
    tmp_path: Path, shots: Path | None
) -> None:
    chromium = chromium_path()
    source = str(Path(statekeeper.__file__).parents[1])
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": source}
    env.pop("STATEKEEPER_DEMO_DB", None)
    demo = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "statekeeper.demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert demo.returncode == 0, demo.stderr
    waiting = re.search(r"(run_\w+)\s+waits for a decision", demo.stdout)
    assert waiting, demo.stdout
    run_id = waiting.group(1)

    commands = readme_commands()
    first = shlex.split(commands[0].removeprefix("SK="))
    assert len(first) == 1
    sk = shlex.split(first[0])
    assert sk[0] == ".venv/bin/statekeeper"  # this checkout's program stands in for it
    sk = [sys.executable, "-m", "statekeeper.cli", *sk[1:]]

    def shell(argv: list[str]) -> str:
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (argv, done.stderr)
        return done.stdout

    listed = await asyncio.to_thread(shell, expand(commands[1], sk, run_id))
    assert run_id in listed
    shown = await asyncio.to_thread(shell, expand(commands[2], sk, run_id))
    assert "waiting_for_approval" in shown
    printed = await asyncio.to_thread(shell, expand(commands[3], sk, run_id))
    key = re.search(r"sk_[A-Za-z0-9_\-]+", printed)
    assert key, "keys create printed no key"
    serve = expand(commands[4], sk, run_id)
    assert serve[-3:] == ["serve", "--app", "statekeeper.demo_app:make_runner"]
    port = _free_port()  # the README's default port may be taken on a shared machine
    proc = await asyncio.create_subprocess_exec(
        *serve,
        "--port",
        str(port),
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        await _wait_ready(proc, base, key.group(0))
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page: Any = await browser.new_page(viewport=VIEWPORT)
                await page.goto(f"{base}/ui/")
                await page.get_by_label("API key").fill(key.group(0))
                await page.get_by_role("button", name="Sign in").click()
                row = page.locator(f'tr[data-run="{run_id}"]')
                await row.get_by_role("link", name=re.compile("to review")).click()
                call = page.locator('article[data-call="c-refund"]')
                await expect(call).to_contain_text("Refund 42.50 for order 1042?", timeout=WAIT)
                await expect(
                    page.get_by_role("button", name="Approve issue_refund (c-refund)")
                ).to_be_enabled()
                await shot(page, shots, "readme-approval")
            finally:
                await browser.close()
    finally:
        proc.terminate()
        await proc.wait()
