"""Filters run in SQL give the Python rules' answers (`rules.matches` is the reference).

The SQL condition is a prefilter: it must keep every record the rules match (no false
negatives, on random values and filters), and the long-term store's answer after its
re-check must equal the rules' answer. Namespace listing by key heads is checked
against the walk that lists records.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper import open_store
from statekeeper.jsoncodec import encode_json
from statekeeper.longterm import LongTermStore, rules
from statekeeper.longterm.reading import Reader, record_query
from statekeeper.stores import Store
from statekeeper.stores.base import WrappingStore
from statekeeper.stores.record_query import RecordQuery, ValueTest, queryable
from statekeeper.stores.sqlite.record_sql import guarded, json_path, query_condition
from statekeeper.testing.damage import can_damage, damage_record

FIELDS = ["a", "b", "a.b", "é", "", 'q"', "x\\y", "t\n"]
texts = st.text(alphabet=["a", "b", "é", "😀", "\x00", '"', "\\", "\n", "Z", " "], max_size=4)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([2**53, 2**53 + 1, 2**63 - 1, 2**63 + 5, -(2**64), 10**30])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.1, -0.0, 1e-320, 2.0**53, 9.223372036854776e18, 1e300, 3.0])
    | texts
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS), inner),
    max_leaves=6,
)
items = st.dictionaries(st.sampled_from(FIELDS), values, max_size=4)
operators = st.sampled_from(sorted(rules.OPERATORS))


@st.composite
def conditions(draw: st.DrawFn, depth: int = 0) -> object:
    kind = draw(st.sampled_from(["value", "ops", "nested"] if depth < 2 else ["value", "ops"]))
    if kind == "value":
        return draw(values)
    if kind == "nested":
        return draw(st.dictionaries(st.sampled_from(FIELDS), conditions(depth + 1), max_size=2))
    ops = {}
    for op in draw(st.lists(operators, min_size=1, max_size=2, unique=True)):
        if op in ("$in", "$nin"):
            ops[op] = draw(st.lists(scalars | values, max_size=3))
        elif op in rules.COMPARISONS:
            ops[op] = draw(st.integers(-3, 3) | st.floats(-1e20, 1e20) | texts)
        else:
            ops[op] = draw(values)
    return ops


filters = st.dictionaries(st.sampled_from(FIELDS), conditions(), max_size=3)


def envelope(value: dict) -> str:
    return encode_json({"key": "k", "value": value, "created_at": "x", "updated_at": "x"})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(items | values, min_size=1, max_size=8), filters)
def test_the_sql_prefilter_keeps_every_record_the_rules_match(rows: list, filter: dict) -> None:
    checked = rules.check_filter(filter)
    condition, params = query_condition(record_query(checked))
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE records (key TEXT, value TEXT)")
    db.executemany(
        "INSERT INTO records VALUES (?, ?)", [(f"k{i}", envelope(v)) for i, v in enumerate(rows)]
    )
    kept = {k for (k,) in db.execute(f"SELECT key FROM records WHERE {condition}", params)}
    wanted = {f"k{i}" for i, v in enumerate(rows) if rules.matches(v, checked)}
    assert wanted <= kept
    assert {f"k{i}" for i, v in enumerate(rows) if not isinstance(v, dict)} <= kept  # reported


def test_the_prefilter_is_exact_on_plain_filters_without_strict_bounds() -> None:
    rows = [{"n": n, "kind": n % 3, "s": f"t{n}", "f": n % 2 == 0} for n in range(30)]
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE records (key TEXT, value TEXT)")
    db.executemany(
        "INSERT INTO records VALUES (?, ?)", [(f"k{i}", envelope(v)) for i, v in enumerate(rows)]
    )
    for filter in (
        {"kind": 1},
        {"n": {"$gte": 10, "$lte": 20}},
        {"s": {"$in": ["t1", "t2"]}, "f": True},
        {"kind": {"$ne": 2}, "n": {"$nin": [1, 4]}},
        {"s": {"$gte": "t5"}},
        {"missing": None},
    ):
        condition, params = query_condition(record_query(filter))
        kept = {k for (k,) in db.execute(f"SELECT key FROM records WHERE {condition}", params)}
        assert kept == {f"k{i}" for i, v in enumerate(rows) if rules.matches(v, filter)}, filter


def test_records_that_are_not_json_or_not_items_are_always_kept() -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE records (key TEXT, value TEXT)")
    db.executemany(
        "INSERT INTO records VALUES (?, ?)",
        [("bad", "{not json"), ("list", "[1]"), ("novalue", json.dumps({"x": 1}))],
    )
    for filter in ({"n": 1}, {"n": {"$gt": "a"}}, {"n": {"$ne": "a"}}, {"n": None}):
        condition, params = query_condition(record_query(filter))
        with pytest.raises(sqlite3.OperationalError, match="malformed JSON"):
            db.execute(f"SELECT key FROM records WHERE {condition}", params).fetchall()
        where = guarded(condition)
        kept = {k for (k,) in db.execute(f"SELECT key FROM records WHERE {where}", params)}
        assert kept == {"bad", "list", "novalue"}


def test_labels_sqlite_cannot_address_leave_their_test_to_python() -> None:
    assert json_path(("value", 'q"')) is None
    assert json_path(("value", "a.b")) == '$."value"."a.b"'
    query = RecordQuery(("value",), (ValueTest(('q"',), "eq", 1),))
    assert query_condition(query) == ("1", [])


async def test_wrapped_stores_do_not_offer_their_inner_queries(tmp_path: Path) -> None:
    class Wrapped(WrappingStore):  # as sealed and traced stores: lookups pass through
        def __init__(self, store: Store) -> None:
            self.wrapped = store

    async with open_store(f"sqlite:///{tmp_path}/q.db") as store:
        assert queryable(store) is store
        assert Wrapped(store).query_records is not None  # reachable, yet not offered
        assert queryable(Wrapped(store)) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(items, min_size=1, max_size=6), filters)
def test_search_on_sqlite_equals_the_rules(tmp_path_factory, rows: list, filter: dict) -> None:
    import asyncio

    folder = tmp_path_factory.mktemp("pushdown")

    async def run() -> None:
        async with open_store(f"sqlite:///{folder}/s.db?durability=process") as store:
            memories = LongTermStore(store, tenant="t")
            for i, value in enumerate(rows):
                await memories.put(("ns", f"n{i % 2}"), f"k{i}", value)
            found = await memories.search(("ns",), filter=filter, limit=100)
            expected = sorted(
                (("ns", f"n{i % 2}"), f"k{i}")
                for i, v in enumerate(rows)
                if rules.matches(v, filter)
            )
            assert [(f.namespace, f.key) for f in found] == expected

    asyncio.run(run())


@pytest.mark.parametrize("cut", [None, 1, 2])
async def test_key_heads_list_the_namespaces_the_walk_lists(
    tmp_path: Path, cut: int | None
) -> None:
    spaces = [("a", f"n{i}") for i in range(5)] + [("a", "0x", "deep"), ("a",), ("b", "c")]
    async with open_store(f"sqlite:///{tmp_path}/h.db?durability=process") as store:
        memories = LongTermStore(store, tenant="t")
        for namespace in spaces:
            for k in range(3):
                await memories.put(namespace, f"k{k}", {"k": k})
        reader = Reader(store, "t", "ltm.default")

        def keep(ns: tuple[str, ...]) -> tuple[str, ...]:
            return ns if cut is None else ns[:cut]

        for scope in ("", "a."):
            fast = await reader.namespaces(scope, keep)
            walked = await reader._walk_namespaces(scope, keep)
            assert fast == walked
        assert await reader.namespaces("", keep) == {keep(ns) for ns in spaces}


async def test_a_record_that_is_not_json_is_reported_by_filtered_and_semantic_search(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        return [[float(t.count(c)) for c in "ab"] for t in texts]

    async with open_store(f"sqlite:///{tmp_path}/d.db?durability=process") as store:
        memories = LongTermStore(store, tenant="t", embed=embed)
        await memories.put(("a",), "good", {"v": 1, "text": "ab"})
        await memories.put(("a",), "bad", {"v": 1, "text": "ab"})
    with sqlite3.connect(tmp_path / "d.db") as db:
        db.execute("UPDATE records SET value = '{cut' WHERE key = 'a.:bad'")
    async with open_store(f"sqlite:///{tmp_path}/d.db?durability=process") as store:
        memories = LongTermStore(store, tenant="t", embed=embed)
        with caplog.at_level(logging.WARNING, logger="statekeeper.longterm"):
            assert [i.key for i in await memories.search(("a",), filter={"v": 1})] == ["good"]
            assert "a.:bad" in caplog.text
            caplog.clear()
            found = await memories.search(("a",), filter={"v": 1}, limit=1)  # stops at good
            assert [i.key for i in found] == ["good"]
            assert "a.:bad" in caplog.text
            caplog.clear()
            found = await memories.search(("a",), filter={"v": 1}, query="ab")
            assert [i.key for i in found] == ["good"]
            assert "a.:bad" in caplog.text


def counts(texts: list[str]) -> list[list[float]]:
    return [[float(t.count(c)) for c in "abc"] for t in texts]


async def test_semantic_search_sees_every_write_since_its_vectors_were_held(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/v.db?durability=process"
    async with open_store(url) as store, open_store(url) as other_process:
        memories = LongTermStore(store, tenant="t", embed=counts, fields=("text",))
        writer = LongTermStore(other_process, tenant="t", embed=counts, fields=("text",))
        for i in range(100):  # the first search reads every vector at once
            await memories.put(("n", f"s{i % 3}"), f"k{i}", {"text": "c", "i": i})
        await memories.put(("n", "s0"), "a-ish", {"text": "aab"})
        assert [i.key for i in await memories.search(("n",), query="a", limit=1)] == ["a-ish"]

        await writer.put(("n", "s1"), "k1", {"text": "aaaa"})  # a write it did not make
        assert [i.key for i in await memories.search(("n",), query="a", limit=2)] == [
            "k1",
            "a-ish",
        ]
        await writer.delete(("n", "s1"), "k1")
        await memories.put(("n", "s0"), "a-ish", {"text": "ccc"})
        found = await memories.search(("n",), query="a", limit=3)
        assert "k1" not in [i.key for i in found]
        assert all(i.score == 0.0 for i in found)
        assert len(await memories.search(("n",), query="a", limit=1000)) == 100
        assert [i.key for i in await memories.search(("n",), query="c", filter={"i": 7})] == ["k7"]


async def test_semantic_search_is_the_same_when_the_held_vectors_overflow(tmp_path: Path) -> None:
    async with open_store(f"sqlite:///{tmp_path}/o.db?durability=process") as store:
        memories = LongTermStore(store, tenant="t", embed=counts, fields=("text",))
        for i in range(90):
            await memories.put(("n",), f"k{i:02}", {"text": "abc"[i % 3] * (i % 7 + 1)})
        expected = [(i.key, i.score) for i in await memories.search(query="ab", limit=90)]
        assert memories._reader.cache is not None
        memories._reader.cache.limit = 40  # numbers: about 13 items' vectors
        for change in range(3):
            assert [(i.key, i.score) for i in await memories.search(query="ab", limit=90)] == (
                expected
            )
            await memories.put(("n",), f"k{change:02}", {"text": "abc"[change % 3]})
            expected = [
                (i.key, i.score)
                for i in await LongTermStore(
                    store, tenant="t", embed=counts, fields=("text",)
                ).search(query="ab", limit=90)
            ]


async def test_a_namespace_holding_only_records_that_are_not_json_is_not_listed(
    tmp_path: Path,
) -> None:
    async with open_store(f"sqlite:///{tmp_path}/n.db?durability=process") as store:
        memories = LongTermStore(store, tenant="t")
        await memories.put(("a",), "k", {"v": 1})
        await memories.put(("b",), "k", {"v": 1})
        await memories.put(("c",), "k1", {"v": 1})
        await memories.put(("c",), "k2", {"v": 1})
    with sqlite3.connect(tmp_path / "n.db") as db:
        db.execute("UPDATE records SET value = '{cut' WHERE key IN ('b.:k', 'c.:k1')")
    async with open_store(f"sqlite:///{tmp_path}/n.db?durability=process") as store:
        memories = LongTermStore(store, tenant="t")
        reader = Reader(store, "t", "ltm.default")
        assert await memories.list_namespaces() == [("a",), ("c",)]  # as a listing shows it
        assert await reader._walk_namespaces("", lambda ns: ns) == {("a",), ("c",)}


async def test_namespace_listing_by_the_store_equals_the_walk_on_every_backend(
    store: Store,
) -> None:
    memories = LongTermStore(store, tenant="t")
    spaces = [("a", f"n{i}") for i in range(6)] + [("a", "0x", "deep"), ("a",), ("b", "c")]
    for namespace in spaces:
        for k in range(3):
            await memories.put(namespace, f"k{k}", {"k": k})
    await memories.put(("d",), "only", {"k": 0})
    if can_damage(store):
        await damage_record(store, "t", "ltm.default", "a.n1.:k0")  # first of three
        await damage_record(store, "t", "ltm.default", "d.:only")  # its only record
    reader = Reader(store, "t", "ltm.default")
    if type(store).__module__.split(".")[2] in ("sqlite", "postgres"):
        assert reader.heads is not None  # listed by the store itself
    for cut in (None, 1, 2):

        def keep(ns: tuple[str, ...], cut: int | None = cut) -> tuple[str, ...]:
            return ns if cut is None else ns[:cut]

        for scope in ("", "a."):
            assert await reader.namespaces(scope, keep) == await reader._walk_namespaces(
                scope, keep
            )
    listed = set(await memories.list_namespaces(limit=100))
    assert ("a", "n1") in listed
    assert (("d",) in listed) is not can_damage(store)
