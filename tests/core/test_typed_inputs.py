"""Bad values given to the public models and the JSON codec raise typed errors.

Each error is an `InvalidPayloadError` (a `StatekeeperError` and a `ValueError`), never
a bare `pydantic.ValidationError`, `RecursionError` or `TypeError`, and its message names
what to change.
"""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper import (
    BudgetFlag,
    ImageBlock,
    InvalidPayloadError,
    IterationFlag,
    Limits,
    Message,
    StatekeeperError,
    TextBlock,
    ToolCallBlock,
)
from statekeeper.jsoncodec import MAX_JSON_DEPTH, encode_json


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_value_nested_thousands_deep_is_refused_naming_the_depth_limit() -> None:
    with pytest.raises(InvalidPayloadError, match=f"limit is {MAX_JSON_DEPTH} levels"):
        encode_json({"v": nested(5000)}, what="record value")


def test_a_value_deeper_than_the_reader_accepts_is_refused_when_written() -> None:
    # Deeper than the limit but shallow enough for json to encode: refused too, or it
    # would be stored and then fail to decode.
    with pytest.raises(InvalidPayloadError, match="flatten"):
        encode_json(nested(MAX_JSON_DEPTH + 1))
    assert encode_json(nested(MAX_JSON_DEPTH - 1)).count("[") == MAX_JSON_DEPTH - 1


def test_a_value_at_the_depth_limit_round_trips() -> None:
    from statekeeper.jsoncodec import decode_json

    value = nested(MAX_JSON_DEPTH - 1)
    assert decode_json(encode_json(value)) == value


@pytest.mark.parametrize("value", [{1: "x"}, {"a": [{"b": {2.5: 1}}]}, {None: 1}, {True: 1}])
def test_a_dict_with_a_non_string_key_is_refused_naming_the_key(value: Any) -> None:
    with pytest.raises(InvalidPayloadError, match="keys must be strings") as caught:
        encode_json(value, what="record value")
    assert "record value" in str(caught.value)


def test_a_circular_value_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidPayloadError):
        encode_json(loop)


def test_message_with_an_unknown_role_is_typed_and_lists_the_roles() -> None:
    with pytest.raises(InvalidPayloadError, match="role") as caught:
        Message(role="wizard")  # type: ignore[arg-type]
    assert isinstance(caught.value, StatekeeperError)
    assert isinstance(caught.value, ValueError)
    assert "'user'" in str(caught.value)
    assert "wizard" in str(caught.value)


def test_message_with_an_empty_id_is_typed() -> None:
    with pytest.raises(InvalidPayloadError, match=r"id.*at least 1 character"):
        Message(role="user", id="")


def test_message_from_dict_and_with_changes_are_typed() -> None:
    with pytest.raises(InvalidPayloadError, match="role"):
        Message.from_dict({"role": "wizard"})
    with pytest.raises(InvalidPayloadError, match="tokens"):
        Message.user("hi").with_changes(tokens=-1)


def test_message_metadata_with_an_integer_key_names_the_key() -> None:
    with pytest.raises(InvalidPayloadError, match=r"key 1 .*must be strings"):
        Message.user("hi", metadata={1: "x"})  # type: ignore[dict-item]


def test_message_metadata_nested_thousands_deep_names_the_limit() -> None:
    with pytest.raises(InvalidPayloadError, match=f"limit is {MAX_JSON_DEPTH} levels"):
        Message.user("hi", metadata={"v": nested(5000)})


def test_blocks_are_typed() -> None:
    with pytest.raises(InvalidPayloadError, match="url or a file_id"):
        ImageBlock()
    with pytest.raises(InvalidPayloadError, match="text"):
        TextBlock(text=None)  # type: ignore[arg-type]


def test_iteration_flag_with_a_negative_current_is_typed() -> None:
    with pytest.raises(InvalidPayloadError, match=r"current.*greater than or equal to 0"):
        IterationFlag(current=-1)


def test_assigning_a_bad_value_to_a_flag_is_typed() -> None:
    flag = BudgetFlag(maximum=5)
    with pytest.raises(InvalidPayloadError, match="maximum"):
        flag.maximum = -1
    assert flag.maximum == 5


def test_limits_with_an_unknown_field_is_typed() -> None:
    with pytest.raises(InvalidPayloadError, match="max_iterations"):
        Limits(max_iterations=-1)  # type: ignore[call-arg]


def test_tool_call_arguments_given_as_a_dict_are_stored_as_json_text() -> None:
    block = ToolCallBlock(id="c1", name="f", arguments={"x": 1})  # type: ignore[arg-type]
    assert block.arguments == '{"x":1}'


@pytest.mark.parametrize("arguments", [b"{}", {"x": object()}, {"x": float("nan")}, 3])
def test_tool_call_arguments_that_are_not_json_are_typed(arguments: Any) -> None:
    with pytest.raises(InvalidPayloadError, match="arguments") as caught:
        ToolCallBlock(id="c1", name="f", arguments=arguments)
    assert "JSON" in str(caught.value)
