"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against
`StatekeeperSaver` on every backend: all base capabilities and every extended one."""

from __future__ import annotations

from collections.abc import AsyncIterator

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from statekeeper.integrations.langgraph.checkpoint import StatekeeperSaver
from statekeeper.stores import Store


async def test_the_official_suite_passes(store: Store) -> None:
    @checkpointer_test(name=f"StatekeeperSaver[{store.url.split(':')[0]}]")
    async def saver() -> AsyncIterator[StatekeeperSaver]:
        yield StatekeeperSaver(store)

    report = await validate(saver)

    assert set(report.results) == {c.value for c in ALL_CAPABILITIES}
    failures = {name: r.failures for name, r in report.results.items() if not r.passed}
    assert failures == {}
    assert all(r.detected and r.tests_failed == 0 for r in report.results.values())
