"""Start and steer in a real browser, by keyboard: a run started from the board's New run
form, steered and queued from its page; a run page offers only what the API accepts
(no Raise or Cancel on a finished run, Resume disabled saying why while a call waits);
a finished checkpoint forked with new input; at 1366 and at 700 px."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect

from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.stores import open_store

from .conftest import UIServer, serving
from .test_browser import WAIT, shot, signed_in_page

APP = "server.steer_app:make_runner"  # the demo's agents and `listener` (tests/server)
NARROW = {"width": 700, "height": 900}


@pytest.fixture
async def ui_server(tmp_path: Path) -> AsyncIterator[UIServer]:
    """``statekeeper serve --app steer_app`` on a fresh SQLite file, with an operate key."""
    async with serving(tmp_path, APP) as server:
        yield server


async def press(page: Any, key: str, times: int = 1) -> None:
    for _ in range(times):
        await page.keyboard.press(key)


async def test_start_from_the_board_then_steer_and_queue_by_keyboard(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    page = await signed_in_page(browser, ui_server)
    opener = page.get_by_role("button", name="New run")
    await expect(opener).to_be_visible(timeout=WAIT)
    await opener.focus()
    await press(page, "Enter")
    agent = page.get_by_label("Agent to run")
    await expect(agent).to_be_focused()
    await agent.select_option("listener")
    await press(page, "Tab", 2)  # title, most steps
    await expect(page.get_by_label("Most steps")).to_be_focused()
    await page.keyboard.type("50")
    await press(page, "Tab", 2)  # budget, input
    await expect(page.locator("#new-input")).to_be_focused()
    await page.keyboard.type("hello")
    await shot(page, shots, "board-new-run")
    await press(page, "Tab")
    await expect(page.get_by_role("button", name="Start")).to_be_focused()
    await press(page, "Enter")

    await expect(page.get_by_role("heading", name=re.compile("Run of listener"))).to_be_visible(
        timeout=WAIT
    )
    timeline = page.locator(".timeline")
    await expect(timeline.get_by_text("heard: hello")).to_be_visible(timeout=WAIT)
    run_id = page.url.rsplit("/", 1)[-1]
    await expect(
        page.locator(".card", has_text="Limits").locator("tbody tr").first
    ).to_contain_text(re.compile("iterations.*50"))
    # Running: Resume is offered disabled, saying why; the box steers or queues.
    resume = page.locator("#resume-run")
    await expect(resume).to_have_attribute("aria-disabled", "true")
    await expect(resume).to_have_attribute("title", "The run is running.")
    # Limits are not raised while a process drives the run (nor an unlimited one).
    await expect(page.get_by_role("button", name=re.compile("^Raise"))).to_have_count(0)
    await expect(page.locator("#raise-later")).to_be_visible()
    box = page.get_by_label("Message to the run")
    await box.focus()
    await page.keyboard.type("go left")
    await press(page, "Tab")
    await expect(page.get_by_role("button", name="Steer")).to_be_focused()
    await press(page, "Enter")
    await expect(page.locator(".notice")).to_have_text(re.compile("^Steered"), timeout=WAIT)
    await expect(timeline.get_by_text("heard: go left")).to_be_visible(timeout=WAIT)
    await expect(box).to_have_value("")

    await box.focus()
    await page.keyboard.type("later")
    await press(page, "Tab", 2)
    await expect(page.get_by_role("button", name="Queue")).to_be_focused()
    await press(page, "Enter")
    await expect(page.locator(".notice")).to_have_text(re.compile("^Queued"), timeout=WAIT)
    await shot(page, shots, "run-steer")

    await box.focus()
    await page.keyboard.type("stop")
    await press(page, "Tab")
    await press(page, "Enter")
    badge = page.locator(".page-head h1 .badge")
    await expect(badge).to_have_text("completed", timeout=WAIT)
    # Finished: nothing to resume, cancel or raise; a follow-up goes on in a new run.
    await expect(page.locator("#resume-run")).to_have_count(0)
    await expect(page.locator("#cancel-run")).to_have_count(0)
    await expect(page.get_by_role("button", name=re.compile("^Raise"))).to_have_count(0)
    await expect(page.get_by_role("columnheader", name="Raise to")).to_have_count(0)
    await expect(page.get_by_role("button", name="Continue in a new run")).to_be_visible()

    # The queued message went on once the run ended: a fork of it, on the board.
    await page.goto(f"{ui_server.base}/ui/#/")
    rows = page.locator("tbody tr[data-run]")
    await expect(rows).to_have_count(2, timeout=WAIT)
    fork = [r for r in await rows.evaluate_all("rs => rs.map(r => r.dataset.run)") if r != run_id]
    await page.goto(f"{ui_server.base}/ui/#/runs/{fork[0]}")
    await expect(page.locator(".forked-from")).to_be_visible(timeout=WAIT)
    await expect(page.locator(".timeline").get_by_text("heard: later")).to_be_visible(timeout=WAIT)
    await page.locator("#cancel-run").click()
    await expect(badge).to_have_text("cancelled", timeout=WAIT)


async def _waiting_and_finished(server: UIServer) -> tuple[str, str]:
    from server.steer_app import make_runner

    async with await open_store(server.store_url) as store:
        runner = make_runner(store, server.tenant)
        limits = Limits(iterations=IterationFlag(maximum=10))
        waiting = await runner.start("support", "Refund order 1042.", headless=False, limits=limits)
        done = await runner.start("listener", "stop", headless=False)
    assert waiting.status == "waiting_for_approval"
    assert done.status == "completed"
    return waiting.run_id, done.run_id


async def test_only_what_works_is_offered_and_a_checkpoint_forks_with_input(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    waiting, done = await _waiting_and_finished(ui_server)
    page = await signed_in_page(browser, ui_server, f"#/runs/{waiting}")
    await expect(page.locator("article[data-call]")).to_be_visible(timeout=WAIT)
    resume = page.locator("#resume-run")
    await expect(resume).to_have_attribute("aria-disabled", "true")
    await expect(resume).to_have_attribute("title", re.compile("waits for a decision"))
    await resume.focus()  # reachable by keyboard, and Enter does nothing
    await press(page, "Enter")
    await expect(page.locator(".page-head h1 .badge")).to_have_text("waiting for approval")
    await expect(page.get_by_label("Message to the run")).to_be_disabled()
    await expect(page.locator("#followup-hint")).to_have_text(re.compile("approve or reject"))
    await expect(page.get_by_role("button", name="Raise iterations")).to_be_visible()
    await expect(page.get_by_role("button", name=re.compile("^Raise"))).to_have_count(1)
    await shot(page, shots, "run-waiting-offers")

    await page.goto(f"{ui_server.base}/ui/#/runs/{done}")
    opener = page.get_by_role("button", name="With input: fork from step 2 with new input")
    await expect(opener).to_be_visible(timeout=WAIT)
    await opener.focus()
    await press(page, "Enter")
    field = page.get_by_label("New input for a fork from step 2")
    await expect(field).to_be_focused()
    await page.keyboard.type("ask")
    await shot(page, shots, "run-fork-with-input")
    await press(page, "Enter")
    await expect(page.locator(".forked-from")).to_have_text(re.compile(done[:6]), timeout=WAIT)
    assert done not in page.url
    await expect(page.locator(".page-head h1 .badge")).to_have_text(
        "waiting for input", timeout=WAIT
    )
    await expect(page.locator(".timeline").get_by_text("What next?")).to_be_visible()
    # Waiting for input: Resume says to send input; the box sends and resumes.
    await expect(page.locator("#resume-run")).to_have_attribute(
        "title", re.compile("waits for input")
    )
    await expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible()


async def test_new_run_and_follow_up_fit_in_700_px(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    _, done = await _waiting_and_finished(ui_server)
    page = await signed_in_page(browser, ui_server)
    await page.set_viewport_size(NARROW)
    await page.get_by_role("button", name="New run").click()
    await expect(page.locator("#new-input")).to_be_visible(timeout=WAIT)
    assert await page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
    for name in ("#new-agent", "#new-input", "#new-title"):
        box = await page.locator(name).bounding_box()
        assert box is not None
        assert box["x"] + box["width"] <= NARROW["width"], name
    await shot(page, shots, "board-new-run-700")
    await page.goto(f"{ui_server.base}/ui/#/runs/{done}")
    await expect(page.get_by_role("button", name="Continue in a new run")).to_be_visible(
        timeout=WAIT
    )
    await page.get_by_role("button", name="With input: fork from step 2 with new input").click()
    assert await page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
    box = await page.get_by_label("Message to the run").bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= NARROW["width"]
    await shot(page, shots, "run-followup-700", full=True)


async def test_a_run_another_process_drives_is_not_offered_a_follow_up(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    from server.steer_app import make_runner

    async with await open_store(ui_server.store_url) as store:
        elsewhere = make_runner(store, ui_server.tenant)
        work = asyncio.create_task(elsewhere.start("listener", "hello", headless=False))
        try:
            page = await signed_in_page(browser, ui_server)
            row = page.locator("tbody tr[data-run]")
            await expect(row).to_have_count(1, timeout=WAIT)
            await row.get_by_role("link").first.click()
            box = page.get_by_label("Message to the run")
            await expect(box).to_be_disabled(timeout=WAIT)
            await expect(page.locator("#followup-hint")).to_have_text(
                re.compile(f"Another process \\({re.escape(elsewhere.owner)}\\) drives this run")
            )
            await expect(page.get_by_role("button", name="Steer")).to_have_count(0)
            await shot(page, shots, "run-other-process")
            await page.locator("#cancel-run").focus()  # cancelling works from anywhere
            await press(page, "Enter")
            badge = page.locator(".page-head h1 .badge")
            await expect(badge).to_have_text("cancelled", timeout=WAIT)
        finally:
            await work


async def test_a_checkpoint_at_a_limit_is_not_forked_to_run(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    from server.steer_app import make_runner

    async with await open_store(ui_server.store_url) as store:
        runner = make_runner(store, ui_server.tenant)
        limits = Limits(iterations=IterationFlag(maximum=1))
        paused = await runner.start("listener", "ask", headless=False, limits=limits)
        steps = await runner.runs.history(paused.run_id)
    assert paused.status == "waiting_for_input"
    last = steps[-1].step
    page = await signed_in_page(browser, ui_server, f"#/runs/{paused.run_id}")
    opener = page.get_by_role("button", name=f"With input: fork from step {last} with new input")
    await opener.focus(timeout=WAIT)
    await press(page, "Enter")
    await page.keyboard.type("more")
    await press(page, "Enter")
    alert = page.get_by_role("alert")
    await expect(alert).to_contain_text(f"step {last} is at its iterations limit (1 of 1)")
    assert paused.run_id in page.url
    async with await open_store(ui_server.store_url) as store:
        assert len(await make_runner(store, ui_server.tenant).runs.list()) == 1  # no fork
    await shot(page, shots, "run-fork-at-limit")
