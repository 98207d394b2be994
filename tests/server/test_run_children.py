"""A run's detail lists the runs it delegated to, as a tree, read from the parents' own
records: its cost does not grow with the tenant's other runs (it listed them all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statekeeper.demo_app import make_runner
from statekeeper.runs.store import RUNS_NAMESPACE
from statekeeper.server.routes_runs import detail
from statekeeper.stores import Store, open_store

TENANT = "acme"


class ListingSpy:
    """A store that counts listings of the runs' index (everything else passes)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.run_listings = 0

    async def list_records(self, tenant: str, namespace: str, **kwargs: Any) -> Any:
        if namespace == RUNS_NAMESPACE:
            self.run_listings += 1
        return await self._store.list_records(tenant, namespace, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def ids(tree: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    return [(node["run_id"], ids(node["children"])) for node in tree]


async def test_a_runs_children_and_grandchildren_come_without_listing_the_runs(
    tmp_path: Path,
) -> None:
    async with await open_store(f"sqlite:///{tmp_path}/state.db") as store:
        runner = make_runner(store, TENANT)
        for n in range(30):  # other runs of the tenant, which the detail must not read
            await runner.start("support", f"Where is order {n}?")
        parent = await runner.start("support", "Order 11 is lost.", headless=False)
        child = await runner.delegate(parent.state, "support", "Check order 11.")
        grandchild = await runner.delegate(child.state, "support", "Ask the carrier.")
        second = await runner.delegate(parent.state, "support", "Refund order 11.")
        triage = await runner.start("triage", "Escalated: orders 1042, 1043.")
        carriers = sorted(
            r.run_id for r in await runner.runs.list() if r.parent_run_id == triage.run_id
        )

        spy = ListingSpy(store)
        spied = make_runner(spy, TENANT)  # type: ignore[arg-type]
        shown = await detail(spied, parent.run_id)
        shown_triage = await detail(spied, triage.run_id)
        leaf = await detail(spied, grandchild.run_id)

    assert ids(shown["children"]) == sorted(
        [(child.run_id, [(grandchild.run_id, [])]), (second.run_id, [])]
    )
    assert ids(shown_triage["children"]) == [(c, []) for c in carriers]
    assert len(carriers) == 2
    assert leaf["children"] == []
    assert spy.run_listings == 0
