"""Conversion between statekeeper messages and OpenAI message shapes. Pure: no I/O.

Chat Completions ``messages``: `to_openai_chat` / `from_openai_chat`. Responses API input
items: `to_openai_responses` / `from_openai_responses`. Malformed input raises
`InvalidPayloadError` naming the index of the bad item (or message) and the problem.

A round trip ``from_x(to_x(messages))`` keeps role, text, images, files, tool calls (id,
name, arguments) and tool results (call id, content). Lost in both formats:

* ``id``, ``created_at``, ``metadata`` and ``tokens`` (read messages get new ones);
* ``category``: it comes back as the role's default (a CONTEXT message returns as DIALOG);
* a tool result's ``is_error`` (neither format has a field for it);
* the ``developer`` role (read as ``system``), and item fields with no place in a
  `Message` (``id`` and ``status`` of Responses items, ``audio`` of chat messages ...);
* grouping: each tool result becomes one item and comes back as one tool message; tool
  results inside a user message are written as tool items just before it; in an assistant
  message, tool calls come after its other content.

Chat Completions keeps the message ``name``; it cannot send images by ``file_id`` or files
by URL only (`InvalidPayloadError`), keeps a file's ``mime_type`` only with inline data,
and drops `OtherBlock` s other than the chat part types ``input_audio`` and ``refusal``
(a message left empty by that is omitted).

Responses loses ``name``. `OtherBlock` s always pass through: part types (``input_*``,
``output_*``, ``refusal``) inside the message, any other type (``reasoning``,
``item_reference`` ...) as a top-level item, read back as an assistant message of its own
(function calls right after it join it).
A ``function_call`` item merges into the message read just before it when that is an
assistant message, else starts a new assistant message; so an assistant message of tool
calls only, directly after another assistant message, comes back merged into it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from statekeeper.core.messages import (
    ContentBlock,
    FileBlock,
    ImageBlock,
    Message,
    OtherBlock,
    Role,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from statekeeper.core.typed import explain
from statekeeper.errors import InvalidPayloadError

__all__ = ["from_openai_chat", "from_openai_responses", "to_openai_chat", "to_openai_responses"]

_ROLES = {
    "system": Role.SYSTEM,
    "developer": Role.SYSTEM,
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
}
_CHAT_OTHER_PARTS = frozenset({"input_audio", "refusal"})
_Item = dict[str, Any]
_Plain = TextBlock | ImageBlock | FileBlock | OtherBlock
_T = TypeVar("_T")


class _Bad(Exception):
    """A problem in one item; re-raised as `InvalidPayloadError` with the item's index."""


def _run(kind: str, values: object, step: Callable[[Any, list[_T]], object]) -> list[_T]:
    """Apply ``step`` to each value, naming the index of a bad one in the error."""
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Sequence):
        raise InvalidPayloadError(f"expected a list of {kind}s, got {type(values).__name__}")
    out: list[_T] = []
    for index, value in enumerate(values):
        try:
            step(value, out)
        except (_Bad, ValidationError, InvalidPayloadError) as exc:
            cause = exc.__cause__ if isinstance(exc, InvalidPayloadError) else exc
            detail = explain(cause) if isinstance(cause, ValidationError) else str(exc)
            raise InvalidPayloadError(f"{kind} {index}: {detail}") from None
    return out


def _obj(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Bad(f"{where} must be an object, got {type(value).__name__}")
    return value


def _str(
    data: Mapping[str, Any], key: str, where: str, *, required: bool = True, empty: bool = False
) -> str | None:
    """``data[key]`` checked to be a string (non-empty unless ``empty``); None if optional."""
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not empty and not value):
        got = "missing" if value is None else repr(value)[:60]
        raise _Bad(f"{where} needs a{'' if empty else ' non-empty'} string {key!r} ({got})")
    return value


def _role(value: object) -> Role:
    if not isinstance(value, str) or value not in _ROLES:
        raise _Bad(f"unknown role {value!r}; expected one of {', '.join(_ROLES)}")
    return _ROLES[value]


def _file_data(block: FileBlock) -> str | None:
    if block.data is None or block.mime_type is None or block.data.startswith("data:"):
        return block.data
    return f"data:{block.mime_type};base64,{block.data}"


def _file_block(name: object, file_id: object, data: object, url: object) -> FileBlock:
    mime: str | None = None
    if isinstance(data, str) and data.startswith("data:") and ";base64," in data:
        head, _, data = data.partition(";base64,")
        mime = head.removeprefix("data:") or None
    return FileBlock.model_validate(
        {"name": name, "file_id": file_id, "data": data, "url": url, "mime_type": mime}
    )


def _without_none(**fields: Any) -> _Item:
    return {key: value for key, value in fields.items() if value is not None}


def _split(message: object) -> tuple[Message, list[_Plain], list[ToolCallBlock]]:
    """Check the message and return it with its plain blocks and its tool calls."""
    if not isinstance(message, Message):
        raise _Bad(f"expected a Message, got {type(message).__name__}")
    calls = message.tool_calls
    if calls and message.role is not Role.ASSISTANT:
        raise _Bad(f"a {message.role.value} message cannot hold tool calls (assistant only)")
    if message.tool_results and message.role not in (Role.TOOL, Role.USER):
        raise _Bad(f"a {message.role.value} message cannot hold tool results (tool or user only)")
    plain = [b for b in message.blocks if not isinstance(b, ToolCallBlock | ToolResultBlock)]
    if message.role is Role.TOOL and (plain or not message.tool_results):
        raise _Bad("a tool message must hold tool result blocks only (each gives its call id)")
    return message, plain, calls


# -- Chat Completions -----------------------------------------------------------------------


def _chat_part(block: _Plain) -> _Item | None:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageBlock):
        if block.url is None:
            raise _Bad("Chat Completions takes images by URL only (a data: URL works)")
        return {"type": "image_url", "image_url": _without_none(url=block.url, detail=block.detail)}
    if isinstance(block, FileBlock):
        file = _without_none(
            file_id=block.file_id, file_data=_file_data(block), filename=block.name
        )
        if "file_id" not in file and "file_data" not in file:
            raise _Bad("Chat Completions takes files by file_id or inline data only")
        return {"type": "file", "file": file}
    if isinstance(block, OtherBlock) and block.type in _CHAT_OTHER_PARTS:
        return block.as_dict()
    return None  # another OtherBlock: Chat Completions has no place for it


def _to_chat(message: object) -> list[_Item]:
    message, plain, calls = _split(message)
    out: list[_Item] = [
        {"role": "tool", "tool_call_id": r.tool_call_id, "content": r.content}
        for r in message.tool_results
    ]
    if message.role is Role.TOOL:
        return out
    parts = [part for part in map(_chat_part, plain) if part is not None]
    if (plain or out) and not parts and not calls:
        return out  # everything it held was dropped or written as tool items
    item: _Item = {"role": message.role.value}
    if message.name:
        item["name"] = message.name
    content: str | list[_Item] | None
    if isinstance(message.content, str):
        content = message.content
    elif len(parts) == 1 and parts[0]["type"] == "text":
        content = parts[0]["text"]
    else:
        content = parts or ""
    if calls:
        item["content"] = content or None
        item["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    else:
        item["content"] = content
    out.append(item)
    return out


def to_openai_chat(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as Chat Completions ``messages`` (see the module docstring for what is lost)."""
    return _run("message", messages, lambda message, out: out.extend(_to_chat(message)))


def _from_chat_part(value: object, where: str) -> ContentBlock:
    part = _obj(value, where)
    kind = part.get("type")
    if kind == "text":
        return TextBlock(text=_str(part, "text", where, empty=True) or "")
    if kind == "image_url":
        image = part.get("image_url")
        if isinstance(image, str):
            return ImageBlock(url=image)
        image = _obj(image, f"{where} image_url")
        return ImageBlock(
            url=_str(image, "url", f"{where} image_url"),
            detail=_str(image, "detail", where, required=False),
        )
    if kind == "file":
        file = _obj(part.get("file"), f"{where} file")
        return _file_block(file.get("filename"), file.get("file_id"), file.get("file_data"), None)
    _str(part, "type", where)
    return OtherBlock.model_validate(dict(part))


def _tool_call(value: object, where: str) -> ToolCallBlock:
    call = _obj(value, where)
    if call.get("type", "function") != "function":
        raise _Bad(f"{where} has type {call.get('type')!r}; only 'function' is supported")
    function = _obj(call.get("function"), f"{where} function")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, Mapping):
        arguments = json.dumps(arguments)
    if not isinstance(arguments, str):
        raise _Bad(f"{where} arguments must be a JSON string")
    return ToolCallBlock(
        id=_str(call, "id", where) or "",
        name=_str(function, "name", f"{where} function") or "",
        arguments=arguments,
    )


def _tool_message(call_id: str, output: object, where: str) -> Message:
    """A tool message; ``output`` is a string or a list of text parts (joined by newlines)."""
    if isinstance(output, list):
        texts = [
            _str(_obj(p, f"{where} part {j}"), "text", where, empty=True) or ""
            for j, p in enumerate(output)
        ]
        output = "\n".join(texts)
    if not isinstance(output, str):
        raise _Bad(f"{where} must be a string or a list of text parts")
    return Message(role=Role.TOOL, content=[ToolResultBlock(tool_call_id=call_id, content=output)])


def _from_chat(value: object) -> Message:
    item = _obj(value, "the item")
    if item.get("role") == "tool":
        call_id = _str(item, "tool_call_id", "a tool message") or ""
        return _tool_message(call_id, item.get("content"), "content")
    role = _role(item.get("role"))
    raw = item.get("content")
    extra: list[ContentBlock] = []
    if role is Role.ASSISTANT:
        raw_calls = item.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise _Bad("tool_calls must be a list")
        extra = [_tool_call(c, f"tool call {j}") for j, c in enumerate(raw_calls)]
        refusal = item.get("refusal")
        if isinstance(refusal, str) and refusal:
            extra.insert(0, OtherBlock(type="refusal", refusal=refusal))
        if raw is None and not extra:
            raise _Bad("an assistant message needs content or tool_calls")
    elif item.get("tool_calls") is not None:
        raise _Bad(f"a {item['role']} message cannot have tool_calls")
    elif "content" not in item:
        raise _Bad(f"a {item['role']} message needs content")
    content: str | list[ContentBlock]
    if isinstance(raw, str) and not extra:
        content = raw
    elif isinstance(raw, str) or raw is None:
        content = [*([TextBlock(text=raw)] if raw else []), *extra]
    elif isinstance(raw, list):
        content = [_from_chat_part(p, f"part {j}") for j, p in enumerate(raw)] + extra
    else:
        raise _Bad("content must be a string, a list of parts or null")
    name = _str(item, "name", "the item", required=False)
    return Message(role=role, content=content, name=name or None)


def from_openai_chat(items: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Chat Completions ``messages`` as statekeeper messages (one per item)."""
    return _run("item", items, lambda item, out: out.append(_from_chat(item)))


# -- Responses API --------------------------------------------------------------------------


def _is_part_type(kind: str) -> bool:
    return kind.startswith(("input_", "output_")) or kind == "refusal"


def _responses_part(block: _Plain, text_type: str) -> _Item:
    if isinstance(block, TextBlock):
        return {"type": text_type, "text": block.text}
    if isinstance(block, ImageBlock):
        fields = _without_none(image_url=block.url, file_id=block.file_id, detail=block.detail)
        return {"type": "input_image", **fields}
    if isinstance(block, FileBlock):
        fields = _without_none(
            file_id=block.file_id,
            file_data=_file_data(block),
            file_url=block.url,
            filename=block.name,
        )
        return {"type": "input_file", **fields}
    return block.as_dict()


def _to_responses(message: object) -> list[_Item]:
    message, plain, calls = _split(message)
    out: list[_Item] = [
        {"type": "function_call_output", "call_id": r.tool_call_id, "output": r.content}
        for r in message.tool_results
    ]
    if message.role is Role.TOOL:
        return out
    role = message.role.value
    text_type = "output_text" if message.role is Role.ASSISTANT else "input_text"
    parts: list[_Item] = []
    if isinstance(message.content, str):
        parts.append({"type": text_type, "text": message.content})
        plain = []
    for block in plain:
        if isinstance(block, OtherBlock) and not _is_part_type(block.type):
            if parts:  # an item-level block ends the message written so far
                out.append({"type": "message", "role": role, "content": parts})
                parts = []
            out.append(block.as_dict())
        else:
            parts.append(_responses_part(block, text_type))
    if parts or not (calls or out):
        out.append({"type": "message", "role": role, "content": parts})
    out.extend(
        {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
        for c in calls
    )
    return out


def to_openai_responses(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as Responses API input items (see the module docstring for what is lost)."""
    return _run("message", messages, lambda message, out: out.extend(_to_responses(message)))


def _from_responses_part(value: object, where: str) -> ContentBlock:
    part = _obj(value, where)
    kind = _str(part, "type", where)
    if kind in ("input_text", "output_text", "text"):
        return TextBlock(text=_str(part, "text", where, empty=True) or "")
    if kind == "input_image":
        url = part.get("image_url")
        if isinstance(url, Mapping):
            url = url.get("url")
        if url is None and part.get("file_id") is None:
            raise _Bad(f"{where} needs an image_url or a file_id")
        return ImageBlock.model_validate(
            {"url": url, "file_id": part.get("file_id"), "detail": part.get("detail")}
        )
    if kind == "input_file":
        return _file_block(
            part.get("filename"),
            part.get("file_id"),
            part.get("file_data"),
            part.get("file_url"),
        )
    return OtherBlock.model_validate(dict(part))


def _from_responses_message(item: Mapping[str, Any]) -> Message:
    role = _role(item.get("role"))
    raw = item.get("content")
    if isinstance(raw, str):
        return Message(role=role, content=raw)
    if not isinstance(raw, list):
        raise _Bad("a message item needs content: a string or a list of parts")
    return Message(
        role=role, content=[_from_responses_part(p, f"part {j}") for j, p in enumerate(raw)]
    )


def _from_responses(value: object, out: list[Message]) -> None:
    item = _obj(value, "the item")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        out.append(_from_responses_message(item))
    elif kind == "function_call":
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            raise _Bad("a function_call needs a string 'arguments' (JSON text)")
        call = ToolCallBlock(
            id=_str(item, "call_id", "a function_call") or "",
            name=_str(item, "name", "a function_call") or "",
            arguments=arguments,
        )
        if out and out[-1].role is Role.ASSISTANT:
            out[-1] = out[-1].model_copy(update={"content": [*out[-1].blocks, call]})
        else:
            out.append(Message(role=Role.ASSISTANT, content=[call]))
    elif kind == "function_call_output":
        call_id = _str(item, "call_id", "a function_call_output") or ""
        out.append(_tool_message(call_id, item.get("output"), "output"))
    elif isinstance(kind, str) and kind:
        out.append(Message(role=Role.ASSISTANT, content=[OtherBlock.model_validate(dict(item))]))
    else:
        raise _Bad("missing 'type' (or 'role' for a message)")


def from_openai_responses(items: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Responses API input items as statekeeper messages (see the module docstring)."""
    return _run("item", items, _from_responses)
