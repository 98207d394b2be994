"""Messages, content blocks and message categories. Pure data, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from statekeeper.core.typed import TypedModel
from statekeeper.ids import new_id
from statekeeper.jsoncodec import encode_json

__all__ = [
    "ContentBlock",
    "FileBlock",
    "ImageBlock",
    "Message",
    "MessageCategory",
    "OtherBlock",
    "Role",
    "TextBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "default_category",
    "stored_message",
    "utcnow",
]


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


class Role(StrEnum):
    """Who speaks a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class MessageCategory(IntEnum):
    """How important a message is when the context window must shrink.

    Lower values are more important: SYSTEM is never dropped, SYSTEM_OUTPUT goes first.
    """

    SYSTEM = 1
    CONTEXT = 2
    DIALOG = 3
    SYSTEM_OUTPUT = 4


_FROZEN = ConfigDict(frozen=True, extra="forbid")
_M = TypeVar("_M", bound=BaseModel)


class TextBlock(TypedModel):
    """Plain text."""

    model_config = _FROZEN
    type: Literal["text"] = "text"
    text: str


class ImageBlock(TypedModel):
    """An image, by URL (including ``data:`` URLs) or by provider file id."""

    model_config = _FROZEN
    type: Literal["image"] = "image"
    url: str | None = None
    file_id: str | None = None
    detail: str | None = None

    @model_validator(mode="after")
    def _has_source(self) -> ImageBlock:
        if self.url is None and self.file_id is None:
            raise ValueError("an image block needs a url or a file_id")
        return self


class ToolCallBlock(TypedModel):
    """A request from the model to call a tool. ``arguments`` is the JSON text the model sent.

    Text is kept verbatim (even malformed JSON: it is what the model said); a dict or list
    is encoded to JSON text; anything else raises `InvalidPayloadError`.
    """

    model_config = _FROZEN
    type: Literal["tool_call"] = "tool_call"
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_as_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, dict | list):
            return encode_json(value, what="tool call arguments")
        raise ValueError(
            f"tool call arguments must be JSON text or a dict, not {type(value).__name__}"
        )


class ToolResultBlock(TypedModel):
    """The result of a tool call, linked to the call by ``tool_call_id``."""

    model_config = _FROZEN
    type: Literal["tool_result"] = "tool_result"
    tool_call_id: str = Field(min_length=1)
    content: str
    is_error: bool = False


class FileBlock(TypedModel):
    """An attached file, by URL, inline base64 data or provider file id."""

    model_config = _FROZEN
    type: Literal["file"] = "file"
    name: str | None = None
    mime_type: str | None = None
    url: str | None = None
    data: str | None = None
    file_id: str | None = None


class OtherBlock(TypedModel):
    """Any adapter-specific block (audio, reasoning, citations ...), kept as JSON."""

    model_config = ConfigDict(frozen=True, extra="allow")
    type: str

    @field_validator("type")
    @classmethod
    def _not_a_known_type(cls, value: str) -> str:
        if value in _KNOWN:
            raise ValueError(f"a {value!r} block must use its own block type, not OtherBlock")
        return value

    def as_dict(self) -> dict[str, Any]:
        """The block as the JSON object it came from."""
        return self.model_dump(mode="json")


_KNOWN = frozenset({"text", "image", "tool_call", "tool_result", "file"})


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in _KNOWN else "other"


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ToolCallBlock, Tag("tool_call")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[FileBlock, Tag("file")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_tag),
]
"""One part of a message's content."""

_DEFAULT_CATEGORY = {
    Role.SYSTEM: MessageCategory.SYSTEM,
    Role.USER: MessageCategory.DIALOG,
    Role.ASSISTANT: MessageCategory.DIALOG,
    Role.TOOL: MessageCategory.SYSTEM_OUTPUT,
}


def default_category(role: Role | str) -> MessageCategory:
    """The category a message of ``role`` gets when none is given."""
    if type(role) is Role:  # the usual call: no enum lookup (a Python-level call)
        return _DEFAULT_CATEGORY.get(role, MessageCategory.DIALOG)
    return _DEFAULT_CATEGORY.get(Role(role), MessageCategory.DIALOG)


class Message(TypedModel):
    """One message of a conversation. Immutable: changes make new instances.

    ``content`` is either a string or a list of blocks. ``category`` defaults from the
    role (system -> SYSTEM, tool -> SYSTEM_OUTPUT, otherwise DIALOG). ``tokens`` is the
    token count if it was measured, else None.
    """

    model_config = _FROZEN

    role: Role
    content: str | list[ContentBlock] = ""
    category: MessageCategory = Field(default=None, validate_default=True)  # from the role
    id: str = Field(default_factory=lambda: new_id("msg"), min_length=1, max_length=128)
    created_at: datetime = Field(default_factory=utcnow)
    name: str | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    tokens: int | None = Field(default=None, ge=0)

    @field_validator("category", mode="before")
    @classmethod
    def _category_by_name(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            # The role is absent when it was invalid; its own error says so.
            return _DEFAULT_CATEGORY.get(info.data.get("role", Role.USER), MessageCategory.DIALOG)
        if isinstance(value, str):
            try:
                return MessageCategory[value.upper()]
            except KeyError:
                raise ValueError(
                    f"unknown category {value!r}; use one of "
                    + ", ".join(c.name for c in MessageCategory)
                ) from None
        return value

    # -- constructors -------------------------------------------------------------------

    @classmethod
    def system(cls, text: str, **fields: Any) -> Message:
        """A system instruction (category SYSTEM)."""
        if not fields and type(text) is str:
            return _plain_text(cls, Role.SYSTEM, text)
        return cls(role=Role.SYSTEM, content=text, **fields)

    @classmethod
    def user(cls, content: str | list[ContentBlock], **fields: Any) -> Message:
        """A user message (category DIALOG)."""
        if not fields and type(content) is str:
            return _plain_text(cls, Role.USER, content)
        return cls(role=Role.USER, content=content, **fields)

    @classmethod
    def assistant(
        cls,
        content: str | list[ContentBlock] = "",
        *,
        tool_calls: list[ToolCallBlock] | None = None,
        **fields: Any,
    ) -> Message:
        """An assistant message, optionally with tool calls after its text."""
        blocks: list[ContentBlock] = []
        if tool_calls:
            if isinstance(content, str):
                blocks = [TextBlock(text=content)] if content else []
            else:
                blocks = list(content)
            blocks.extend(tool_calls)
            return cls(role=Role.ASSISTANT, content=blocks, **fields)
        if not fields and type(content) is str:
            return _plain_text(cls, Role.ASSISTANT, content)
        return cls(role=Role.ASSISTANT, content=content, **fields)

    @classmethod
    def tool_result(
        cls, tool_call_id: str, output: str, *, is_error: bool = False, **fields: Any
    ) -> Message:
        """The result of one tool call (category SYSTEM_OUTPUT)."""
        block = ToolResultBlock(tool_call_id=tool_call_id, content=output, is_error=is_error)
        return cls(role=Role.TOOL, content=[block], **fields)

    @classmethod
    def context(cls, text: str, **fields: Any) -> Message:
        """Reference material the model should keep seeing (category CONTEXT)."""
        return cls(role=Role.USER, content=text, category=MessageCategory.CONTEXT, **fields)

    # -- views --------------------------------------------------------------------------

    @property
    def blocks(self) -> list[ContentBlock]:
        """The content as a list of blocks (a string becomes one text block)."""
        if isinstance(self.content, str):
            return [TextBlock(text=self.content)] if self.content else []
        return list(self.content)

    @property
    def text(self) -> str:
        """The text of the message: its text blocks (and tool results) joined."""
        if isinstance(self.content, str):
            return self.content
        parts: list[str] = []
        for block in self.content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                parts.append(block.content)
        return "\n".join(parts)

    @property
    def tool_calls(self) -> list[ToolCallBlock]:
        """The tool calls this message makes."""
        return [b for b in self.blocks if isinstance(b, ToolCallBlock)]

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        """The tool results this message carries."""
        return [b for b in self.blocks if isinstance(b, ToolResultBlock)]

    def with_changes(self, **changes: Any) -> Message:
        """A validated copy with some fields replaced.

        A new ``content`` clears the token count unless ``tokens`` is given too.
        """
        data = self.model_dump()
        if "content" in changes and "tokens" not in changes:
            data["tokens"] = None
        data.update(changes)
        return Message.model_validate(data)

    def to_dict(self) -> dict[str, Any]:
        """The message as plain JSON data."""
        return self.model_dump(mode="json", exclude_defaults=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        """Validate a message from plain JSON data."""
        return cls.model_validate(data)


_ROLE_AND_CATEGORY = {role.value: (role, _DEFAULT_CATEGORY[role]) for role in Role}
_CATEGORIES = {category.value: category for category in MessageCategory}
_STORED_KEYS = frozenset({"role", "content", "category", "name", "metadata", "tokens"})
_FIELDS_SET = frozenset(
    {"role", "content", "category", "id", "created_at", "name", "metadata", "tokens"}
)
_new = object.__new__
# BaseModel's own slots, set the way pydantic-core sets them on a validated instance.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _trusted(cls: type[_M], fields: dict[str, Any], names: frozenset[str]) -> _M:
    """An instance of ``cls`` holding ``fields`` (checked by the caller), not validated."""
    model = _new(cls)
    _set_dict(model, fields)
    _set_fields_set(model, set(names))
    _set_extra(model, None)
    _set_private(model, None)
    return model


_ROLE_AND_CONTENT = frozenset({"role", "content"})


def _plain_text(cls: type[_M], role: Role, text: str) -> _M:
    """``cls(role=role, content=text)`` without validating again what is known valid: a
    str is valid content, and the rest are the defaults (every message a chat agent
    appends is built here; validation costs a fifth of an append)."""
    fields = {
        "role": role,
        "content": text,
        "category": _DEFAULT_CATEGORY[role],
        "id": new_id("msg"),
        "created_at": utcnow(),
        "name": None,
        "metadata": {},
        "tokens": None,
    }
    return _trusted(cls, fields, _ROLE_AND_CONTENT)


_TEXT_KEYS = frozenset({"type", "text"})
_CALL_KEYS = frozenset({"type", "id", "name", "arguments"})
_RESULT_KEYS = frozenset({"type", "tool_call_id", "content", "is_error"})


def _named(value: object) -> bool:
    """Whether ``value`` is a non-empty string (an id or name, ``min_length=1``)."""
    return type(value) is str and value != ""


def _trusted_block(block: Any) -> TextBlock | ToolCallBlock | ToolResultBlock | None:
    """A text, tool call or tool result block as `message_draft` stores it (every field
    present, each of its exact type), built without validation; None for anything else."""
    if type(block) is not dict:
        return None
    kind = block.get("type")
    if kind == "text":
        text = block["text"] if block.keys() == _TEXT_KEYS else None
        if type(text) is str:
            return _trusted(TextBlock, {"type": "text", "text": text}, _TEXT_KEYS)
    elif kind == "tool_result" and block.keys() == _RESULT_KEYS:
        call_id, text, is_error = block["tool_call_id"], block["content"], block["is_error"]
        if _named(call_id) and type(text) is str and type(is_error) is bool:
            fields = {"type": kind, "tool_call_id": call_id, "content": text, "is_error": is_error}
            return _trusted(ToolResultBlock, fields, _RESULT_KEYS)
    elif kind == "tool_call" and block.keys() == _CALL_KEYS:
        call_id, name, arguments = block["id"], block["name"], block["arguments"]
        if _named(call_id) and _named(name) and type(arguments) is str:
            fields = {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}
            return _trusted(ToolCallBlock, fields, _CALL_KEYS)
    return None


def _trusted_blocks(content: Any) -> list[ContentBlock] | None:
    """``content`` as trusted blocks, or None if any block needs validating."""
    if type(content) is not list:
        return None
    blocks: list[ContentBlock] = []
    for item in content:
        block = _trusted_block(item)
        if block is None:
            return None
        blocks.append(block)
    return blocks


def stored_message(payload: dict[str, Any], message_id: str, created_at: datetime) -> Message:
    """The message a store holds: ``payload`` (decoded JSON) with its entry's id and time.

    Reading 10,000 messages is the common hot path, and a stored payload was validated
    when it was written, so the usual one (text content, or text, tool call and tool
    result blocks; a known role and category; nothing extra) is built without running
    validation again: each field is checked to be of the exact type validation would
    give. Anything else is validated in full, so a damaged row still raises
    `InvalidPayloadError` instead of loading.
    """
    try:
        role, category = _ROLE_AND_CATEGORY[payload["role"]]
    except (KeyError, TypeError):  # no role, an unknown one, or not even a string
        return _validated(payload, message_id, created_at)
    content = payload.get("content", "")
    tokens = payload.get("tokens")
    name = None
    metadata: Any = {}
    if len(payload) != 1 + ("content" in payload) + ("tokens" in payload):
        # Not just the usual keys: the rest are checked too.
        name = payload.get("name")
        metadata = payload.get("metadata", metadata)  # an explicit null is damage
        stored = payload.get("category")
        if stored is not None:
            category = _CATEGORIES.get(stored) if type(stored) is int else None  # type: ignore[assignment]
        if (
            category is None
            or not payload.keys() <= _STORED_KEYS
            or not (name is None or type(name) is str)
            or type(metadata) is not dict
        ):
            return _validated(payload, message_id, created_at)
    if (
        not (tokens is None or (type(tokens) is int and tokens >= 0))
        or type(message_id) is not str
        or not 0 < len(message_id) <= 128
    ):
        return _validated(payload, message_id, created_at)
    if type(content) is not str:
        content = _trusted_blocks(content)
        if content is None:
            return _validated(payload, message_id, created_at)
    fields = {
        "role": role,
        "content": content,
        "category": category,
        "id": message_id,
        "created_at": created_at,
        "name": name,
        "metadata": metadata,
        "tokens": tokens,
    }
    return _trusted(Message, fields, _FIELDS_SET)


def _validated(payload: dict[str, Any], message_id: object, created_at: datetime) -> Message:
    return Message.model_validate({**payload, "id": message_id, "created_at": created_at})
