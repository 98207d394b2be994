"""`StatekeeperStore` (LangGraph ``BaseStore``) on every backend: through real LangGraph
graphs (async and sync, ``store`` parameter and ``get_store()``), side by side with
LangGraph's own ``InMemoryStore`` for the same operations, TTL, batches and errors."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, GetOp, InvalidNamespaceError, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidIdError, StatekeeperError
from statekeeper.integrations.langgraph.store import StatekeeperStore
from statekeeper.stores import Store
from statekeeper.sync import blocking


def letters(texts: Sequence[str]) -> list[list[float]]:
    """A deterministic embedding: how often each of a, b, c, d occurs."""
    return [[float(t.count(c)) for c in "abcd"] for t in texts]


class Chat(TypedDict):
    user: str
    said: str
    remembered: Annotated[list[str], operator.add]


def build(store: BaseStore, *, asynchronous: bool = True) -> Any:
    """Remember what each user said; answer with what was remembered before. The nodes
    are async (async store methods) or plain (sync methods, run on worker threads)."""

    async def aremember(state: Chat, *, store: BaseStore) -> dict[str, Any]:
        namespace = ("memories", state["user"])
        before = await store.asearch(namespace, limit=100)
        await store.aput(namespace, f"m{len(before)}", {"text": state["said"], "n": len(before)})
        return {"remembered": [item.value["text"] for item in before]}

    def remember(state: Chat, *, store: BaseStore) -> dict[str, Any]:
        namespace = ("memories", state["user"])
        before = store.search(namespace, limit=100)
        store.put(namespace, f"m{len(before)}", {"text": state["said"], "n": len(before)})
        return {"remembered": [item.value["text"] for item in before]}

    async def arecall(state: Chat) -> dict[str, Any]:
        found = await get_store().asearch(("memories", state["user"]), filter={"n": {"$gte": 0}})
        return {"remembered": [f"total:{len(found)}"]}

    def recall(state: Chat) -> dict[str, Any]:
        found = get_store().search(("memories", state["user"]), filter={"n": {"$gte": 0}})
        return {"remembered": [f"total:{len(found)}"]}

    graph = StateGraph(Chat)
    graph.add_node("remember", aremember if asynchronous else remember)
    graph.add_node("recall", arecall if asynchronous else recall)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "recall")
    graph.add_edge("recall", END)
    return graph.compile(store=store)


async def test_a_graph_reads_and_writes_memories_across_runs(store: Store) -> None:
    memories = StatekeeperStore(store, tenant="app")
    graph = build(memories)
    sync_graph = build(memories, asynchronous=False)

    first = await graph.ainvoke({"user": "alice", "said": "I like tea", "remembered": []})
    second = await graph.ainvoke({"user": "alice", "said": "I live in Oslo", "remembered": []})
    # Plain nodes in an async run: LangGraph runs them on threads, the store's loop is free.
    other = await sync_graph.ainvoke({"user": "bob", "said": "hi", "remembered": []})
    # A sync run from another thread.
    third = await asyncio.to_thread(
        sync_graph.invoke, {"user": "alice", "said": "tea again", "remembered": []}
    )

    assert first["remembered"] == ["total:1"]
    assert second["remembered"] == ["I like tea", "total:2"]
    assert other["remembered"] == ["total:1"]
    assert third["remembered"] == ["I like tea", "I live in Oslo", "total:3"]
    assert await memories.alist_namespaces(prefix=("memories",)) == [
        ("memories", "alice"),
        ("memories", "bob"),
    ]
    reopened = StatekeeperStore(store, tenant="app")
    item = await reopened.aget(("memories", "alice"), "m1")
    assert item is not None
    assert item.value == {"text": "I live in Oslo", "n": 1}
    assert await StatekeeperStore(store, tenant="other").aget(("memories", "alice"), "m1") is None


async def run_side_by_side(ours: BaseStore, theirs: BaseStore) -> None:
    """The same operations on both stores; every observable result must agree."""
    docs = {
        ("docs", "alice"): {"a1": "aaaa", "a2": "abab", "a3": "cccc"},
        ("docs", "alice", "archive"): {"old": "bbbb"},
        ("docs", "bob"): {"b1": "abcd", "b2": "dddd"},
        ("notes",): {"n1": "aabb"},
        ("prefs", "alice", "ui", "v2"): {"theme": "dark"},
    }
    for n, (namespace, items) in enumerate(docs.items()):
        for key, text in items.items():
            value = {"text": text, "n": n, "len": len(text), "meta": {"owner": namespace[-1]}}
            for s in (ours, theirs):
                await s.aput(namespace, key, value)
    for s in (ours, theirs):
        await s.aput(
            ("docs", "alice"), "a2", {"text": "abab", "n": 9, "len": 4, "meta": {"owner": "x"}}
        )
        await s.adelete(("docs", "alice"), "a3")
        await s.adelete(("docs", "alice"), "never-there")
        await s.aput(("docs", "bob"), "plain", {"text": "aaaa", "n": 1, "len": 4}, index=False)

    async def both(method: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return tuple([await getattr(s, method)(*args, **kwargs) for s in (ours, theirs)])

    def items(found: list[Any]) -> list[tuple[Any, ...]]:
        return sorted((i.namespace, i.key, repr(i.value)) for i in found)

    for kwargs in [
        {},
        {"prefix": ("docs",)},
        {"suffix": ("alice",)},
        {"prefix": ("docs", "*")},
        {"suffix": ("*", "v2")},
        {"max_depth": 1},
        {"max_depth": 2, "prefix": ("docs",)},
        {"limit": 2, "offset": 1},
        {"prefix": ("nothing",)},
    ]:
        mine, reference = await both("alist_namespaces", **kwargs)
        assert mine == reference, kwargs
    # After the listings: InMemoryStore lists a namespace once it was read, even empty.
    for namespace, key in [(("docs", "alice"), "a2"), (("docs", "alice"), "a3"), (("x",), "k")]:
        mine, reference = await both("aget", namespace, key)
        assert (mine and (mine.namespace, mine.key, mine.value)) == (
            reference and (reference.namespace, reference.key, reference.value)
        )
    for prefix, filter in [
        ((), None),
        (("docs",), None),
        (("docs", "alice"), None),
        (("docs",), {"n": 0}),
        (("docs",), {"n": {"$gt": 0}}),
        ((), {"n": {"$gte": 1, "$lt": 3}}),
        ((), {"len": {"$lte": 4}, "n": {"$ne": 2}}),
        ((), {"meta": {"owner": "alice"}}),
        ((), {"text": {"$eq": "aaaa"}}),
        (("prefs",), {"text": "dark"}),
    ]:
        mine, reference = await both("asearch", prefix, filter=filter, limit=100)
        assert items(mine) == items(reference), (prefix, filter)
    for query, prefix in [("aaab", ("docs",)), ("cd", ()), ("b", ("docs", "alice"))]:
        mine, reference = await both("asearch", prefix, query=query, limit=100)
        # Scores agree item by item and in order (equal scores may list in another order).
        assert [i.score for i in mine] == pytest.approx([i.score for i in reference], abs=1e-6)
        assert {i.key: i.score for i in mine} == pytest.approx(
            {i.key: i.score for i in reference}, abs=1e-6
        )
        assert items(mine) == items(reference)
        assert [i.key for i in mine if i.score is None] == [
            i.key for i in reference if i.score is None
        ]


async def test_same_results_as_langgraphs_in_memory_store(store: Store) -> None:
    index = {"dims": 4, "embed": letters, "fields": ["text"]}
    await run_side_by_side(
        StatekeeperStore(store, tenant="app", index=index), InMemoryStore(index=index)
    )


async def test_same_results_without_an_index(store: Store) -> None:
    ours, theirs = StatekeeperStore(store, tenant="app"), InMemoryStore()
    for s in (ours, theirs):
        await s.aput(("a",), "k1", {"text": "aaaa"}, index=["text"])  # ignored: no index
        await s.aput(("a",), "k2", {"text": "bbbb"})
    mine = await ours.asearch(("a",), query="aaaa")  # the query is ignored too
    reference = await theirs.asearch(("a",), query="aaaa")
    assert [(i.key, i.score) for i in mine] == [(i.key, i.score) for i in reference]


async def test_a_comparison_on_a_missing_field_is_no_match_not_a_crash(store: Store) -> None:
    ours, theirs = StatekeeperStore(store, tenant="app"), InMemoryStore()
    for s in (ours, theirs):
        await s.aput(("a",), "with", {"n": 5})
        await s.aput(("a",), "without", {"other": 1})
    assert [i.key for i in await ours.asearch(("a",), filter={"n": {"$gt": 1}})] == ["with"]
    with pytest.raises(TypeError):  # LangGraph's InMemoryStore: float(None)
        await theirs.asearch(("a",), filter={"n": {"$gt": 1}})


async def test_a_batch_reads_before_it_writes_and_the_last_write_wins(store: Store) -> None:
    ours, theirs = StatekeeperStore(store, tenant="app"), InMemoryStore()
    ops = [
        PutOp(("b",), "k", {"v": 1}),
        GetOp(("b",), "k"),
        SearchOp(("b",)),
        PutOp(("b",), "k", {"v": 2}),
    ]
    mine, reference = await ours.abatch(ops), await theirs.abatch(ops)
    assert mine == reference == [None, None, [], None]
    got = [await s.aget(("b",), "k") for s in (ours, theirs)]
    assert [g.value for g in got if g] == [{"v": 2}, {"v": 2}]


async def test_ttl_is_set_on_put_and_refreshed_on_read(store: Store) -> None:
    memories = StatekeeperStore(store, tenant="app", ttl={"default_ttl": 30})
    before = utcnow()
    await memories.aput(("t",), "default", {"v": 1})
    await memories.aput(("t",), "short", {"v": 2}, ttl=5)
    await memories.aput(("t",), "forever", {"v": 3}, ttl=None)
    after = utcnow()

    async def record(key: str) -> Any:
        return await store.get_record("app", "ltm.langgraph", f"t.:{key}")

    default, short, forever = [await record(k) for k in ("default", "short", "forever")]
    assert before + timedelta(minutes=30) <= default.expires_at <= after + timedelta(minutes=30)
    assert before + timedelta(minutes=5) <= short.expires_at <= after + timedelta(minutes=5)
    assert forever.expires_at is None
    await memories.aget(("t",), "short", refresh_ttl=False)
    assert (await record("short")).version == short.version
    await memories.aget(("t",), "short")
    assert (await record("short")).version == short.version + 1
    assert (await record("short")).expires_at >= short.expires_at
    await memories.asearch(("t",), refresh_ttl=False)
    assert (await record("default")).version == default.version
    no_refresh = StatekeeperStore(store, tenant="app", ttl={"refresh_on_read": False})
    await no_refresh.aget(("t",), "default")
    assert (await record("default")).version == default.version


async def test_sync_methods_on_the_stores_own_loop_are_refused(store: Store) -> None:
    memories = StatekeeperStore(store, tenant="app")
    with pytest.raises(StatekeeperError, match="async"):
        memories.put(("a",), "k", {"v": 1})
    assert await memories.aget(("a",), "k") is None
    await asyncio.to_thread(memories.put, ("a",), "k", {"v": 1})  # from a thread: fine
    assert (await asyncio.to_thread(memories.get, ("a",), "k")).value == {"v": 1}


def test_sync_use_without_an_event_loop(tmp_path: Path) -> None:
    opened = blocking.open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        memories = StatekeeperStore(opened.unwrap(), tenant="app")
        graph = build(memories, asynchronous=False)
        memories.put(("memories", "carol"), "m0", {"text": "hello", "n": 0})
        out = graph.invoke({"user": "carol", "said": "again", "remembered": []})
        assert out["remembered"] == ["hello", "total:2"]
        assert [i.key for i in memories.search(("memories",))] == ["m0", "m1"]
        assert memories.list_namespaces() == [("memories", "carol")]
    finally:
        opened.close()


async def test_bad_namespaces_and_keys_are_typed_errors_and_write_nothing(store: Store) -> None:
    memories = StatekeeperStore(store, tenant="app")
    with pytest.raises(InvalidNamespaceError):  # LangGraph's own rule
        await memories.aput(("a.b",), "k", {"v": 1})
    with pytest.raises(InvalidIdError):  # ours: labels become part of a record key
        await memories.aput(("a b",), "k", {"v": 1})
    with pytest.raises(InvalidIdError):
        await memories.aput(("users", "a/b"), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        await memories.aput(("../x",), "k", {"v": 1})
    assert await memories.alist_namespaces() == []
    await memories.aput(("files",), "/notes/todo.md", {"v": 1})  # any text is a key
    found = await memories.asearch(("files",))
    assert [i.key for i in found] == ["/notes/todo.md"]


@pytest.mark.parametrize(
    "bad",
    [
        PutOp(("a",), "k2", {"v": float("nan")}),
        PutOp(("a",), "k2", {"v": 1}, ttl=-1),
        PutOp(("a",), "", {"v": 1}),
        PutOp(("a b",), "k2", {"v": 1}),
        PutOp(("a",), "k2", ["not", "a", "dict"]),  # type: ignore[arg-type]
    ],
)
async def test_a_batch_with_one_bad_put_writes_nothing(store: Store, bad: PutOp) -> None:
    memories = StatekeeperStore(store, tenant="app")
    with pytest.raises(StatekeeperError):
        await memories.abatch([PutOp(("a",), "k1", {"v": 1}), bad])
    assert await memories.asearch(()) == []


def test_a_bad_ttl_config_is_refused_when_the_store_is_made() -> None:
    from statekeeper.errors import InvalidInputError
    from statekeeper.stores.memory import MemoryStore

    with pytest.raises(InvalidInputError, match="ttl"):
        StatekeeperStore(MemoryStore(), tenant="app", ttl={"default_ttl": -1})


async def test_namespace_listings_match_langgraph_over_a_grid_of_arguments(store: Store) -> None:
    ours, theirs = StatekeeperStore(store, tenant="app"), InMemoryStore()
    tree = [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("a",),
        ("b", "a", "f"),
        ("users", "123"),
        ("users", "456", "settings"),
        ("admin", "users", "789"),
    ]
    for i, namespace in enumerate(tree):
        for s in (ours, theirs):
            await s.aput(namespace, f"id{i}", {"i": i})
    prefixes = [None, ("a",), ("a", "b"), ("a", "*"), ("*", "b"), ("*", "users"), ("zz",)]
    suffixes = [None, ("f",), ("*", "f"), ("d", "*"), ("789",)]
    for prefix in prefixes:
        for suffix in suffixes:
            for max_depth in (None, 1, 2, 3):
                for limit, offset in ((100, 0), (2, 1)):
                    args = {"prefix": prefix, "suffix": suffix, "max_depth": max_depth}
                    args |= {"limit": limit, "offset": offset}
                    mine = await ours.alist_namespaces(**args)
                    assert mine == await theirs.alist_namespaces(**args), args
