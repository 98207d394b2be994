"""The pure rules of the long-term store: filter matching (property tests, and against
LangGraph's own matcher where the two are meant to agree), slots, namespaces, vectors."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from statekeeper.errors import InvalidIdError, InvalidInputError
from statekeeper.ids import validate_id
from statekeeper.longterm import rules

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-50, 50)
    | st.floats(-50, 50)
    | st.text(alphabet="ab$é", max_size=3)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet="ab$é", max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
objects = st.dictionaries(st.sampled_from("abcde"), json_values, max_size=5)
numbers = st.integers(-20, 20) | st.floats(-20, 20)
comparable = st.one_of(numbers, st.text(alphabet="ab$é", max_size=3))
labels = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_:@-]{0,5}", fullmatch=True)
namespaces = st.lists(labels, min_size=1, max_size=4).map(tuple)
keys = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_:@-]{0,8}", fullmatch=True) | st.text(
    alphabet="a./: é", min_size=1, max_size=6
)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(objects)
def test_a_value_matches_a_filter_made_of_its_own_fields(value: dict) -> None:
    assert rules.matches(value, rules.check_filter({f: {"$eq": v} for f, v in value.items()}))
    if "$" not in repr(value):  # a nested "$..." key would read as an operator
        assert rules.matches(value, rules.check_filter(value))
    for field, have in value.items():
        assert rules.matches(value, {field: {"$eq": have}})
        assert rules.matches(value, {field: {"$in": [have]}})
        assert not rules.matches(value, {field: {"$ne": have}})


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(objects, st.sampled_from("abcdef"), json_values, st.lists(json_values, max_size=3))
def test_negated_operators_are_exact_complements(
    value: dict, field: str, want: object, options: list
) -> None:
    eq = rules.matches(value, {field: {"$eq": want}})
    assert rules.matches(value, {field: {"$ne": want}}) is not eq
    assert rules.matches(value, {field: want}) is eq or isinstance(want, dict)
    found = rules.matches(value, {field: {"$in": options}})
    assert rules.matches(value, {field: {"$nin": options}}) is not found
    assert rules.matches(value, {field: {"$in": [want]}}) is eq


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.one_of(
        st.tuples(numbers, numbers),
        st.tuples(st.text(alphabet="ab$é", max_size=3), st.text(alphabet="ab$é", max_size=3)),
    )
)
def test_comparisons_order_numbers_and_strings_like_python(pair: tuple) -> None:
    have, want = pair
    value = {"f": have}
    for op, expected in [
        ("$gt", have > want),
        ("$gte", have >= want),
        ("$lt", have < want),
        ("$lte", have <= want),
    ]:
        assert rules.matches(value, {"f": {op: want}}) is expected
    lt, eq, gt = (rules.matches(value, {"f": {op: want}}) for op in ("$lt", "$eq", "$gt"))
    assert [lt, eq, gt].count(True) == 1


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values, comparable, st.sampled_from(sorted(rules.COMPARISONS)))
def test_a_comparison_never_matches_across_types_or_a_missing_field(
    have: object, want: object, op: str
) -> None:
    numeric = lambda v: isinstance(v, int | float) and not isinstance(v, bool)  # noqa: E731
    assume(not (numeric(have) and numeric(want)))
    assume(not (isinstance(have, str) and isinstance(want, str)))
    assert not rules.matches({"f": have}, {"f": {op: want}})
    assert not rules.matches({}, {"f": {op: want}})


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(objects, objects, objects)
def test_a_filter_is_the_conjunction_of_its_fields(value: dict, left: dict, right: dict) -> None:
    right = {k: v for k, v in right.items() if k not in left}
    both = rules.matches(value, left | right)
    assert both is (rules.matches(value, left) and rules.matches(value, right))


def test_json_equality_keeps_booleans_apart_from_numbers() -> None:
    assert rules.json_equal(1, 1.0)
    assert not rules.json_equal(True, 1)
    assert not rules.json_equal(0, False)
    assert rules.json_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]})
    assert not rules.json_equal({"a": 1}, {"a": 1, "b": 2})
    assert not rules.matches({"f": True}, {"f": {"$gt": 0}})


@pytest.mark.parametrize(
    "bad",
    [
        {"f": {"$regex": "x"}},
        {"$and": []},
        {"f": {"$in": "abc"}},
        {"f": {"$gt": [1]}},
        {"f": {"$gt": None}},
        {"f": {"nested": {"$bogus": 1}}},
        {1: "x"},
        ["f", 1],
    ],
)
def test_bad_filters_are_typed_errors(bad: object) -> None:
    with pytest.raises(InvalidInputError):
        rules.check_filter(bad)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(numbers, numbers, st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]))
def test_operators_agree_with_langgraph_on_numbers(have: float, want: float, op: str) -> None:
    memory = pytest.importorskip("langgraph.store.memory")
    assert rules.matches({"f": have}, {"f": {op: want}}) is memory._compare_values(have, {op: want})


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(objects, objects)
def test_plain_filters_agree_with_langgraph_without_booleans(value: dict, filter: dict) -> None:
    memory = pytest.importorskip("langgraph.store.memory")
    text = repr((value, filter))
    assume("True" not in text and "False" not in text and "$" not in text)
    assert rules.matches(value, filter) is memory._compare_values(value, filter)


# -- slots and namespaces -----------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(namespaces, keys)
def test_a_slot_names_exactly_its_namespace_and_key(namespace: tuple, key: str) -> None:
    text = rules.slot(namespace, key)
    assert validate_id(text) == text
    assert rules.slot_namespace(text) == namespace
    for depth in range(len(namespace) + 1):
        assert text.startswith(rules.scope_prefix(namespace[:depth]))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(namespaces, keys, namespaces, keys)
def test_slots_are_distinct_and_prefixes_follow_labels(
    ns1: tuple, k1: str, ns2: tuple, k2: str
) -> None:
    assert (rules.slot(ns1, k1) == rules.slot(ns2, k2)) is ((ns1, k1) == (ns2, k2))
    under = rules.slot(ns1, k1).startswith(rules.scope_prefix(ns2))
    assert under is (ns1[: len(ns2)] == ns2)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    namespaces,
    st.lists(labels | st.just("*"), max_size=3).map(tuple),
    st.lists(labels | st.just("*"), max_size=3).map(tuple),
)
def test_namespace_matching_agrees_with_langgraph(ns: tuple, prefix: tuple, suffix: tuple) -> None:
    base = pytest.importorskip("langgraph.store.base")
    memory = pytest.importorskip("langgraph.store.memory")
    conditions = [base.MatchCondition("prefix", prefix), base.MatchCondition("suffix", suffix)]
    expected = all(memory._does_match(c, ns) for c in conditions)
    assert rules.match_namespace(ns, prefix, suffix) is expected


@pytest.mark.parametrize("label", ["..", "../x", "a.b", "a/b", ":a", "", " a", "a b", "*", 3])
def test_hostile_labels_are_refused(label: object) -> None:
    with pytest.raises(InvalidIdError):
        rules.check_namespace(("ok", label))


def test_wildcards_only_where_patterns_are_allowed() -> None:
    assert rules.check_namespace(("*", "a"), wildcard=True) == ("*", "a")
    with pytest.raises(InvalidIdError):
        rules.check_namespace(("a*",), wildcard=True)


def test_a_namespace_too_long_for_an_address_is_refused_and_long_keys_are_digested() -> None:
    with pytest.raises(InvalidIdError, match="limit is 85"):
        rules.slot(("a" * 43, "b" * 42), "k")
    assert len(rules.slot(("a" * 42, "b" * 42), "k" * 1000)) == 128
    assert rules.slot(("a",), "k" * 125) == "a.:" + "k" * 125
    assert rules.slot(("a",), "k" * 126).startswith("a.::")


# -- field paths and vectors --------------------------------------------------------------


def test_texts_at_follows_names_indexes_and_wildcards() -> None:
    value = {"text": "t", "notes": [{"body": "n1"}, {"body": "n2"}, {}], "n": 3, "none": None}
    assert rules.texts_at(value, "text") == ["t"]
    assert rules.texts_at(value, "notes[*].body") == ["n1", "n2"]
    assert rules.texts_at(value, "notes[1].body") == ["n2"]
    assert rules.texts_at(value, "notes[-1].body") == []
    assert rules.texts_at(value, "notes[-2].body") == ["n2"]
    assert rules.texts_at(value, "notes[7].body") == []
    assert rules.texts_at(value, "n") == ["3"]
    assert rules.texts_at(value, "none") == []
    assert rules.texts_at(value, "missing.deeper") == []
    assert rules.texts_at({"b": 1, "a": "x"}, "$") == ['{"a": "x", "b": 1}']
    for bad in ("", "a..b", "a[x]", "a]"):
        with pytest.raises(InvalidInputError):
            rules.texts_at(value, bad)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=1, max_size=16))
def test_packed_vectors_are_unit_length_and_self_similar(vector: list[float]) -> None:
    packed = rules.unpack_vector(rules.pack_vector(vector))
    norm = math.sqrt(sum(x * x for x in vector))
    assume(norm > 1e-3)
    assert math.sqrt(sum(x * x for x in packed)) == pytest.approx(1.0, abs=1e-5)
    assert rules.cosine(rules.unit(vector), packed) == pytest.approx(1.0, abs=1e-5)
    assert rules.cosine(
        rules.unit(vector), rules.unpack_vector(rules.pack_vector([-x for x in vector]))
    ) == pytest.approx(-1.0, abs=1e-5)
    assert rules.cosine([1.0], packed) is None or len(vector) == 1


def test_a_dict_inside_a_list_matches_the_fields_it_names() -> None:
    assert rules.matches({"a": [{}]}, {"a": [{"": None}]})  # a missing field is None
    assert rules.matches({"a": [{"x": 1, "y": 2}]}, {"a": [{"x": 1}]})
    assert not rules.matches({"a": [{"x": 1}]}, {"a": [{"x": 2}]})
    assert not rules.matches({"a": [{"x": 1}, {}]}, {"a": [{"x": 1}]})
