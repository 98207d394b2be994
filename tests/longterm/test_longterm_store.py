"""`LongTermStore` on every backend (the ``store`` fixture): items, namespaces, filters,
paging, TTL with refresh on read, semantic search, validation and corrupt records."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidIdError, InvalidInputError, StoreCorruptError
from statekeeper.longterm import LongTermStore, MemoryItem
from statekeeper.stores import Store

NAMESPACES = [
    ("users", "alice"),
    ("users", "alice", "notes"),
    ("users", "bob"),
    ("users-x", "carol"),
    ("docs",),
    ("docs", "v1", "notes"),
]


def letters(texts: Sequence[str]) -> list[list[float]]:
    """A deterministic embedding: how often each of a, b, c, d occurs."""
    return [[float(t.count(c)) for c in "abcd"] for t in texts]


async def filled(store: Store) -> tuple[LongTermStore, dict[tuple[tuple[str, ...], str], dict]]:
    memories = LongTermStore(store, tenant="alice")
    data = {}
    for n, ns in enumerate(NAMESPACES):
        for k in range(3):
            value = {"n": n * 3 + k, "kind": ["x", "y", "z"][k], "tags": {"lang": "en"}}
            await memories.put(ns, f"k{k}", value)
            data[ns, f"k{k}"] = value
    return memories, data


async def all_records(store: Store, tenant: str = "alice") -> list[str]:
    return [r.key for r in await store.list_records(tenant, "ltm.default", limit=10_000)]


async def test_put_get_delete_keep_created_at_and_report_absence(store: Store) -> None:
    memories = LongTermStore(store, tenant="alice")
    first = await memories.put(("users", "alice"), "theme", {"value": "dark"})
    second = await memories.put(("users", "alice"), "theme", {"value": "light"})
    got = await memories.get(("users", "alice"), "theme")

    assert isinstance(got, MemoryItem)
    assert got.value == {"value": "light"}
    assert got.key == "theme"
    assert got.namespace == ("users", "alice")
    assert got.created_at == first.created_at == second.created_at
    assert got.updated_at == second.updated_at >= first.updated_at
    assert got.expires_at is None
    assert got.score is None
    assert await memories.get(("users", "alice"), "other") is None
    assert await memories.get(("users",), "theme") is None
    assert await memories.delete(("users", "alice"), "theme") is True
    assert await memories.delete(("users", "alice"), "theme") is False
    assert await memories.get(("users", "alice"), "theme") is None


async def test_items_are_invisible_to_other_tenants_and_other_store_names(store: Store) -> None:
    alice = LongTermStore(store, tenant="alice")
    await alice.put(("shared",), "k", {"owner": "alice"})
    for other in (
        LongTermStore(store, tenant="bob"),
        LongTermStore(store, tenant="alice", name="x"),
    ):
        assert await other.get(("shared",), "k") is None
        assert await other.search() == []
        assert await other.list_namespaces() == []
        assert await other.delete(("shared",), "k") is False
    assert (await alice.get(("shared",), "k")) is not None


async def test_list_namespaces_by_prefix_suffix_wildcards_and_depth(store: Store) -> None:
    memories, _ = await filled(store)
    every = sorted(set(NAMESPACES))

    assert await memories.list_namespaces() == every
    assert await memories.list_namespaces(prefix=("users",)) == [
        ns for ns in every if ns[0] == "users"
    ]
    assert await memories.list_namespaces(suffix=("notes",)) == [
        ns for ns in every if ns[-1] == "notes"
    ]
    assert await memories.list_namespaces(prefix=("*", "alice")) == [
        ns for ns in every if len(ns) >= 2 and ns[1] == "alice"
    ]
    assert await memories.list_namespaces(suffix=("*", "notes")) == [
        ns for ns in every if len(ns) >= 2 and ns[-1] == "notes"
    ]
    for depth in (1, 2, 3):
        assert await memories.list_namespaces(max_depth=depth) == sorted(
            {ns[:depth] for ns in every}
        )
    assert await memories.list_namespaces(prefix=("users",), max_depth=1) == [("users",)]
    pages = [await memories.list_namespaces(limit=2, offset=o) for o in range(0, 8, 2)]
    assert [ns for page in pages for ns in page] == every
    assert await memories.list_namespaces(prefix=("nobody",)) == []


async def test_search_scopes_by_namespace_prefix_label_by_label(store: Store) -> None:
    memories, data = await filled(store)

    for prefix in [(), ("users",), ("users", "alice"), ("docs", "v1"), ("users-x",)]:
        found = await memories.search(prefix, limit=100)
        expected = sorted(
            (ns, key) for ns, key in data if ns[: len(prefix)] == prefix
        )  # ("users",) must not reach ("users-x", ...)
        assert sorted((i.namespace, i.key) for i in found) == expected
        assert all(i.value == data[i.namespace, i.key] for i in found)


async def test_search_filters_with_every_operator(store: Store) -> None:
    memories, data = await filled(store)
    cases = [
        ({"kind": "x"}, lambda v: v["kind"] == "x"),
        ({"kind": {"$ne": "x"}}, lambda v: v["kind"] != "x"),
        ({"n": {"$gt": 4, "$lte": 10}}, lambda v: 4 < v["n"] <= 10),
        ({"n": {"$gte": 4, "$lt": 10}}, lambda v: 4 <= v["n"] < 10),
        ({"n": {"$in": [1, 7, 99]}}, lambda v: v["n"] in (1, 7, 99)),
        ({"n": {"$nin": [1, 7]}, "kind": "y"}, lambda v: v["n"] not in (1, 7) and v["kind"] == "y"),
        ({"tags": {"lang": "en"}, "n": {"$eq": 3}}, lambda v: v["n"] == 3),
        ({"missing": {"$gt": 0}}, lambda v: False),
        ({"missing": None}, lambda v: True),
    ]
    for filter, want in cases:
        found = await memories.search(filter=filter, limit=100)
        assert sorted(i.value["n"] for i in found) == sorted(
            v["n"] for v in data.values() if want(v)
        ), filter


async def test_limit_and_offset_page_through_every_match_once(store: Store) -> None:
    memories, data = await filled(store)
    whole = await memories.search(limit=1000)
    assert len(whole) == len(data)
    pages = [await memories.search(limit=4, offset=o) for o in range(0, len(data) + 4, 4)]
    assert [(i.namespace, i.key) for page in pages for i in page] == [
        (i.namespace, i.key) for i in whole
    ]
    filtered = await memories.search(filter={"kind": "z"}, limit=2, offset=1)
    everything_z = await memories.search(filter={"kind": "z"}, limit=100)
    assert filtered == everything_z[1:3]


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def test_ttl_expires_items_and_reads_refresh_it(store: Store) -> None:
    clock = Clock(utcnow() - timedelta(minutes=30))  # written half an hour ago
    memories = LongTermStore(store, tenant="alice", default_ttl=60, clock=clock)
    await memories.put(("t",), "default", {"v": 1})
    await memories.put(("t",), "gone", {"v": 2}, ttl=10)  # expired 20 minutes ago
    await memories.put(("t",), "forever", {"v": 3}, ttl=None)
    await memories.put(("u",), "gone", {"v": 4}, ttl=10)
    clock.now = utcnow()

    assert await memories.get(("t",), "gone") is None
    found = await memories.search(("t",), refresh_ttl=False)
    assert sorted(i.key for i in found) == ["default", "forever"]
    assert await memories.list_namespaces() == [("t",)]
    kept = await memories.get(("t",), "default", refresh_ttl=False)
    assert kept is not None
    assert kept.expires_at is not None
    assert kept.expires_at < clock.now + timedelta(minutes=31)
    refreshed = await memories.get(("t",), "default")
    assert refreshed is not None
    assert refreshed.expires_at is not None
    assert refreshed.expires_at >= clock.now + timedelta(minutes=60)
    assert refreshed.updated_at == kept.updated_at  # a refresh is not an update
    stored = await store.get_record("alice", "ltm.default", "t.:default")
    assert stored.expires_at == refreshed.expires_at
    forever = await memories.get(("t",), "forever")
    assert forever is not None
    assert forever.expires_at is None


async def test_search_refreshes_only_what_it_returns(store: Store) -> None:
    clock = Clock(utcnow() - timedelta(minutes=30))
    memories = LongTermStore(store, tenant="alice", default_ttl=60, clock=clock)
    for key in ("a", "b", "c"):
        await memories.put(("t",), key, {"key": key})
    clock.now = utcnow()
    [hit] = await memories.search(("t",), filter={"key": "b"})
    assert hit.expires_at is not None
    assert hit.expires_at >= clock.now + timedelta(minutes=60)
    no_refresh = LongTermStore(store, tenant="alice", refresh_on_read=False, clock=clock)
    for item in await no_refresh.search(("t",)):
        assert item.expires_at is not None
        assert (item.expires_at >= clock.now + timedelta(minutes=60)) == (item.key == "b")


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_semantic_search_ranks_by_cosine_similarity(store: Store, asynchronous: bool) -> None:
    async def aletters(texts: Sequence[str]) -> list[list[float]]:
        return letters(texts)

    embed = aletters if asynchronous else letters
    memories = LongTermStore(store, tenant="alice", embed=embed, fields=["text"], dims=4)
    texts = {"k1": "aaaa", "k2": "abab", "k3": "bbbb", "k4": "cccd"}
    for key, text in texts.items():
        await memories.put(("docs",), key, {"text": text})
    await memories.put(("docs",), "plain", {"text": "aaaa"}, index=False)
    await memories.put(
        ("docs",), "notes", {"text": "dddd", "notes": ["bbbb", "aaab"]}, index=["notes[*]"]
    )

    found = await memories.search(("docs",), query="aaab", limit=10)
    scored = [i for i in found if i.score is not None]
    assert [i.key for i in found[len(scored) :]] == ["plain"]
    assert [i.score for i in scored] == sorted((i.score for i in scored), reverse=True)
    assert scored[0].key == "notes"
    assert scored[0].score == pytest.approx(1.0, abs=1e-6)
    assert [i.key for i in scored[1:]] == ["k1", "k2", "k3", "k4"]
    assert scored[-1].score == pytest.approx(0.0)
    narrowed = await memories.search(("docs",), query="aaab", filter={"text": {"$ne": "aaaa"}})
    assert "k1" not in [i.key for i in narrowed]
    assert narrowed[0].key == "notes"
    assert [i.key for i in await memories.search(("docs",), query="b", limit=2, offset=1)] == [
        i.key for i in (await memories.search(("docs",), query="b", limit=10))[1:3]
    ]


@pytest.mark.parametrize(
    ("namespace", "key"),
    [
        (("..", "x"), "k"),
        (("a.b",), "k"),
        (("a/b",), "k"),
        (("a b",), "k"),
        ((":a",), "k"),
        (("",), "k"),
        ((), "k"),
        ("users", "k"),
        (("users", 1), "k"),
        (("n" * 90,), "k"),
        (("users",), ""),
        (("users",), "a\x00b"),
        (("users",), "k" * 1025),
        (("users",), 7),
    ],
)
async def test_hostile_names_are_refused_and_nothing_is_written(
    store: Store, namespace: object, key: object
) -> None:
    memories = LongTermStore(store, tenant="alice")
    with pytest.raises(InvalidIdError):
        await memories.put(namespace, key, {"v": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        await memories.get(namespace, key)  # type: ignore[arg-type]
    assert await all_records(store) == []


async def test_any_text_is_a_key_and_none_reaches_a_path_or_another_item(
    store: Store, tmp_path: Path
) -> None:
    memories = LongTermStore(store, tenant="alice")
    keys = ["../x", "/notes/todo.md", "a b", "é", ":k", "k" * 1024, "k" * 60, "plain"]
    for n, key in enumerate(keys):
        await memories.put(("files",), key, {"n": n})
    for n, key in enumerate(keys):
        got = await memories.get(("files",), key)
        assert got is not None
        assert (got.key, got.value) == (key, {"n": n})
    found = await memories.search(("files",), limit=100)
    assert sorted(i.key for i in found) == sorted(keys)
    assert await memories.list_namespaces() == [("files",)]
    outside = [p for p in tmp_path.parent.rglob("*") if p.name in ("x", "todo.md")]
    assert outside == []
    assert await memories.delete(("files",), "../x") is True
    assert await memories.get(("files",), "../x") is None


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.put(("a",), "k", ["not", "an", "object"]),
        lambda m: m.put(("a",), "k", {"v": float("nan")}),
        lambda m: m.put(("a",), "k", {"v": 1}, ttl=0),
        lambda m: m.put(("a",), "k", {"v": 1}, ttl=1e12),  # past the year 9999
        lambda m: m.put(("a",), "k", {"v": 1}, ttl=1e308),
        lambda m: m.put(("a",), "k", {"v": 1}, index=["text"]),  # no embedding function
        lambda m: m.search(filter={"v": {"$regex": "x"}}),
        lambda m: m.search(filter={"$or": []}),
        lambda m: m.search(filter={"v": {"$in": 3}}),
        lambda m: m.search(query="needs embed"),
        lambda m: m.search(limit=-1),
        lambda m: m.list_namespaces(max_depth=0),
        lambda m: m.list_namespaces(prefix=("a.b",)),
    ],
)
async def test_bad_input_is_a_typed_error_and_changes_nothing(store: Store, call) -> None:
    memories = LongTermStore(store, tenant="alice")
    with pytest.raises(InvalidInputError):
        await call(memories)
    assert await all_records(store) == []


async def test_a_failing_embedding_function_writes_nothing(store: Store) -> None:
    def broken(texts: Sequence[str]) -> list[list[float]]:
        return [[1.0, 2.0]]  # one vector, whatever the number of texts

    memories = LongTermStore(store, tenant="alice", embed=broken, fields=["a", "b"])
    with pytest.raises(InvalidInputError, match="2 texts"):
        await memories.put(("a",), "k", {"a": "x", "b": "y"})
    assert await all_records(store) == []


async def test_a_corrupt_record_is_reported_and_the_rest_still_served(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    memories = LongTermStore(store, tenant="alice")
    await memories.put(("a",), "good", {"v": 1})
    await store.put_record("alice", "ltm.default", "a.:bad", {"not": "an envelope"})

    with pytest.raises(StoreCorruptError, match=r"a\.:bad"):
        await memories.get(("a",), "bad")
    with caplog.at_level(logging.WARNING, logger="statekeeper.longterm"):
        assert [i.key for i in await memories.search(("a",))] == ["good"]
    assert "a.:bad" in caplog.text


async def test_concurrent_writers_of_one_key_leave_one_whole_item(store: Store) -> None:
    memories = LongTermStore(store, tenant="alice")
    first = await memories.put(("c",), "k", {"writer": -1})
    await asyncio.gather(*(memories.put(("c",), "k", {"writer": n}) for n in range(4)))
    got = await memories.get(("c",), "k")
    assert got is not None
    assert got.value["writer"] in range(4)
    assert got.created_at == first.created_at


async def test_list_namespaces_skips_through_many_small_and_large_namespaces(store: Store) -> None:
    memories = LongTermStore(store, tenant="alice")
    spaces = [("a", f"n{i}") for i in range(24)] + [("a", "n3", "deep", f"d{i}") for i in range(4)]
    spaces += [("b",), ("a",)]
    for i, namespace in enumerate(spaces):
        for k in range(12 if i % 5 == 0 else 1):  # some namespaces hold many items
            await memories.put(namespace, f"k{k}", {"i": i})

    assert await memories.list_namespaces(limit=1000) == sorted(spaces)
    for depth in (1, 2, 3, 4):
        assert await memories.list_namespaces(max_depth=depth, limit=1000) == sorted(
            {ns[:depth] for ns in spaces}
        )
    assert await memories.list_namespaces(suffix=("deep", "*"), limit=1000) == sorted(
        ns for ns in spaces if len(ns) >= 2 and ns[-2] == "deep"
    )
    assert await memories.list_namespaces(prefix=("a", "*", "deep"), max_depth=3) == [
        ("a", "n3", "deep")
    ]
