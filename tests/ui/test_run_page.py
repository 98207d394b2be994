"""A run's page in a real browser: the conversation inline with the timeline, in order,
and the output shown expanded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.async_api import expect

from statekeeper.demo_app import make_runner
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
