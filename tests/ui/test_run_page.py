"""A run's page in a real browser: the conversation inline with the timeline, in order,
and the output shown expanded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.async_api import expect

from statekeeper.core.messages import Message
from statekeeper.demo_app import make_runner
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store

from .conftest import UIServer
from .test_browser import WAIT, shot, signed_in_page


async def test_the_conversation_reads_in_order_inside_the_timeline(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    async with await open_store(ui_server.store_url) as store:
        runner = make_runner(store, ui_server.tenant)
        started = await runner.start("support", "Order 1042 never arrived.", headless=False)
        await runner.approve(started.run_id, "c-refund", by="ops")
        assert (await runner.resume(started.run_id)).status == "completed"

    page = await signed_in_page(browser, ui_server, f"#/runs/{started.run_id}")
    timeline = page.locator(".timeline")
    messages = timeline.locator(".msg")
    await expect(messages.last).to_contain_text("Your refund is on its way.", timeout=WAIT)
    said = await messages.evaluate_all("ms => ms.map(m => m.textContent)")
    expected = [
        "Order 1042 never arrived.",  # the user's input
        "Let me look up order 1042.",  # the answer, with its tool call
        "lost in transit",  # the tool's result
        "The parcel is lost; I will refund it.",
        '"refund": "R-1042"',
        "Your refund is on its way.",
    ]
    at = [next(i for i, text in enumerate(said) if part in text) for part in expected]
    assert at == sorted(at), said
    # A tool call shows its tool and its arguments; the answer sits under its event.
    call = timeline.locator("li", has_text="assistant/complete").first.locator(".call")
    await expect(call.locator("code")).to_have_text("lookup_order")
    await expect(call.locator("pre")).to_contain_text('"order": 1042')
    # Each message is shown once.
    assert len(said) == len(set(said))
    # The output is open, not folded away.
    output = page.locator("details.output")
    await expect(output).to_have_attribute("open", "")
    await expect(output.locator("pre")).to_contain_text('"refunded": true')
    await shot(page, shots, "run-conversation")

    # The timeline filters by stream, then by type; the conversation is a stream too.
    await page.get_by_label("Stream").select_option("tool")
    shown = timeline.locator("li:visible")
    types = await shown.evaluate_all("lis => lis.map(li => li.dataset.type)")
    assert types
    assert all(t.startswith("tool/") for t in types), types
    await page.get_by_label("Type").select_option("tool/result")
    await expect(shown).to_have_count(2)
    await page.get_by_label("Stream").select_option("message")
    await expect(shown).to_have_count(1)  # the user's input (the rest sit under events)
    await expect(shown).to_contain_text("Order 1042 never arrived.")
    await page.get_by_label("Stream").select_option("")
    await expect(timeline.locator("li[hidden]")).to_have_count(0)


async def test_the_sessions_page_follows_new_sessions_and_appends(
    browser: Any, ui_server: UIServer
) -> None:
    async with await open_store(ui_server.store_url) as store:
        manager = SessionManager(store, ui_server.tenant)
        first = await manager.create(title="First chat")
        page = await signed_in_page(browser, ui_server, "#/sessions")
        await expect(page.locator(f'tr[data-session="{first.id}"]')).to_be_visible(timeout=WAIT)
        await page.evaluate("window.__notReloaded = true")
        # A session made and one written after the page loaded show without a reload,
        # the most recently active first.
        second = await manager.create(title="Second chat")
        await expect(page.locator("tbody tr").first).to_have_attribute(
            "data-session", second.id, timeout=WAIT
        )
        await first.append(Message.user("hello"), Message.assistant("hi"))
        row = page.locator(f'tr[data-session="{first.id}"]')
        await expect(row.locator('td[data-label="Messages"]')).to_have_text("2", timeout=WAIT)
        await expect(page.locator("tbody tr").first).to_have_attribute("data-session", first.id)
        assert await page.evaluate("window.__notReloaded") is True
