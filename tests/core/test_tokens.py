"""Token counting: the built-in estimate, pluggable tokenizers and measured counts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.core import tokens as tokens_module
from statekeeper.core.messages import (
    ContentBlock,
    FileBlock,
    ImageBlock,
    Message,
    OtherBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from statekeeper.core.tokens import (
    DEFAULT_COUNTER,
    CallableCounter,
    EstimateCounter,
    TokenCounter,
    counted,
    message_tokens,
)
from statekeeper.errors import InvalidInputError

EST = EstimateCounter()


def test_public_names() -> None:
    assert sorted(tokens_module.__all__) == sorted(
        [
            "DEFAULT_COUNTER",
            "CallableCounter",
            "EstimateCounter",
            "TokenCounter",
            "counted",
            "message_tokens",
        ]
    )


def test_counted_fills_in_the_count_once() -> None:
    message = Message.user("hello world")
    filled = counted(message)
    assert filled.tokens == message_tokens(message)
    assert counted(filled) is filled
    assert filled.model_dump(exclude={"tokens"}) == message.model_dump(exclude={"tokens"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello", 2),  # 5 bytes -> ceil(5/4)
        ("hello world", 3),  # 11 bytes -> 3; 2 words
        ("a b c d e f g h", 8),  # 15 bytes -> 4, but 8 one-letter words
        ("supercalifragilistic", 5),  # one long word: 20 bytes -> 5
        ("1, 2, 3.", 6),  # pieces: 1 , 2 , 3 .
        ("你好世界", 4),  # 12 bytes -> 3, but one piece per ideograph
        ("   ", 1),  # whitespace costs bytes but is no piece
    ],
)
def test_estimate_count_text(text: str, expected: int) -> None:
    assert EST.count_text(text) == expected


def test_estimate_scales_with_bytes_per_token() -> None:
    text = "x" * 40
    assert EstimateCounter(bytes_per_token=4).count_text(text) == 10
    assert EstimateCounter(bytes_per_token=2).count_text(text) == 20


@settings(deadline=None)
@given(st.text(max_size=60), st.text(max_size=60), st.text(max_size=60))
def test_estimate_is_monotonic(a: str, b: str, c: str) -> None:
    # adding text anywhere (at either end or in the middle) never lowers the count
    assert EST.count_text(a) <= EST.count_text(a + b)
    assert EST.count_text(b) <= EST.count_text(a + b)
    assert EST.count_text(a + c) <= EST.count_text(a + b + c)
    assert EST.count_text(a + b) >= 0


@given(st.text(min_size=1, max_size=80))
def test_estimate_never_zero_for_non_empty_text(text: str) -> None:
    assert EST.count_text(text) >= 1


def test_count_message_plain_text_and_name() -> None:
    assert EST.count_message(Message.user("")) == 4
    assert EST.count_message(Message.user("hello world")) == 4 + 3
    assert EST.count_message(Message.user("hello world", name="bob")) == 4 + 3 + 1


def test_count_message_blocks() -> None:
    call = ToolCallBlock(id="c1", name="search", arguments='{"query": "weather"}')
    message = Message.assistant("hi", tool_calls=[call])
    expected = 4 + EST.count_text("hi") + EST.count_text("search") + EST.count_text(call.arguments)
    assert EST.count_message(message) == expected

    result = Message.tool_result("c1", "sunny and warm")
    assert EST.count_message(result) == 4 + EST.count_text("sunny and warm")

    image = Message.user([ImageBlock(url="https://example.com/a.png")])
    assert EST.count_message(image) == 4 + 85
    assert EstimateCounter(image_tokens=500).count_message(image) == 4 + 500

    file = Message.user([FileBlock(name="report.pdf", data="QUJD" * 1000)])
    assert EST.count_message(file) == 4 + EST.count_text("report.pdf")
    assert EST.count_message(Message.user([FileBlock(file_id="f1")])) == 4

    other = OtherBlock(type="reasoning", summary=["thinking hard"])
    compact = json.dumps(other.as_dict(), sort_keys=True, separators=(",", ":"))
    assert EST.count_message(Message.assistant([other])) == 4 + EST.count_text(compact)


def test_count_message_per_message_overhead_is_configurable() -> None:
    assert EstimateCounter(per_message=0).count_message(Message.user("hello")) == 2
    assert EstimateCounter(per_message=10).count_message(Message.user("hello")) == 12


_blocks = st.one_of(
    st.builds(TextBlock, text=st.text(max_size=30)),
    st.builds(ImageBlock, url=st.just("https://example.com/i.png")),
    st.builds(
        ToolCallBlock,
        id=st.just("c1"),
        name=st.text(min_size=1, max_size=10),
        arguments=st.text(max_size=30),
    ),
    st.builds(ToolResultBlock, tool_call_id=st.just("c1"), content=st.text(max_size=30)),
)


@settings(deadline=None)
@given(st.lists(_blocks, max_size=5), _blocks)
def test_more_content_never_fewer_message_tokens(
    blocks: list[ContentBlock], extra: ContentBlock
) -> None:
    smaller = Message.user(list(blocks))
    larger = Message.user([*blocks, extra])
    assert EST.count_message(smaller) <= EST.count_message(larger)


def test_string_content_counts_like_one_text_block() -> None:
    assert EST.count_message(Message.user("some words here")) == EST.count_message(
        Message.user([TextBlock(text="some words here")])
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"bytes_per_token": 0}, {"bytes_per_token": -1.5}, {"per_message": -1}, {"image_tokens": -1}],
)
def test_estimate_rejects_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidInputError):
        EstimateCounter(**kwargs)  # type: ignore[arg-type]


def test_callable_counter_uses_the_function() -> None:
    seen: list[str] = []

    def words(text: str) -> int:
        seen.append(text)
        return len(text.split())

    counter = CallableCounter(words, per_message=3)
    assert counter.count_text("one two three") == 3
    assert counter.count_text("") == 0
    call = ToolCallBlock(id="c1", name="get weather", arguments="city paris")
    message = Message.assistant("a b", tool_calls=[call], name="helper")
    assert counter.count_message(message) == 3 + 1 + 2 + 2 + 2
    assert "city paris" in seen


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_callable_counter_rejects_bad_results(bad: object) -> None:
    counter = CallableCounter(lambda _text: bad)  # type: ignore[arg-type, return-value]
    with pytest.raises(InvalidInputError, match="must return an int"):
        counter.count_text("hello")


def test_callable_counter_needs_a_callable() -> None:
    with pytest.raises(InvalidInputError, match="callable"):
        CallableCounter("not a function")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        CallableCounter(len, per_message=-1)


def test_counters_satisfy_the_protocol() -> None:
    class Fixed:
        def count_text(self, text: str) -> int:
            return 1

        def count_message(self, message: Message) -> int:
            return 7

    assert isinstance(EST, TokenCounter)
    assert isinstance(CallableCounter(len), TokenCounter)
    assert isinstance(Fixed(), TokenCounter)
    assert not isinstance(object(), TokenCounter)
    assert message_tokens(Message.user("hi"), Fixed()) == 7


def test_message_tokens_prefers_the_measured_count() -> None:
    assert message_tokens(Message.user("hello world", tokens=42)) == 42
    assert message_tokens(Message.user("hello world", tokens=0)) == 0
    assert message_tokens(Message.user("hello world", tokens=9), CallableCounter(len)) == 9


def test_message_tokens_counts_when_not_measured() -> None:
    message = Message.user("hello world")
    assert message_tokens(message) == DEFAULT_COUNTER.count_message(message) == 7
    assert message_tokens(message, CallableCounter(len, per_message=0)) == len("hello world")
    assert isinstance(DEFAULT_COUNTER, EstimateCounter)


@given(st.text(max_size=300))
def test_the_fast_piece_count_is_the_full_count(text: str) -> None:
    from statekeeper.core import tokens as t

    if t._HAS_DENSE.search(text) is None:
        assert t._SIMPLE_PIECES.subn("", text)[1] == sum(1 for _ in t._PIECE.finditer(text))


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=300))
def test_the_ascii_piece_count_is_the_full_count(text: str) -> None:
    from statekeeper.core import tokens as t

    assert t._ascii_pieces(text.encode("ascii")) == sum(1 for _ in t._PIECE.finditer(text))
