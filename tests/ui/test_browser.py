"""The control UI in a real browser (Debian's chromium) against a real server.

The server runs as ``statekeeper serve`` in its own process over a SQLite file; the test
process writes to the same file through the library (a `Runner` with the demo's
scripted agent), so what the pages show travels the whole way: store, server, stream,
browser.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.async_api import expect

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits
from statekeeper.core.messages import Message
from statekeeper.demo_app import make_runner
from statekeeper.runs.inspect import RunInspector
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store

from .conftest import VIEWPORT, UIServer

BUDGET = Limits(iterations=IterationFlag(maximum=10), budget=BudgetFlag(maximum=0.02))
WAIT = 20_000  # ms: how long a live update may take on a loaded 2-core machine


async def signed_in_page(browser: Any, server: UIServer, path: str = "#/") -> Any:
    """A new tab on the UI, signed in through the login form."""
    page = await browser.new_page(viewport=VIEWPORT)
    await page.goto(f"{server.base}/ui/{path}")
    await page.get_by_label("API key").fill(server.key)
    await page.get_by_role("button", name="Sign in").click()
    return page


async def shot(page: Any, shots: Path | None, name: str, *, full: bool = False) -> None:
    """Save a screenshot of the page's top (or all of it) when screenshots are asked for."""
    if shots is not None:
        await page.evaluate("window.scrollTo(0, 0)")
        await page.mouse.move(0, 0)  # no hover highlight where the last click was
        await page.screenshot(
            path=str(shots / f"{name}.png"), full_page=full, animations="disabled"
        )


async def finished_run(server: UIServer) -> str:
    """A run of the demo agent approved and finished through the library."""
    async with await open_store(server.store_url) as store:
        runner = make_runner(store, server.tenant)
        started = await runner.start("support", "Parcel 7 is late.", headless=False, limits=BUDGET)
        await runner.approve(started.run_id, "c-refund", by="ops")
        assert (await runner.resume(started.run_id)).status == "completed"
        return started.run_id


async def test_board_updates_live_and_a_call_is_approved_from_the_browser(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    done = await finished_run(ui_server)
    page = await signed_in_page(browser, ui_server)
    await expect(page.locator(f'tr[data-run="{done}"] .badge').first).to_have_text("completed")
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    await expect(page.locator("#live")).to_have_text(re.compile("live"), timeout=WAIT)
    await page.evaluate("window.__notReloaded = true")

    # A run starts after the page loaded: it appears on the board without a reload.
    store = await open_store(ui_server.store_url)
    try:
        runner = make_runner(store, ui_server.tenant)
        first = await runner.start(
            "support", "Order 1042 never arrived.", headless=False, limits=BUDGET
        )
        assert first.status == "waiting_for_approval"
        row = page.locator(f'tr[data-run="{first.run_id}"]')
        await expect(row.locator(".badge").first).to_have_text("waiting for approval", timeout=WAIT)
        await expect(row.get_by_role("link", name=re.compile("pending approval"))).to_be_visible()
        await expect(row.get_by_role("meter")).to_have_attribute("aria-valuemax", "0.02")
        # A person's turn comes first, even above a run that finished since.
        later = await finished_run(ui_server)
        await expect(page.locator(f'tr[data-run="{later}"] .badge').first).to_have_text(
            "completed", timeout=WAIT
        )
        await expect(page.locator("tbody tr").first).to_have_attribute("data-run", first.run_id)
        assert await page.evaluate("window.__notReloaded") is True
        await shot(page, shots, "board")

        # A second tab keeps the board open while the first approves on the run page.
        board = await signed_in_page(browser, ui_server)
        board_row = board.locator(f'tr[data-run="{first.run_id}"]')
        await expect(board_row.locator(".badge").first).to_have_text("waiting for approval")

        await row.get_by_role("link", name=re.compile("^run_")).click()
        call = page.locator('article[data-call="c-refund"]')
        await expect(call).to_contain_text("issue_refund")
        await expect(call.locator("pre.args")).to_contain_text('"amount": 42.5')
        await expect(call).to_contain_text("Refund 42.50 for order 1042?")
        await shot(page, shots, "run")

        # Keyboard only: focus Approve and press Enter. The server resumes the run.
        approve = page.get_by_role("button", name="Approve issue_refund (c-refund)")
        await approve.focus()
        await page.keyboard.press("Enter")
        heading = page.get_by_role("heading", level=1)
        await expect(heading.locator(".badge")).to_have_text("completed", timeout=WAIT)
        await expect(page.locator(".timeline")).to_contain_text("lifecycle/end", timeout=WAIT)
        # Who decided stays on record after the run settled the decision.
        approval = page.locator(".timeline li", has_text="approval/approved")
        await expect(approval).to_contain_text(re.compile(r"call c-refund · by key:k\w+"))
        decisions = page.locator("#decisions-title + ul")
        await expect(decisions).to_contain_text(re.compile("approved.*issue_refund.*by key:"))
        assert await page.evaluate("window.__notReloaded") is True

        # The other tab saw the same run finish, live.
        await expect(board_row.locator(".badge").first).to_have_text("completed", timeout=WAIT)
        await expect(board_row).not_to_contain_text("to review")

        state = await RunInspector(runner.runs, first.run_id).state()
        assert state.status == "completed"
        assert state.output == {"refunded": True}
    finally:
        await store.close()


async def test_session_page_draws_branches_forks_and_a_compaction(
    browser: Any, ui_server: UIServer, shots: Path | None
) -> None:
    store = await open_store(ui_server.store_url)
    try:
        manager = SessionManager(store, ui_server.tenant, agent_id="support-bot")
        session = await manager.create(
            title="Order 1042",
            messages=[
                Message.system("You are a courteous support agent."),
                Message.context("Policy: replacements ship after the carrier confirms loss."),
            ],
        )
        for ask, answer in [
            ("My order 1042 has not arrived.", "Let me look it up."),
            ("It was due on Monday.", "The carrier shows it left on Tuesday."),
            ("Can you send it again?", "Once the carrier confirms, yes."),
        ]:
            await session.append(Message.user(ask), Message.assistant(answer))
        branch = await session.branch()
        fork_at = branch[3].seq
        fork = await session.fork(at=fork_at, title="What if a refund?")
        await fork.append(Message.user("I would rather have a refund."))
        # A branch inside the session: go back two entries and answer differently.
        await session.checkout(branch[-3].seq)
        await session.append(Message.user("Actually, cancel the order."))

        async def summarize(messages: list[Message]) -> str:
            return f"Summary of {len(messages)} earlier messages."

        compacted = await session.compact(summarize, keep_last=1)
        replaced = compacted.replaced
    finally:
        await store.close()

    page = await signed_in_page(browser, ui_server, f"#/sessions/{session.id}")
    summary = page.locator(".node.kind-compaction")
    await expect(summary).to_have_count(1)
    await expect(summary).to_contain_text(f"stands for {replaced}")
    await expect(page.locator(".node.covered")).to_have_count(replaced)
    await expect(page.locator(".node.off")).to_have_count(2)  # the answer left behind
    await expect(page.locator(".node", has_text="Actually, cancel")).to_have_class(
        re.compile(r"\bon\b")
    )
    await expect(page.locator("path.bracket").first).to_be_attached()
    fork_chip = page.locator(f'.node[data-seq="{fork_at}"] a.chip.fork')
    await expect(fork_chip).to_contain_text("What if a refund?")
    await summary.get_by_role("button").click()
    await expect(page.locator("aside.detail")).to_contain_text(f"Stands for {replaced} entries")
    await shot(page, shots, "session", full=True)

    await fork_chip.click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("What if a refund?")
    await expect(page.locator(".node.origin")).to_contain_text(f"up to entry #{fork_at}")

    # Fork from the browser: choose an entry, then "Fork a new session here".
    await page.locator(".node.origin a").click()
    await expect(page).to_have_url(re.compile(f"{session.id}$"))
    await page.locator('.node[data-seq="2"] .node-main').click()
    await page.get_by_role("button", name="Fork a new session here").click()
    await expect(page).not_to_have_url(re.compile(f"{session.id}$"))
    await expect(page.locator(".node.origin")).to_contain_text("up to entry #2")


async def test_session_page_links_a_continuation_both_ways(
    browser: Any, ui_server: UIServer
) -> None:
    async with await open_store(ui_server.store_url) as store:
        manager = SessionManager(store, ui_server.tenant, max_messages=4)
        session = await manager.create(title="Long chat", messages=[Message.system("Be brief.")])
        first = session.id
        for n in range(4):
            await session.append(Message.user(f"question {n}"), Message.assistant(f"answer {n}"))
        assert session.id != first  # the boundary moved the conversation on
        later, previous = session.id, session.record.continued_from
        assert previous is not None

    page = await signed_in_page(browser, ui_server, f"#/sessions/{later}")
    back = page.locator(".link-card", has_text="continues")
    await expect(back).to_be_visible()
    await back.get_by_role("link").click()
    await expect(page).to_have_url(re.compile(f"{previous}$"))
    forward = page.locator(".link-card", has_text="continued in")
    await expect(forward).to_be_visible()
    await forward.get_by_role("link").click()
    await expect(page).to_have_url(re.compile(f"{later}$"))
    # The carried-over marker is drawn as what it is.
    await expect(page.locator(".node .role", has_text="continuation")).to_have_count(1)


async def test_the_ui_asks_for_a_key_and_refuses_a_wrong_one(
    browser: Any, ui_server: UIServer
) -> None:
    page = await browser.new_page(viewport=VIEWPORT)
    await page.goto(f"{ui_server.base}/ui/")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await page.get_by_label("API key").fill("sk_nothere_notasecret")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("refused")
    await page.get_by_label("API key").fill(ui_server.key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    # The key lives in this tab's sessionStorage only.
    assert await page.evaluate("sessionStorage.getItem('statekeeper.apiKey')") == ui_server.key
    assert await page.evaluate("localStorage.length") == 0


async def test_a_call_rejected_always_with_a_reason_from_the_browser(
    browser: Any, ui_server: UIServer
) -> None:
    async with await open_store(ui_server.store_url) as store:
        runner = make_runner(store, ui_server.tenant)
        started = await runner.start("support", "Refund order 9.", headless=False)
        page = await signed_in_page(browser, ui_server, f"#/runs/{started.run_id}")
        call = page.locator('article[data-call="c-refund"]')
        await call.get_by_label("Reason").fill("no refunds on Sundays")
        await call.get_by_label(re.compile("always for issue_refund")).check()
        await call.get_by_role("button", name="Reject issue_refund (c-refund)").click()
        heading = page.get_by_role("heading", level=1)
        await expect(heading.locator(".badge")).to_have_text("completed", timeout=WAIT)
        rejected = page.locator(".timeline li", has_text="approval/rejected")
        await expect(rejected).to_contain_text("always · reason: no refunds on Sundays")
        await expect(page.locator('article[data-call="c-refund"]')).to_have_count(0)
        # The agent saw the rejection, with the reason, as the call's result.
        items = await RunInspector(runner.runs, started.run_id).items()
        results = [m.text for m in items.messages if m.role == "tool"]
        assert any("rejected: no refunds on Sundays" in text for text in results), results

        # Time travel: fork a new run from the first checkpoint; the page moves to it.
        await page.get_by_role("button", name="Fork a new run from step 1").click()
        await expect(page).not_to_have_url(re.compile(f"{started.run_id}$"))
        await expect(page.locator(".page-head")).to_contain_text(
            re.compile(r"forked from run_\S+ at step 1")
        )
        await page.locator("a.forked-from").click()
        await expect(page).to_have_url(re.compile(f"{started.run_id}$"))


async def test_keyboard_alone_reaches_a_pending_call_with_a_visible_focus(
    browser: Any, ui_server: UIServer
) -> None:
    async with await open_store(ui_server.store_url) as store:
        started = await make_runner(store, ui_server.tenant).start(
            "support", "Where is order 5?", headless=False
        )
    page = await signed_in_page(browser, ui_server)
    review = page.locator(f'tr[data-run="{started.run_id}"]').get_by_role(
        "link", name=re.compile("pending approval")
    )
    await expect(review).to_be_visible()
    for _ in range(30):
        await page.keyboard.press("Tab")
        if await review.evaluate("link => link === document.activeElement"):
            break
    else:
        raise AssertionError("Tab never reached the review link")
    outline = await review.evaluate("link => getComputedStyle(link).outlineStyle")
    assert outline != "none"  # the focus ring shows where the keyboard is
    # A live update redraws the board: the keyboard stays where it was.
    async with await open_store(ui_server.store_url) as store:
        other = await make_runner(store, ui_server.tenant).start("support", "And order 6?")
    await expect(page.locator(f'tr[data-run="{other.run_id}"]')).to_be_visible(timeout=WAIT)
    focused = await page.evaluate("document.activeElement.closest('tr')?.dataset.run")
    assert focused == started.run_id
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(f"#/runs/{started.run_id}$"))
    approve = page.get_by_role("button", name="Approve issue_refund (c-refund)")
    await expect(approve).to_be_visible()
    # Every control the page offers has a name a screen reader can say.
    names = await page.locator("button, a, input, select").evaluate_all(
        "els => els.filter(e => !(e.getAttribute('aria-label') || e.textContent.trim()"
        " || (e.labels && e.labels.length))).map(e => e.outerHTML)"
    )
    assert names == []


async def test_a_run_paused_at_its_limit_is_raised_and_resumed_from_the_browser(
    browser: Any, ui_server: UIServer
) -> None:
    async with await open_store(ui_server.store_url) as store:
        limits = Limits(iterations=IterationFlag(maximum=1))
        started = await make_runner(store, ui_server.tenant).start(
            "support", "Order 3 is late.", headless=False, limits=limits
        )
    assert started.status == "paused"
    page = await signed_in_page(browser, ui_server, f"#/runs/{started.run_id}")
    heading = page.get_by_role("heading", level=1)
    await expect(heading.locator(".badge")).to_have_text("paused")
    iterations = page.locator("tr", has=page.get_by_role("rowheader", name="iterations"))
    await expect(iterations).to_have_class(re.compile("over"))
    await page.get_by_label("new maximum for iterations").fill("5")
    await page.get_by_role("button", name="Raise iterations").click()
    await expect(iterations.locator("td").nth(1)).to_have_text("5")
    await page.get_by_role("button", name="Resume").click()
    # On to the next stop: the refund waits for a person.
    await expect(heading.locator(".badge")).to_have_text("waiting for approval", timeout=WAIT)
    await expect(page.locator('article[data-call="c-refund"]')).to_be_visible()


async def test_the_dag_layout_keeps_the_active_branch_in_the_first_lane(
    browser: Any, ui_server: UIServer
) -> None:
    page = await browser.new_page(viewport=VIEWPORT)
    await page.goto(f"{ui_server.base}/ui/")  # the login page: the modules' origin
    # 1-2-3-4 active; 5 branches off 2 and 6 continues it; 7 is a side entry (checkpoint)
    # on 4; 8 is a root of its own (a clear marker) on no branch.
    plan = await page.evaluate(
        """async () => {
            const { layout } = await import("/ui/dag.js");
            const e = (seq, parent_seq, on_branch, kind = "message") =>
                ({ seq, parent_seq, on_branch, kind, covers: [] });
            const p = layout([e(6, 5, false), e(1, null, true), e(2, 1, true), e(3, 2, true),
                              e(4, 3, true), e(5, 2, false), e(7, 4, false, "checkpoint"),
                              e(8, null, false, "marker")]);
            return { lanes: p.lanes, lane: Object.fromEntries(p.laneOf),
                     rows: p.rows.map((r) => r.seq), attached: [...p.attached.keys()],
                     roots: p.edges.filter((x) => x.from === null).map((x) => x.to) };
        }"""
    )
    assert plan["rows"] == [1, 2, 3, 4, 5, 6, 8]
    assert plan["attached"] == [4]
    assert plan["lane"] == {"1": 0, "2": 0, "3": 0, "4": 0, "5": 1, "6": 1, "8": 2}
    assert plan["lanes"] == 3
    assert plan["roots"] == [1, 8]


async def test_delegated_runs_show_as_a_tree_and_link_back(
    browser: Any, ui_server: UIServer
) -> None:
    async with await open_store(ui_server.store_url) as store:
        runner = make_runner(store, ui_server.tenant)
        parent = await runner.start("support", "Order 11 is lost.", headless=False)
        child = await runner.delegate(parent.state, "support", "Check order 11.")
        grandchild = await runner.delegate(child.state, "support", "Ask the carrier.")
    page = await signed_in_page(browser, ui_server, f"#/runs/{parent.run_id}")
    tree = page.locator("#children-title + ul.tree")
    child_link = tree.get_by_role("link", name=re.compile(child.run_id[-8:]))
    await expect(child_link).to_be_visible()
    # The grandchild hangs under the child, one level deeper.
    await expect(tree.locator("li ul.tree a", has_text=grandchild.run_id[-8:])).to_be_visible()
    await child_link.click()
    await expect(page.locator(".page-head")).to_contain_text("child of")
    await (
        page.locator(".page-head").get_by_role("link", name=re.compile(parent.run_id[-8:])).click()
    )
    await expect(page).to_have_url(re.compile(f"{parent.run_id}$"))
