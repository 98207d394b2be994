"""Building the context window: priorities, budget, order and tool-call integrity."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.core import context as context_module
from statekeeper.core.context import ELIDED_PLACEHOLDER, ContextWindow, build_context_window
from statekeeper.core.messages import (
    ContentBlock,
    Message,
    MessageCategory,
    Role,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from statekeeper.core.tokens import CallableCounter, EstimateCounter, message_tokens
from statekeeper.errors import InvalidInputError

# Every example message states its size, so budgets are easy to read.


def sys(text: str = "rules", tokens: int = 10, **kw: Any) -> Message:
    return Message.system(text, tokens=tokens, **kw)


def user(text: str = "hi", tokens: int = 10, **kw: Any) -> Message:
    return Message.user(text, tokens=tokens, **kw)


def ctx(text: str = "docs", tokens: int = 10, **kw: Any) -> Message:
    return Message.context(text, tokens=tokens, **kw)


def call(*ids: str, tokens: int = 10, **kw: Any) -> Message:
    calls = [ToolCallBlock(id=i, name="tool") for i in ids]
    return Message.assistant("", tool_calls=calls, tokens=tokens, **kw)


def result(call_id: str, output: str = "output", tokens: int | None = 10, **kw: Any) -> Message:
    return Message.tool_result(call_id, output, tokens=tokens, **kw)


def ids(window: ContextWindow) -> list[str]:
    return [m.id for m in window.messages]


def test_public_names() -> None:
    assert set(context_module.__all__) == {
        "ELIDED_PLACEHOLDER",
        "ContextWindow",
        "build_context_window",
    }


def test_everything_fits() -> None:
    messages = [sys(id="s"), ctx(id="c"), user(id="u"), call("x", id="a"), result("x", id="r")]
    window = build_context_window(messages, 50)
    assert window == ContextWindow(
        messages=messages, tokens=50, dropped=[], elided=[], over_budget=False
    )


def test_empty_input() -> None:
    assert build_context_window([], 0) == ContextWindow([], 0, [], [], False)


def test_system_messages_are_kept_even_over_budget() -> None:
    messages = [sys(id="s1", tokens=30), user(id="u"), sys(id="s2", tokens=30)]
    window = build_context_window(messages, 40)
    assert ids(window) == ["s1", "s2"]
    assert window.dropped == ["u"]
    assert (window.tokens, window.over_budget) == (60, True)
    assert build_context_window(messages, 0).over_budget is True


def test_categories_in_priority_order() -> None:
    output = Message.user("log", tokens=10, category=MessageCategory.SYSTEM_OUTPUT, id="o")
    messages = [sys(id="s"), ctx(id="c"), user(id="u"), output]
    assert ids(build_context_window(messages, 40)) == ["s", "c", "u", "o"]
    assert ids(build_context_window(messages, 30)) == ["s", "c", "u"]
    assert ids(build_context_window(messages, 20)) == ["s", "c"]
    assert ids(build_context_window(messages, 10)) == ["s"]


def test_newest_dialog_is_kept_first() -> None:
    messages = [user(id=f"u{i}") for i in range(5)]
    window = build_context_window(messages, 30)
    assert ids(window) == ["u2", "u3", "u4"]
    assert window.dropped == ["u0", "u1"]


def test_dialog_stops_at_the_first_message_that_does_not_fit() -> None:
    messages = [user(id="old", tokens=1), user(id="big", tokens=50), user(id="new")]
    assert ids(build_context_window(messages, 20)) == ["new"]


def test_context_and_output_skip_what_does_not_fit() -> None:
    big_ctx, small_ctx = ctx(id="c_old", tokens=5), ctx(id="c_big", tokens=50)
    assert ids(build_context_window([big_ctx, small_ctx], 20)) == ["c_old"]
    out = MessageCategory.SYSTEM_OUTPUT
    old = Message.user("a", tokens=5, category=out, id="o_old")
    big = Message.user("b", tokens=50, category=out, id="o_big")
    assert ids(build_context_window([old, big], 20)) == ["o_old"]


def test_context_newest_first() -> None:
    messages = [ctx(id="c1"), ctx(id="c2"), ctx(id="c3")]
    assert ids(build_context_window(messages, 20)) == ["c2", "c3"]


def test_reserve_shrinks_the_usable_budget() -> None:
    messages = [user(id="u1"), user(id="u2")]
    assert ids(build_context_window(messages, 20)) == ["u1", "u2"]
    window = build_context_window(messages, 20, reserve=5)
    assert (ids(window), window.tokens) == (["u2"], 10)
    assert build_context_window([sys()], 20, reserve=15).over_budget is True


def test_counts_with_the_counter_unless_a_message_has_tokens() -> None:
    counter = CallableCounter(len, per_message=0)
    measured = Message.user("x" * 100, tokens=1, id="m")
    counted = Message.user("y" * 10, id="c")
    window = build_context_window([counted, measured], 11, counter=counter)
    assert (ids(window), window.tokens) == (["c", "m"], 11)
    assert ids(build_context_window([counted, measured], 10, counter=counter)) == ["m"]
    # default counter: the built-in estimate
    plain = Message.user("hello world")
    assert build_context_window([plain], 100).tokens == EstimateCounter().count_message(plain)


def test_large_tool_output_is_elided_when_its_call_is_kept() -> None:
    messages = [
        user(id="u"),
        call("x", id="a"),
        result("x", "x" * 400, tokens=None, is_error=True, id="r"),
        user(id="u2"),
    ]
    window = build_context_window(messages, 45)
    assert ids(window) == ["u", "a", "r", "u2"]
    assert window.elided == ["r"]
    elided = window.messages[2]
    assert elided.content == [
        ToolResultBlock(tool_call_id="x", content=ELIDED_PLACEHOLDER, is_error=True)
    ]
    assert elided.tokens is None
    assert elided.category is MessageCategory.SYSTEM_OUTPUT
    assert window.tokens == sum(message_tokens(m) for m in window.messages) <= 45


def test_elided_output_is_restored_when_it_fits() -> None:
    messages = [call("x", id="a"), result("x", "x" * 100, tokens=None, id="r")]
    full = message_tokens(messages[1])
    window = build_context_window(messages, 10 + full)
    assert (window.elided, window.messages) == ([], messages)


def test_custom_placeholder() -> None:
    messages = [call("x"), result("x", "x" * 400, tokens=None)]
    window = build_context_window(messages, 30, placeholder="[cut]")
    assert window.messages[1].text == "[cut]"


def test_short_output_is_never_elided() -> None:
    messages = [call("x", id="a"), result("x", "ok", tokens=None, id="r")]
    window = build_context_window(messages, 10 + message_tokens(messages[1]))
    assert (ids(window), window.elided) == (["a", "r"], [])


def test_dropped_call_drops_its_results() -> None:
    # the dialog stops at "big", so the older call is dropped; its result (and the call with
    # it) would still fit, but a dropped dialog message never comes back with a tool output
    messages = [call("x", id="a"), result("x", tokens=1, id="r"), user(id="big", tokens=50)]
    messages.append(user(id="u"))
    window = build_context_window(messages, 30)
    assert ids(window) == ["u"]
    assert window.dropped == ["a", "r", "big"]


def test_results_without_their_call_are_dropped() -> None:
    messages = [user(id="u"), result("missing", id="r")]
    window = build_context_window(messages, 1000)
    assert (ids(window), window.dropped) == (["u"], ["r"])


def test_a_kept_result_brings_its_call() -> None:
    dialog_result = result("x", id="r", category=MessageCategory.DIALOG)
    messages = [call("x", id="a"), user(id="u", tokens=1), dialog_result]
    window = build_context_window(messages, 20)
    assert ids(window) == ["a", "r"]  # "u" no longer fits: dialog stops there


def test_parallel_calls_keep_every_result() -> None:
    messages = [call("x", "y", id="a"), result("x", id="rx"), result("y", id="ry"), user(id="u")]
    window = build_context_window(messages, 40)
    assert ids(window) == ["a", "rx", "ry", "u"]
    # too small for the call and both results: the call and its results go together
    window = build_context_window(messages, 25)
    assert (ids(window), window.dropped) == (["u"], ["a", "rx", "ry"])


def test_a_call_whose_result_cannot_be_kept_is_dropped() -> None:
    both = Message(
        role=Role.TOOL,
        content=[
            ToolResultBlock(tool_call_id="x", content="ok"),
            ToolResultBlock(tool_call_id="ghost", content="?"),
        ],
        tokens=5,
        id="r",
    )
    window = build_context_window([call("x", id="a"), both, user(id="u")], 1000)
    assert (ids(window), window.dropped) == (["u"], ["a", "r"])


def test_system_tool_call_forces_its_results() -> None:
    messages = [
        call("x", id="a", category=MessageCategory.SYSTEM),
        result("x", "x" * 400, tokens=None, id="r"),
    ]
    window = build_context_window(messages, 5)
    assert ids(window) == ["a", "r"]
    assert window.elided == ["r"]
    assert window.over_budget is True


def test_returns_new_objects_and_leaves_input_alone() -> None:
    messages = [user("a", id="u"), call("x", id="c"), result("x", "x" * 400, tokens=None)]
    before = [m.model_dump() for m in messages]
    window = build_context_window(messages, 40)
    assert all(out is not m for out in window.messages for m in messages)
    assert isinstance(window.messages[1].content, list)
    window.messages[1].content.append(TextBlock(text="changed"))
    assert [m.model_dump() for m in messages] == before


@pytest.mark.parametrize(
    ("budget", "reserve", "problem"),
    [
        (-1, 0, "budget"),
        (10, -1, "reserve"),
        (10, 11, "larger than the budget"),
        (True, 0, "budget"),
    ],
)
def test_rejects_bad_budgets(budget: int, reserve: int, problem: str) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        build_context_window([user()], budget, reserve=reserve)


def test_rejects_non_messages() -> None:
    with pytest.raises(InvalidInputError, match="message 1 is a dict"):
        build_context_window([user(), {"role": "user"}], 10)  # type: ignore[list-item]


# -- properties -------------------------------------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Conversations with tool calls, results (some orphaned), categories and sizes."""
    messages: list[Message] = []
    call_ids: list[str] = []
    for index in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["system", "context", "user", "say", "call", "result", "mix"]))
        text = draw(st.text(alphabet="ab .", max_size=120))
        fields: dict[str, Any] = {"id": f"m{index}", "tokens": draw(st.none() | st.integers(0, 60))}
        if kind == "system":
            messages.append(Message.system(text, **fields))
        elif kind == "context":
            messages.append(Message.context(text, **fields))
        elif kind == "user":
            messages.append(Message.user(text, **fields))
        elif kind == "say":
            messages.append(Message.assistant(text, **fields))
        elif kind == "call":
            new = [f"c{index}_{k}" for k in range(draw(st.integers(1, 3)))]
            call_ids.extend(new)
            calls = [ToolCallBlock(id=i, name="tool", arguments=text or "{}") for i in new]
            messages.append(Message.assistant(text, tool_calls=calls, **fields))
        else:
            targets = draw(st.lists(st.sampled_from([*call_ids, "ghost"]), min_size=1, max_size=2))
            blocks: list[ContentBlock] = [
                ToolResultBlock(tool_call_id=t, content=text, is_error=draw(st.booleans()))
                for t in targets
            ]
            if kind == "mix":  # a user message carrying results, as Anthropic does
                messages.append(Message.user([*blocks, TextBlock(text="next")], **fields))
            else:
                category = draw(st.sampled_from([None, MessageCategory.DIALOG]))
                messages.append(
                    Message(role=Role.TOOL, content=blocks, category=category, **fields)
                )
    return messages


def _check_window(messages: list[Message], window: ContextWindow, usable: int) -> None:
    by_id = {m.id: m for m in messages}
    order = [m.id for m in messages]
    kept = ids(window)
    # a subsequence of the input, in its order, and a partition with the dropped ids
    assert [i for i in order if i in set(kept)] == kept
    assert sorted(kept + window.dropped) == sorted(order)
    assert [i for i in order if i in set(window.dropped)] == window.dropped
    assert set(window.elided) <= set(kept)
    # every SYSTEM message is kept
    assert {m.id for m in messages if m.category is MessageCategory.SYSTEM} <= set(kept)
    # unchanged, or elided to placeholder results with the same call ids and error flags
    for out in window.messages:
        original = by_id[out.id]
        if out.id in window.elided:
            assert out.content == [
                r.model_copy(update={"content": ELIDED_PLACEHOLDER}) for r in original.tool_results
            ]
            assert (out.role, out.category) == (original.role, original.category)
            assert message_tokens(out) < message_tokens(original)
        else:
            assert out == original
    # the budget
    assert window.tokens == sum(message_tokens(m) for m in window.messages)
    assert window.over_budget == (window.tokens > usable)
    if window.over_budget:
        assert all(m.category is MessageCategory.SYSTEM for m in window.messages)
    # tool-call integrity
    kept_calls = {c.id for m in window.messages for c in m.tool_calls}
    kept_results = {r.tool_call_id for m in window.messages for r in m.tool_results}
    assert kept_results <= kept_calls
    for m in messages:
        if {r.tool_call_id for r in m.tool_results} & kept_calls:
            assert m.id in kept


@settings(deadline=None)
@given(conversations(), st.integers(0, 400), st.data())
def test_window_properties(messages: list[Message], budget: int, data: st.DataObject) -> None:
    reserve = data.draw(st.integers(0, budget))
    before = [m.model_dump() for m in messages]
    window = build_context_window(messages, budget, reserve=reserve)
    assert [m.model_dump() for m in messages] == before
    _check_window(messages, window, budget - reserve)


@settings(deadline=None)
@given(conversations())
def test_nothing_is_lost_when_everything_fits(messages: list[Message]) -> None:
    calls = {c.id for m in messages for c in m.tool_calls}
    orphans = any(r.tool_call_id not in calls for m in messages for r in m.tool_results)
    total = sum(message_tokens(m) for m in messages)
    window = build_context_window(messages, total)
    if not orphans:
        assert window == ContextWindow(messages, total, [], [], False)
    else:
        assert window.dropped  # results without their call are never sent
        _check_window(messages, window, total)
