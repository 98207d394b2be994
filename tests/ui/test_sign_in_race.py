"""A refusal that arrives late, for a key given up since, does not sign out the key the
person has just signed in with (under load, the board's other requests with the wrong
key answered 401 after the right key was in, and the sign-in form came back)."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Route, expect

from .conftest import VIEWPORT, UIServer

WRONG = "sk_nothere_notasecret"


async def test_a_late_refusal_of_the_old_key_keeps_the_new_one_signed_in(
    browser: Any, ui_server: UIServer
) -> None:
    page = await browser.new_page(viewport=VIEWPORT)
    held: list[Route] = []

    async def hold_the_wrong_keys_listing(route: Route) -> None:
        if route.request.headers.get("authorization") == f"Bearer {WRONG}" and not held:
            held.append(route)  # answered below, after the right key is in
        else:
            await route.continue_()

    await page.route("**/api/v1/runs?*", hold_the_wrong_keys_listing)
    await page.goto(f"{ui_server.base}/ui/")
    await page.get_by_label("API key").fill(WRONG)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("refused")  # another request
    await page.get_by_label("API key").fill(ui_server.key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()

    assert held, "the board did not list runs with the wrong key"
    late = held[0].request
    async with page.expect_event("requestfinished", lambda request: request is late):
        await held[0].fulfill(status=401, json={"error": {"type": "AuthenticationError"}})
    await page.evaluate("() => new Promise((done) => setTimeout(done, 0))")  # its handler ran
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    await expect(page.get_by_role("heading", name="Sign in")).to_have_count(0)
