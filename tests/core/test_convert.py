"""Conversion to and from OpenAI Chat Completions messages and Responses API items."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.core import convert
from statekeeper.core.convert import (
    from_openai_chat,
    from_openai_responses,
    to_openai_chat,
    to_openai_responses,
)
from statekeeper.core.messages import (
    ContentBlock,
    FileBlock,
    ImageBlock,
    Message,
    MessageCategory,
    OtherBlock,
    Role,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from statekeeper.errors import InvalidPayloadError

# -- strategies -------------------------------------------------------------------------------

_texts = st.text(max_size=20)
_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
_details = st.sampled_from([None, "low", "high", "auto"])
_url_images = st.builds(
    ImageBlock, url=st.builds(lambda i: f"https://example.com/{i}.png", _ids), detail=_details
)
_id_images = st.builds(ImageBlock, file_id=_ids, detail=_details)
_calls = st.builds(
    ToolCallBlock,
    id=_ids,
    name=_ids,
    arguments=st.dictionaries(_ids, st.integers(), max_size=2).map(json.dumps),
)


def _messages(images: st.SearchStrategy[ImageBlock]) -> st.SearchStrategy[list[Message]]:
    text_blocks = st.builds(TextBlock, text=_texts)
    system = st.builds(Message.system, _texts)
    user = st.one_of(
        st.builds(Message.user, _texts),
        st.builds(Message.user, st.lists(st.one_of(text_blocks, images), max_size=3)),
    )
    assistant = st.one_of(
        st.builds(Message.assistant, _texts),
        st.builds(
            lambda text, calls: Message.assistant(text, tool_calls=calls),
            st.one_of(_texts, st.lists(text_blocks, max_size=2)),
            st.lists(_calls, min_size=1, max_size=3),
        ),
    )
    tool = st.builds(Message.tool_result, _ids, _texts, is_error=st.booleans())
    return st.lists(st.one_of(system, user, assistant, tool), max_size=8)


def _view(message: Message) -> tuple[Any, ...]:
    """What a round trip must keep."""
    return (
        message.role,
        message.category,
        message.text,
        [(c.id, c.name, c.arguments) for c in message.tool_calls],
        [(r.tool_call_id, r.content) for r in message.tool_results],
        [(b.url, b.file_id, b.detail) for b in message.blocks if isinstance(b, ImageBlock)],
    )


def _only_calls(message: Message) -> bool:
    return message.role is Role.ASSISTANT and all(
        isinstance(b, ToolCallBlock) for b in message.blocks
    )


def _merged(messages: list[Message]) -> list[Message]:
    """The documented Responses rule: calls-only assistant messages join the one before."""
    out: list[Message] = []
    for message in messages:
        if out and out[-1].role is Role.ASSISTANT and message.tool_calls and _only_calls(message):
            out[-1] = Message.assistant(out[-1].blocks + message.blocks)
        else:
            out.append(message)
    return out


# -- round trips ------------------------------------------------------------------------------


@settings(deadline=None)
@given(_messages(_url_images))
def test_chat_round_trip(messages: list[Message]) -> None:
    items = to_openai_chat(messages)
    json.dumps(items)  # plain JSON data
    back = from_openai_chat(items)
    assert [_view(m) for m in back] == [_view(m) for m in messages]


@settings(deadline=None)
@given(_messages(st.one_of(_url_images, _id_images)))
def test_responses_round_trip(messages: list[Message]) -> None:
    items = to_openai_responses(messages)
    json.dumps(items)
    back = from_openai_responses(items)
    assert [_view(m) for m in back] == [_view(m) for m in _merged(messages)]


@settings(max_examples=50, deadline=None)
@given(_messages(_url_images))
def test_reading_does_not_change_the_items(messages: list[Message]) -> None:
    for to_items, from_items in (
        (to_openai_chat, from_openai_chat),
        (to_openai_responses, from_openai_responses),
    ):
        items = to_items(messages)
        before = copy.deepcopy(items)
        from_items(items)
        assert items == before


def test_public_names() -> None:
    assert sorted(convert.__all__) == [
        "from_openai_chat",
        "from_openai_responses",
        "to_openai_chat",
        "to_openai_responses",
    ]


# -- Chat Completions: shapes -----------------------------------------------------------------

_CALL = ToolCallBlock(id="call_1", name="get_weather", arguments='{"city": "Paris"}')


def test_chat_shapes() -> None:
    messages = [
        Message.system("Be brief."),
        Message.user("Weather?", name="ann"),
        Message.assistant("Checking.", tool_calls=[_CALL]),
        Message.tool_result("call_1", "sunny", is_error=True),
        Message.assistant(tool_calls=[_CALL.model_copy(update={"id": "call_2"})]),
    ]
    assert to_openai_chat(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "name": "ann", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
    ]
    back = from_openai_chat(to_openai_chat(messages))
    assert back[1].name == "ann"
    assert back[3].tool_results[0].is_error is False  # not carried by the format


def test_chat_content_parts() -> None:
    message = Message.user(
        [
            TextBlock(text="look"),
            ImageBlock(url="data:image/png;base64,AAA", detail="high"),
            FileBlock(name="a.pdf", mime_type="application/pdf", data="QUJD"),
            FileBlock(file_id="file-1"),
            OtherBlock(type="input_audio", input_audio={"data": "UklG", "format": "wav"}),
        ]
    )
    [item] = to_openai_chat([message])
    assert item["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA", "detail": "high"}},
        {
            "type": "file",
            "file": {"file_data": "data:application/pdf;base64,QUJD", "filename": "a.pdf"},
        },
        {"type": "file", "file": {"file_id": "file-1"}},
        {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
    ]
    [back] = from_openai_chat([item])
    assert back.content == message.content  # mime type recovered from the data URL


def test_chat_accepts_string_image_url_and_text_parts_in_tool_content() -> None:
    [user, tool] = from_openai_chat(
        [
            {"role": "user", "content": [{"type": "image_url", "image_url": "https://x/i.png"}]},
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "a"}] * 2},
        ]
    )
    assert user.blocks == [ImageBlock(url="https://x/i.png")]
    assert tool.tool_results == [ToolResultBlock(tool_call_id="c", content="a\na")]


def test_chat_reads_developer_role_refusal_and_unknown_parts() -> None:
    [dev, refused, audio] = from_openai_chat(
        [
            {"role": "developer", "content": "rules"},
            {"role": "assistant", "content": None, "refusal": "I can't help with that."},
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]},
        ]
    )
    assert (dev.role, dev.category, dev.text) == (Role.SYSTEM, MessageCategory.SYSTEM, "rules")
    assert refused.blocks == [OtherBlock(type="refusal", refusal="I can't help with that.")]
    assert to_openai_chat([refused])[0]["content"] == [
        {"type": "refusal", "refusal": "I can't help with that."}
    ]
    assert audio.blocks == [OtherBlock(type="input_audio", input_audio={"data": "x"})]


def test_chat_drops_other_blocks_it_cannot_carry() -> None:
    reasoning = OtherBlock(type="reasoning", summary=[])
    items = to_openai_chat(
        [Message.assistant([reasoning]), Message.assistant([reasoning, TextBlock(text="hi")])]
    )
    assert items == [{"role": "assistant", "content": "hi"}]


def test_chat_splits_tool_results_into_one_item_each() -> None:
    two = Message(
        role=Role.TOOL,
        content=[
            ToolResultBlock(tool_call_id="a", content="1"),
            ToolResultBlock(tool_call_id="b", content="2"),
        ],
    )
    anthropic_style = Message.user(
        [ToolResultBlock(tool_call_id="c", content="3"), TextBlock(text="and now?")]
    )
    items = to_openai_chat([two, anthropic_style])
    assert items == [
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "tool", "tool_call_id": "c", "content": "3"},
        {"role": "user", "content": "and now?"},
    ]
    assert [m.role for m in from_openai_chat(items)] == [Role.TOOL] * 3 + [Role.USER]


def test_chat_keeps_other_fields_out_of_the_message() -> None:
    [message] = from_openai_chat([{"role": "user", "content": "hi", "audio": None}])
    assert message.category is MessageCategory.DIALOG
    context = Message.context("docs")
    [back] = from_openai_chat(to_openai_chat([context]))
    assert back.category is MessageCategory.DIALOG  # categories are not carried


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (Message.user([ImageBlock(file_id="file-1")]), "images by URL only"),
        (Message.user([FileBlock(url="https://x/a.pdf")]), "files by file_id or inline data"),
        (Message(role=Role.USER, content=[_CALL]), "cannot hold tool calls"),
        (
            Message(role=Role.SYSTEM, content=[ToolResultBlock(tool_call_id="c", content="")]),
            "cannot hold tool results",
        ),
        (Message(role=Role.TOOL, content="loose text"), "tool result blocks only"),
    ],
)
def test_to_chat_rejects_what_it_cannot_write(message: Message, problem: str) -> None:
    with pytest.raises(InvalidPayloadError, match=rf"^message 1: .*{problem}"):
        to_openai_chat([Message.user("ok"), message])


def test_to_functions_reject_non_messages() -> None:
    for to_items in (to_openai_chat, to_openai_responses):
        with pytest.raises(InvalidPayloadError, match="message 0: expected a Message, got dict"):
            to_items([{"role": "user", "content": "hi"}])  # type: ignore[list-item]


_BAD_CHAT: list[tuple[Any, str]] = [
    ("not a dict", "must be an object"),
    ({"content": "hi"}, "unknown role None"),
    ({"role": "bot", "content": "hi"}, "unknown role 'bot'"),
    ({"role": "tool", "content": "x"}, "tool_call_id"),
    ({"role": "tool", "tool_call_id": "", "content": "x"}, "tool_call_id"),
    ({"role": "tool", "tool_call_id": "c"}, "content must be a string"),
    ({"role": "user"}, "needs content"),
    ({"role": "user", "content": 5}, "content must be a string, a list of parts or null"),
    ({"role": "assistant"}, "needs content or tool_calls"),
    ({"role": "user", "content": "x", "tool_calls": []}, "cannot have tool_calls"),
    ({"role": "user", "content": ["text"]}, "part 0 must be an object"),
    ({"role": "user", "content": [{"text": "x"}]}, "part 0 needs a non-empty string 'type'"),
    ({"role": "user", "content": [{"type": "text"}]}, "part 0 needs a string 'text'"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}, "'url'"),
    ({"role": "user", "content": [{"type": "file"}]}, "file must be an object"),
    ({"role": "user", "content": "x", "name": 3}, "'name'"),
    ({"role": "assistant", "tool_calls": {"id": "c"}}, "tool_calls must be a list"),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}, "tool call 0 needs"),
    ({"role": "assistant", "tool_calls": [{"id": "c"}]}, "tool call 0 function must be"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}, "'name'"),
    (
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 1}}],
        },
        "arguments must be a JSON string",
    ),
    (
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]},
        "only 'function' is supported",
    ),
]


@pytest.mark.parametrize(("item", "problem"), _BAD_CHAT)
def test_from_chat_rejects_malformed_items(item: Any, problem: str) -> None:
    good = {"role": "user", "content": "fine"}
    with pytest.raises(InvalidPayloadError, match=r"^item 2: ") as caught:
        from_openai_chat([good, good, item])
    assert problem in str(caught.value)


@pytest.mark.parametrize("items", [{"role": "user"}, "user", 42])
def test_from_functions_need_a_list(items: Any) -> None:
    for from_items in (from_openai_chat, from_openai_responses):
        with pytest.raises(InvalidPayloadError, match="expected a list of items"):
            from_items(items)


def test_chat_tool_call_arguments_given_as_an_object_become_json_text() -> None:
    [message] = from_openai_chat(
        [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}],
            }
        ]
    )
    assert message.tool_calls == [ToolCallBlock(id="c", name="f", arguments='{"a": 1}')]


# -- Responses API: shapes --------------------------------------------------------------------


def test_responses_shapes() -> None:
    messages = [
        Message.system("Be brief."),
        Message.user([TextBlock(text="What is this?"), ImageBlock(file_id="file-9")]),
        Message.assistant("Checking.", tool_calls=[_CALL]),
        Message.tool_result("call_1", "a cat"),
        Message.assistant("A cat."),
    ]
    assert to_openai_responses(messages) == [
        {
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": "Be brief."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "file_id": "file-9"},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "a cat"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "A cat."}],
        },
    ]


def test_responses_easy_form_and_developer_role() -> None:
    [user, dev] = from_openai_responses(
        [
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "developer", "content": "x"},
        ]
    )
    assert (user.role, user.content) == (Role.USER, "hi")
    assert dev.role is Role.SYSTEM


def test_responses_function_calls_merge_into_the_assistant_message_before_them() -> None:
    def call(call_id: str) -> dict[str, Any]:
        return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}

    messages = from_openai_responses(
        [
            {"role": "user", "content": "go"},
            call("a"),  # after a user message: a new assistant message
            call("b"),  # merges
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            call("c"),  # after a tool output: a new assistant message
            {"role": "assistant", "content": "done"},
            call("d"),  # merges into the text message
        ]
    )
    assert [(m.role, [c.id for c in m.tool_calls]) for m in messages] == [
        (Role.USER, []),
        (Role.ASSISTANT, ["a", "b"]),
        (Role.TOOL, []),
        (Role.ASSISTANT, ["c"]),
        (Role.ASSISTANT, ["d"]),
    ]
    assert messages[-1].text == "done"


def test_responses_other_blocks_pass_through() -> None:
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "hm"}],
    }
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        reasoning,
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
    ]
    messages = from_openai_responses(items)
    assert messages[1].blocks == [
        OtherBlock.model_validate(reasoning),
        ToolCallBlock(id="c", name="f", arguments="{}"),
    ]
    assert messages[2].blocks == [OtherBlock(type="refusal", refusal="no")]
    assert to_openai_responses(messages) == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        *items[1:3],
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
    ]


def test_responses_item_level_block_splits_the_message() -> None:
    message = Message.assistant(
        [TextBlock(text="a"), OtherBlock(type="web_search_call", id="ws"), TextBlock(text="b")]
    )
    assert to_openai_responses([message]) == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "web_search_call", "id": "ws"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
    ]


def test_responses_files_images_and_outputs() -> None:
    items = [
        {
            "role": "user",
            "content": [
                {"type": "input_file", "file_url": "https://x/a.pdf", "filename": "a.pdf"},
                {"type": "input_file", "file_data": "data:text/plain;base64,aGk="},
                {"type": "input_image", "image_url": "https://x/i.png", "detail": "low"},
            ],
        },
        {
            "type": "function_call_output",
            "call_id": "c",
            "output": [{"type": "input_text", "text": "ok"}],
        },
    ]
    user, tool = from_openai_responses(items)
    assert user.blocks == [
        FileBlock(url="https://x/a.pdf", name="a.pdf"),
        FileBlock(data="aGk=", mime_type="text/plain"),
        ImageBlock(url="https://x/i.png", detail="low"),
    ]
    assert tool.tool_results == [ToolResultBlock(tool_call_id="c", content="ok")]
    assert to_openai_responses([user])[0] == {"type": "message", **items[0]}


def test_responses_splits_tool_results_out_of_a_user_message() -> None:
    message = Message.user([ToolResultBlock(tool_call_id="c", content="3"), TextBlock(text="next")])
    assert to_openai_responses([message]) == [
        {"type": "function_call_output", "call_id": "c", "output": "3"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "next"}]},
    ]


_BAD_RESPONSES: list[tuple[Any, str]] = [
    (["a list"], "must be an object"),
    ({"content": "no role or type"}, "missing 'type'"),
    ({"type": 7}, "missing 'type'"),
    ({"type": "message", "role": "tool", "content": "x"}, "unknown role 'tool'"),
    ({"type": "message", "role": "user"}, "needs content"),
    ({"role": "user", "content": [{"text": "x"}]}, "part 0 needs a non-empty string 'type'"),
    ({"role": "user", "content": [{"type": "input_text"}]}, "'text'"),
    ({"role": "user", "content": [3]}, "part 0 must be an object"),
    ({"role": "user", "content": [{"type": "input_image"}]}, "needs an image_url or a file_id"),
    ({"role": "user", "content": [{"type": "input_image", "file_id": 5}]}, "file_id"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "'call_id'"),
    ({"type": "function_call", "call_id": "c", "arguments": "{}"}, "'name'"),
    ({"type": "function_call", "call_id": "c", "name": "f"}, "'arguments'"),
    ({"type": "function_call_output", "output": "x"}, "'call_id'"),
    ({"type": "function_call_output", "call_id": "c"}, "output must be a string"),
    (
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]},
        "'text'",
    ),
]


@pytest.mark.parametrize(("item", "problem"), _BAD_RESPONSES)
def test_from_responses_rejects_malformed_items(item: Any, problem: str) -> None:
    good = {"role": "user", "content": "fine"}
    with pytest.raises(InvalidPayloadError, match=r"^item 1: ") as caught:
        from_openai_responses([good, item])
    assert problem in str(caught.value)


def test_round_trip_blocks_survive_exactly_for_plain_content() -> None:
    blocks: list[ContentBlock] = [TextBlock(text="a"), ImageBlock(url="https://x/i.png")]
    for to_items, from_items in (
        (to_openai_chat, from_openai_chat),
        (to_openai_responses, from_openai_responses),
    ):
        [back] = from_items(to_items([Message.user(blocks)]))
        assert back.blocks == blocks
