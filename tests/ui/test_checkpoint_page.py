"""A checkpoint's page in a real browser: the run's state at that step, then "edit and
rerun" with the keyboard: bad JSON is refused in the page, good edits fork a new run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.async_api import expect

from statekeeper.demo_app import make_runner
from statekeeper.stores import open_store

from .conftest import UIServer
from .test_browser import WAIT, shot, signed_in_page


async def test_a_checkpoint_is_shown_then_edited_and_forked_from_the_keyboard(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    async with await open_store(ui_server.store_url) as store:
        runner = make_runner(store, ui_server.tenant)
        started = await runner.start("support", "Refund order 1042.", headless=False)
        steps = [c.step for c in await runner.runs.history(started.run_id)]
    last = steps[-1]
    page = await signed_in_page(browser, ui_server, f"#/runs/{started.run_id}")
    # The run page's checkpoints link to each one's page.
    await page.get_by_role("link", name=f"State at step {last}: view, edit and rerun").click()
    await expect(page).to_have_url(re.compile(f"#/runs/{started.run_id}/checkpoints/{last}$"))
    heading = page.get_by_role("heading", level=1)
    await expect(heading).to_contain_text(f"Step {last}", timeout=WAIT)
    await expect(heading.locator(".badge")).to_have_text("waiting for approval")
    await expect(page.locator("#cp-pending-title + ul")).to_contain_text("issue_refund")
    await shot(page, shots, "checkpoint", full=True)

    fields = page.get_by_label("State fields (JSON)")
    await fields.focus()
    await page.keyboard.press("Control+A")
    await page.keyboard.type('{"metadata": {"note": "second try"')  # not closed: bad JSON
    await page.keyboard.press("Tab")
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    await expect(page.locator("#cp-status")).to_contain_text("must be a JSON object")
    async with await open_store(ui_server.store_url) as store:
        assert len(await make_runner(store, ui_server.tenant).runs.list()) == 1  # nothing made

    await fields.focus()
    await page.keyboard.press("Control+A")
    await page.keyboard.type('{"metadata": {"note": "second try"}}')
    await page.keyboard.press("Tab")
    await page.keyboard.type("Please check the amount first.")
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    await expect(page).not_to_have_url(re.compile(f"{started.run_id}/checkpoints"), timeout=WAIT)
    await expect(page.locator(".page-head")).to_contain_text(
        re.compile(rf"forked from run_\S+ at step {last}")
    )
    fork_id = page.url.rsplit("/", 1)[-1]
    async with await open_store(ui_server.store_url) as store:
        fork = await make_runner(store, ui_server.tenant).load(fork_id)
    assert fork.metadata["note"] == "second try"
    assert fork.metadata["forked_from"] == {"run_id": started.run_id, "step": last}
