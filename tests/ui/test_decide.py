"""Deciding a pending tool call on the run page like an agent inbox, with the keyboard
only (Tab, Enter, Space, typing), at 1366 and at 700 px: approve with edited arguments
(checked in the page before sending), reject with a message to the model, "always for
this tool". The decision shows in the timeline and the decisions list, and what ran is
what the operator approved.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect

from statekeeper.demo_app import make_runner
from statekeeper.runs.inspect import RunInspector
from statekeeper.stores import open_store

from .conftest import VIEWPORT, UIServer
from .test_browser import WAIT, shot

SIZES = [VIEWPORT, {"width": 700, "height": 900}]
CARD = 'article[data-call="c-refund"]'


async def waiting_run(server: UIServer) -> str:
    """A demo run stopped on its refund call (c-refund: order 1042, amount 42.5)."""
    async with await open_store(server.store_url) as store:
        started = await make_runner(store, server.tenant).start(
            "support", "Order 1042 never arrived.", headless=False
        )
        assert started.status == "waiting_for_approval"
        return started.run_id


async def focused(page: Any) -> str:
    """What has the keyboard focus: its aria-label, else its id, else its text."""
    return str(
        await page.evaluate(
            "() => { const a = document.activeElement;"
            " return a.getAttribute('aria-label') || a.id || a.textContent || a.tagName; }"
        )
    )


async def tab_to(page: Any, name: str | re.Pattern[str], *, most: int = 80) -> None:
    """Press Tab until the focus is on ``name`` (as `focused` says it)."""
    seen = []
    for _ in range(most):
        await page.keyboard.press("Tab")
        now = await focused(page)
        seen.append(now)
        if name.search(now) if isinstance(name, re.Pattern) else now == name:
            return
    raise AssertionError(f"Tab never reached {name!r}; it went through {seen}")


async def keyboard_page(browser: Any, server: UIServer, size: dict[str, int], run_id: str) -> Any:
    """The run's page, signed in with the keyboard: Tab to the key field, type, Enter."""
    page = await browser.new_page(viewport=size)
    await page.goto(f"{server.base}/ui/#/runs/{run_id}")
    await expect(page.get_by_label("API key")).to_be_visible(timeout=WAIT)
    await tab_to(page, "api-key")
    await page.keyboard.type(server.key)
    await page.keyboard.press("Enter")
    await expect(page.locator(CARD)).to_be_visible(timeout=WAIT)
    return page


async def select_all_and_type(page: Any, text: str) -> None:
    await page.keyboard.press("Control+A")
    await page.keyboard.press("Delete")
    await page.keyboard.type(text)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}px")
async def test_approve_with_edited_arguments_with_the_keyboard(
    browser: Any, ui_server: UIServer, shots: Path | None, size: dict[str, int]
) -> None:
    run_id = await waiting_run(ui_server)
    page = await keyboard_page(browser, ui_server, size, run_id)
    card = page.locator(CARD)
    editor = page.get_by_label("Edited arguments (a JSON object)")
    await expect(editor).to_be_hidden()
    await expect(card.get_by_label(re.compile("to the model, if rejected"))).to_be_visible()

    # Edit arguments: the arguments become an editable JSON box, with the focus in it.
    await tab_to(page, "Edit arguments of issue_refund (c-refund)")
    await page.keyboard.press("Enter")
    await expect(editor).to_be_focused()
    await expect(editor).to_have_value(re.compile(r'"amount": 42\.5'))
    await expect(card.locator("pre.args")).to_be_hidden()
    approve = card.get_by_role("button", name="Approve with edits: issue_refund (c-refund)")
    await expect(approve).to_have_text("Approve with edits")

    # Not JSON: the page says so and sends nothing; the focus goes back to the box.
    await select_all_and_type(page, '{"order": 1042, "amount": }')
    await tab_to(page, "Approve with edits: issue_refund (c-refund)")
    await page.keyboard.press("Enter")
    await expect(card.locator(".field-error")).to_contain_text("not valid JSON")
    await expect(editor).to_be_focused()
    await expect(editor).to_have_attribute("aria-invalid", "true")
    await shot(page, shots, f"decide-invalid-{size['width']}")
    # A list is JSON but not an object.
    await select_all_and_type(page, "[20]")
    await expect(card.locator(".field-error")).to_be_empty()  # typing clears the message
    await tab_to(page, "Approve with edits: issue_refund (c-refund)")
    await page.keyboard.press("Enter")
    await expect(card.locator(".field-error")).to_contain_text("must be a JSON object")
    async with await open_store(ui_server.store_url) as store:
        runner = make_runner(store, ui_server.tenant)
        assert (await runner.load(run_id)).decisions == []  # nothing was sent

    await expect(editor).to_be_focused()
    await select_all_and_type(page, '{"order": 1042, "amount": 20}')
    await tab_to(page, "call-c-refund-reason")
    await page.keyboard.type("partial refund: the parcel came back")
    await shot(page, shots, f"decide-edit-{size['width']}")
    await tab_to(page, "Approve with edits: issue_refund (c-refund)")
    await page.keyboard.press("Enter")

    # The server resumes the run: the edit is in the timeline and the decisions list.
    heading = page.get_by_role("heading", level=1)
    await expect(heading.locator(".badge")).to_have_text("completed", timeout=WAIT)
    approval = page.locator(".timeline li", has_text="approval/approved")
    await expect(approval).to_contain_text('ran with edited arguments {"order":1042,"amount":20}')
    decisions = page.locator("#decisions-title + ul")
    await expect(decisions).to_contain_text(re.compile(r"approved.*issue_refund.*by "))
    await expect(decisions).to_contain_text('ran with edited arguments {"order":1042,"amount":20}')
    await expect(decisions).to_contain_text("reason: partial refund")
    # The tool's result in the conversation says what ran.
    await expect(page.locator(".timeline")).to_contain_text(
        "edited the arguments of this tool call", timeout=WAIT
    )
    await shot(page, shots, f"decide-edited-done-{size['width']}", full=True)

    async with await open_store(ui_server.store_url) as store:
        runner = make_runner(store, ui_server.tenant)
        [kept] = await RunInspector(runner.runs, run_id).decisions()
    assert kept.arguments == '{"order": 1042, "amount": 42.5}'
    assert kept.edited_arguments == '{"order": 1042, "amount": 20}'
    assert kept.reason == "partial refund: the parcel came back"


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}px")
async def test_reject_with_a_message_to_the_model_and_always_with_the_keyboard(
    browser: Any, ui_server: UIServer, shots: Path | None, size: dict[str, int]
) -> None:
    run_id = await waiting_run(ui_server)
    page = await keyboard_page(browser, ui_server, size, run_id)
    card = page.locator(CARD)

    # Open the editor and discard it: Approve is plain Approve again, the arguments shown.
    await tab_to(page, "Edit arguments of issue_refund (c-refund)")
    await page.keyboard.press("Enter")
    await page.keyboard.type("oops")
    await tab_to(page, "Discard edits to issue_refund (c-refund)")
    await page.keyboard.press("Enter")
    await expect(card.locator("pre.args")).to_be_visible()
    await expect(card.get_by_role("button", name="Approve issue_refund (c-refund)")).to_be_visible()

    await tab_to(page, "call-c-refund-reason")
    await page.keyboard.type("Ask the customer first")
    await tab_to(page, "call-c-refund-always")
    await page.keyboard.press("Space")
    await expect(card.get_by_role("checkbox", name="always for issue_refund")).to_be_checked()
    await tab_to(page, "Reject issue_refund (c-refund)")
    await page.keyboard.press("Enter")

    heading = page.get_by_role("heading", level=1)
    await expect(heading.locator(".badge")).to_have_text("completed", timeout=WAIT)
    rejected = page.locator(".timeline li", has_text="approval/rejected")
    await expect(rejected).to_contain_text("always · reason: Ask the customer first")
    decisions = page.locator("#decisions-title + ul")
    await expect(decisions).to_contain_text(re.compile(r"rejected.*issue_refund \(always\)"))
    await expect(decisions).not_to_contain_text("edited")
    # The model got the reason as the call's result.
    await expect(page.locator(".timeline")).to_contain_text(
        "Tool call rejected: Ask the customer first", timeout=WAIT
    )
    await shot(page, shots, f"decide-rejected-{size['width']}", full=True)
    async with await open_store(ui_server.store_url) as store:
        state = await make_runner(store, ui_server.tenant).load(run_id)
    assert state.always == {"issue_refund": False}
    assert state.output == {"refunded": False}
