"""Stored ADK events are read back without validation (`_rebuild`), and exactly as
validation would read them: the same classes, values, field order and set fields.

Every event here is stored the way the service stores it (`encode_event`, then JSON),
read back by `decode_event`, and compared, node by node, with what
``Event.model_validate_json`` makes of the same text (ADK's own SQLite service reads
events that way) and with the event that was stored.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from adk_app import make_runner, send
from adk_events import BASE, event, full_event
from google.adk.events import Event, EventActions
from google.adk.events.event import NodeInfo
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types
from pydantic import BaseModel

from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.integrations.adk._codec import EVENT_KIND, decode_event, encode_event
from statekeeper.integrations.adk._rebuild import Unsupported, builder
from statekeeper.stores import Store
from statekeeper.stores.base import Entry


def stored(e: Event) -> dict[str, Any]:
    """The payload a store gives back for ``e``: its dump, through JSON text."""
    return json.loads(json.dumps(encode_event(e)))


def entry(payload: dict[str, Any]) -> Entry:
    return Entry(1, "ev:x", None, EVENT_KIND, datetime.now(UTC), payload)


def same(a: Any, b: Any, where: str = "event") -> None:
    """``a`` and ``b`` are the same tree: same types at every node (an enum member is not
    its string, 1.0 is not 1), same keys in the same order, same set fields."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, BaseModel):
        assert list(a.__dict__) == list(b.__dict__), where
        assert a.model_fields_set == b.model_fields_set, where
        assert a.__pydantic_extra__ == b.__pydantic_extra__, where
        assert a.__pydantic_private__ == b.__pydantic_private__, where
        for name, value in a.__dict__.items():
            same(value, b.__dict__[name], f"{where}.{name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key, value in a.items():
            same(value, b[key], f"{where}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for n, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{n}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def call_event() -> Event:
    """A model turn as Gemini's thinking models produce it: a thought, a function call
    carrying a thought signature (bytes), usage and a finish reason."""
    call = types.FunctionCall(id="c1", name="lookup", args={"q": "ü", "n": [1, 2.5, None]})
    return Event(
        invocation_id="inv-1",
        author="agent",
        content=types.Content(
            role="model",
            parts=[
                types.Part(text="let me look", thought=True),
                types.Part(function_call=call, thought_signature=b"\x00\x01sig\xff\xfe"),
            ],
        ),
        finish_reason=types.FinishReason.STOP,
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=10, candidates_token_count=4, total_token_count=14
        ),
        long_running_tool_ids={"c1", "c0"},
        model_version="gemini-x",
        branch="root.agent",
    )


def response_event() -> Event:
    response = types.FunctionResponse(id="c1", name="lookup", response={"rows": [{"a": None}]})
    return Event(
        invocation_id="inv-1",
        author="agent",
        content=types.Content(role="user", parts=[types.Part(function_response=response)]),
        actions=EventActions(
            state_delta={"k": [1, {"x": None}], "app:a": 1.5, "user:u": "ü", "temp:t": 0},
            artifact_delta={"report.txt": 2},
            skip_summarization=True,
            transfer_to_agent="other",
            escalate=False,
            requested_tool_confirmations={"c1": ToolConfirmation(hint="sure?", payload={"n": 1})},
            end_of_agent=True,
            agent_state={"step": 3},
            route=["a", 1, True],
        ),
        node_info=NodeInfo(path="wf/A@1", output_for=["wf"], message_as_output=True),
        output={"result": [1, "two", None]},
        custom_metadata={"trace": {"id": "t-1"}, "none": None},
    )


def media_event() -> Event:
    blob = types.Blob(mime_type="image/png", data=b"\x89PNG\x00\xff" * 3)
    return Event(
        author="user",
        invocation_id="inv-2",
        content=types.Content(role="user", parts=[types.Part(inline_data=blob)]),
        timestamp=1700000000,  # an int given: validation keeps a float
    )


def error_event() -> Event:
    return Event(author="agent", invocation_id="", error_code="E1", error_message="boom")


COMMON = {
    "plain": lambda: event(1, delta={"n": 1}),
    "function call": call_event,
    "function response and actions": response_event,
    "inline data": media_event,
    "error": error_event,
    "empty": lambda: Event(author="user"),
}


@pytest.mark.parametrize("make", COMMON.values(), ids=COMMON.keys())
def test_common_events_are_rebuilt_exactly_without_validation(make: Any) -> None:
    original = make()
    payload = stored(original)
    rebuilt = builder(Event)(stored(original))  # no Unsupported: the fast path serves it
    validated = Event.model_validate_json(json.dumps(payload))
    same(rebuilt, validated)
    assert rebuilt == original
    assert rebuilt.model_dump(mode="json") == original.model_dump(mode="json")


def test_an_event_with_every_field_reads_as_validation_reads_it() -> None:
    # Some of its models (CacheMetadata, CitationMetadata) have validators `_rebuild`
    # does not know, so this one is validated: still the same event.
    payload = stored(full_event())
    with pytest.raises(Unsupported):
        builder(Event)(stored(full_event()))
    same(decode_event(entry(payload)), Event.model_validate_json(json.dumps(payload)))


ODD = {
    "a camelCase key": {"author": "a", "invocationId": "i"},
    "an unknown key": {"author": "a", "mood": "sunny"},
    "a string timestamp": {"author": "a", "timestamp": "12"},
    "an int where a str goes": {"author": 7},
    "a float where an int goes": {
        "author": "a",
        "usage_metadata": {"prompt_token_count": 3.0},
    },
    "an enum value of another case": {"author": "a", "finish_reason": "stop"},
    "a None in a part": {"author": "a", "content": {"parts": [{"text": None}]}},
    "a part key of another model": {"author": "a", "content": {"parts": [{"path": "x"}]}},
    "auth configs": {
        "author": "a",
        "actions": {
            "requested_auth_configs": {
                "c": {"auth_scheme": {"type": "http"}, "credential_key": "k"}
            }
        },
    },
}


@pytest.mark.parametrize("payload", ODD.values(), ids=ODD.keys())
def test_shapes_it_does_not_know_are_validated_instead(payload: dict[str, Any]) -> None:
    payload = {"id": "e1", "timestamp": BASE, **payload}  # nothing left to chance
    with pytest.raises(Unsupported):
        builder(Event)(json.loads(json.dumps(payload)))
    got = decode_event(entry(json.loads(json.dumps(payload))))
    try:
        expected = Event.model_validate_json(json.dumps(payload))
    except ValueError:
        assert got.error_code == "STATEKEEPER_UNREADABLE_ENTRY"
    else:
        same(got, expected)


async def test_a_runners_events_read_back_exactly(store: Store) -> None:
    # What a real Runner appends (user message, function call, function response with a
    # state delta in every scope, reply), read back through the service.
    service = StatekeeperSessionService(store, tenant="acme")
    runner = make_runner(service)
    await service.create_session(app_name="notes", user_id="ada", session_id="s")
    await send(runner, "s", "remember apples")
    await send(runner, "s", "remember pears")
    got = await service.get_session(app_name="notes", user_id="ada", session_id="s")
    assert got is not None
    assert len(got.events) == 8
    for e in got.events:
        payload = stored(e)
        same(builder(Event)(stored(e)), Event.model_validate_json(json.dumps(payload)))
    assert any(e.actions.state_delta for e in got.events)
    assert any(e.get_function_calls() for e in got.events)


async def test_events_read_twice_share_nothing(store: Store) -> None:
    service = StatekeeperSessionService(store, tenant="acme")
    session = await service.create_session(app_name="a", user_id="u", session_id="s")
    await service.append_event(session, response_event())
    first = await service.get_session(app_name="a", user_id="u", session_id="s")
    assert first is not None
    first.events[0].actions.state_delta["k"].append("changed")
    assert first.events[0].content is not None
    assert first.events[0].content.parts
    first.events[0].content.parts[0].function_response.response["rows"].clear()  # type: ignore[union-attr]
    second = await service.get_session(app_name="a", user_id="u", session_id="s")
    assert second is not None
    assert second.events[0] == session.events[0]


def test_timestamps_are_floats_even_when_stored_as_integers() -> None:
    rebuilt = builder(Event)({"author": "a", "timestamp": int(BASE)})
    assert type(rebuilt.timestamp) is float
    assert rebuilt.timestamp == BASE
