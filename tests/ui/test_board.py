"""The runs board in a real browser: delegated runs under their parent, filters and a
search, ids shown whole, and one column at 700 px with nothing cut off."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.async_api import expect

from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.demo_app import make_runner
from statekeeper.stores import open_store

from .conftest import UIServer
from .test_browser import WAIT, shot, signed_in_page

NARROW = {"width": 700, "height": 900}


async def test_children_sit_under_their_parent_and_filters_narrow_the_board(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    async with await open_store(ui_server.store_url) as store:
        runner = make_runner(store, ui_server.tenant)
        waiting = await runner.start("support", "Refund order 1042.", headless=False)
        triage = await runner.start("triage", "Escalated: orders 1042, 1043.", headless=False)
        paused = await runner.start(
            "support",
            "Where is order 7?",
            headless=False,
            limits=Limits(iterations=IterationFlag(maximum=1)),
        )
        children = [r for r in await runner.runs.list() if r.parent_run_id == triage.run_id]
    assert triage.status == "completed"
    assert len(children) == 2

    page = await signed_in_page(browser, ui_server)
    rows = page.locator("tbody tr")
    await expect(rows).to_have_count(5, timeout=WAIT)
    order = await rows.evaluate_all("rs => rs.map(r => [r.dataset.run, r.dataset.depth])")
    # The decision first; each child right under its parent, one level deeper.
    assert order[0] == [waiting.run_id, "0"]
    at = [run for run, _ in order].index(triage.run_id)
    assert sorted(run for run, _ in order[at + 1 : at + 3]) == sorted(c.run_id for c in children)
    assert [depth for _, depth in order[at + 1 : at + 3]] == ["1", "1"]
    # Ids are shown whole, so they copy whole.
    link = page.locator(f'tr[data-run="{paused.run_id}"]').get_by_role("link").first
    await expect(link).to_have_text(paused.run_id)
    # Why a run stopped is said on the board and on its page.
    why = "iterations limit reached: 1 of 1; raise it to go on"
    await expect(page.locator(f'tr[data-run="{paused.run_id}"] .why')).to_have_text(why)
    await shot(page, shots, "board-tree")
    await page.goto(f"{ui_server.base}/ui/#/runs/{paused.run_id}")
    await expect(page.locator("#why-stopped")).to_have_text(f"Why it stopped: {why}")
    await page.goto(f"{ui_server.base}/ui/#/")

    await page.get_by_label("Agent").select_option("carrier")
    await expect(rows).to_have_count(2)
    await expect(page.locator("#board-counts")).to_contain_text("2 of 5 run(s)")
    await page.get_by_label("Agent").select_option("")
    await page.get_by_label("Status").select_option("paused")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-run", paused.run_id)
    await page.get_by_label("Status").select_option("")
    await page.get_by_label("Search").fill(triage.run_id[-10:])
    await expect(rows).to_have_count(3)  # the parent, and its children (their parent id)
    await page.get_by_label("Search").fill("no such run")
    await expect(page.locator("td.empty")).to_have_text("No run matches.")


async def test_at_700_px_the_board_folds_to_one_column_and_cuts_nothing(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    async with await open_store(ui_server.store_url) as store:
        waiting = await make_runner(store, ui_server.tenant).start(
            "support", "Refund order 1042.", headless=False
        )
    page = await signed_in_page(browser, ui_server)
    await page.set_viewport_size(NARROW)
    row = page.locator(f'tr[data-run="{waiting.run_id}"]')
    review = row.get_by_role("link", name=re.compile("pending approval"))
    await expect(review).to_be_visible(timeout=WAIT)
    # Nothing sticks out sideways, and every field of a run is stacked in one column.
    assert await page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
    lefts = await row.locator("td").evaluate_all(
        "tds => tds.map(td => Math.round(td.getBoundingClientRect().left))"
    )
    assert len(set(lefts)) == 1, lefts
    await expect(row.get_by_role("link").first).to_have_text(waiting.run_id)
    box = await row.get_by_role("link").first.bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= NARROW["width"]
    await shot(page, shots, "board-700")
