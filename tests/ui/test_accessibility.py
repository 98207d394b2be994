"""An accessibility audit of every page of the control UI: axe-core (from npm, installed
by ``make browser``) runs in Debian's chromium on each page, at 1366 and at 700 px, and
finds no serious or critical violation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect

from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.core.messages import Message
from statekeeper.demo_app import make_runner
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store
from statekeeper.testing.services import services_required

from .conftest import ROOT, VIEWPORT, UIServer
from .test_browser import WAIT

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
SIZES = [VIEWPORT, {"width": 700, "height": 900}]


def axe_source() -> str:
    """axe-core's script, or stop the test: skip locally, fail when services are required."""
    if AXE.is_file():
        return AXE.read_text()
    reason = "axe-core is not installed (run `make browser`: npm ci)"
    if services_required():
        pytest.fail(f"{reason}; required because CI=true or STATEKEEPER_REQUIRE_SERVICES=1", False)
    pytest.skip(f"{reason} (set STATEKEEPER_REQUIRE_SERVICES=1 to make this an error)")


async def audit(page: Any, source: str) -> list[str]:
    """The serious and critical violations axe finds on the page as it is now."""
    if not await page.evaluate("() => typeof window.axe === 'object'"):
        await page.add_script_tag(content=source)
    found = await page.evaluate(
        "() => axe.run(document, { resultTypes: ['violations'] }).then(r => r.violations)"
    )
    return [
        f"{v['id']} ({v['impact']}): {v['help']}: "
        + json.dumps([n["target"] for n in v["nodes"]][:5])
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


async def _data(server: UIServer) -> dict[str, str]:
    """A run of each kind an operator meets, and a session with a branch and a fork."""
    async with await open_store(server.store_url) as store:
        runner = make_runner(store, server.tenant)
        waiting = await runner.start("support", "Refund order 1042.", headless=False)
        await runner.start(
            "support",
            "Where is order 7?",
            headless=False,
            limits=Limits(iterations=IterationFlag(maximum=1)),
        )
        triage = await runner.start("triage", "Escalated: orders 1042, 1043.", headless=False)
        manager = SessionManager(store, server.tenant)
        chat = await manager.create(title="Order 1042", messages=[Message.system("Be brief.")])
        await chat.append(Message.user("Where is it?"), Message.assistant("On its way."))
        await chat.fork(at=2, title="What if")
    return {"waiting": waiting.run_id, "done": triage.run_id, "session": chat.id}


async def test_every_page_passes_an_accessibility_audit_at_both_widths(
    browser: Any, ui_server: UIServer, tmp_path: Path
) -> None:
    source = axe_source()
    made = await _data(ui_server)
    problems: dict[str, list[str]] = {}
    for size in SIZES:
        page = await browser.new_page(viewport=size, bypass_csp=True)  # to inject axe only
        await page.goto(f"{ui_server.base}/ui/")
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        problems[f"login@{size['width']}"] = await audit(page, source)
        await page.get_by_label("API key").fill(ui_server.key)
        await page.get_by_role("button", name="Sign in").click()
        pages = {
            "board": ("#/", page.locator(f'tr[data-run="{made["waiting"]}"]')),
            "run waiting": (f"#/runs/{made['waiting']}", page.locator("article[data-call]")),
            "run done": (f"#/runs/{made['done']}", page.locator(".timeline .msg").first),
            "sessions": ("#/sessions", page.locator(f'tr[data-session="{made["session"]}"]')),
            "session": (f"#/sessions/{made['session']}", page.locator(".node").first),
        }
        for name, (path, ready) in pages.items():
            await page.goto(f"{ui_server.base}/ui/{path}")
            await expect(ready).to_be_visible(timeout=WAIT)
            problems[f"{name}@{size['width']}"] = await audit(page, source)
        # Start and steer: the board's New run form, and a checkpoint's fork with input.
        await page.goto(f"{ui_server.base}/ui/#/")
        await page.get_by_role("button", name="New run").click()
        await expect(page.locator("#new-input")).to_be_visible(timeout=WAIT)
        problems[f"board new run@{size['width']}"] = await audit(page, source)
        await page.goto(f"{ui_server.base}/ui/#/runs/{made['done']}")
        opener = page.get_by_role("button", name="With input: fork from step 1 with new input")
        await opener.click(timeout=WAIT)
        await expect(page.get_by_label("New input for a fork from step 1")).to_be_visible()
        problems[f"run fork with input@{size['width']}"] = await audit(page, source)
        # Deciding a call: its arguments open for editing, with the message a bad edit gets.
        await page.goto(f"{ui_server.base}/ui/#/runs/{made['waiting']}")
        edit = page.get_by_role("button", name="Edit arguments of issue_refund (c-refund)")
        await edit.click(timeout=WAIT)
        await page.get_by_label("Edited arguments (a JSON object)").fill("[1]")
        name = "Approve with edits: issue_refund (c-refund)"
        await page.get_by_role("button", name=name).click()
        await expect(page.locator(".field-error")).to_contain_text("JSON object")
        problems[f"run edit arguments@{size['width']}"] = await audit(page, source)
        await page.close()
    found = {k: v for k, v in problems.items() if v}
    assert found == {}, json.dumps(found, indent=1)
