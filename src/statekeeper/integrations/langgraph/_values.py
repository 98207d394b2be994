"""How the checkpointer turns LangGraph values into JSON, and back, without pickle.

A value that is plain JSON already (strings, finite numbers, booleans, None, lists and
string-keyed dicts of those) is stored as it is: ``{"json": value}``. A LangChain message,
or a list of them (``MessagesState``), is stored as its type name and its fields as
JSON: ``{"msgs": [["AIMessage", {"content": ..., "id": ...}], ...]}`` (LangChain's own
``dumpd`` fields; no class path, only the built-in message types, and only when they
read back equal). Anything else goes
through LangGraph's serializer (``serde.dumps_typed``, msgpack for messages and models)
and is stored as its type name and the bytes in base64: ``{"type": "msgpack", "b64":
"..."}``. A serializer that could fall back to pickle is refused when the saver is made,
and a stored or produced ``"pickle"`` value is refused when met.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import math
from collections.abc import Callable
from typing import Any

from langchain_core.load import dumpd
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from statekeeper.errors import InvalidInputError, StoreCorruptError
from statekeeper.jsoncodec import gc_paused

__all__ = ["PickleRefusedError", "ValueCodec", "check_serde"]

_MAX_DEPTH = 32
_EMPTY: tuple[Any, ...] = ([], {}, None, "")
_MESSAGES: dict[str, type[BaseMessage]] = {
    cls.__name__: cls
    for cls in (
        AIMessage,
        ChatMessage,
        FunctionMessage,
        HumanMessage,
        RemoveMessage,
        SystemMessage,
        ToolMessage,
    )
}


class PickleRefusedError(InvalidInputError):
    """LangGraph's serializer would write or read pickle, which statekeeper never stores."""


def check_serde(serde: SerializerProtocol) -> None:
    """Refuse a serializer set up to fall back to pickle (``pickle_fallback=True``)."""
    layer: Any = serde
    for _ in range(4):  # an EncryptedSerializer or a compatibility wrapper around the real one
        if getattr(layer, "pickle_fallback", False):
            break
        layer = getattr(layer, "serde", None)
    else:
        return
    if layer is not None:
        raise PickleRefusedError(
            "this serializer falls back to pickle, which statekeeper never stores; pass "
            "JsonPlusSerializer() (the default) without pickle_fallback=True"
        )


def _is_pickle(type_: object) -> bool:
    """``pickle``, or ``pickle+aes`` from an EncryptedSerializer."""
    return isinstance(type_, str) and type_.split("+")[0] == "pickle"


def _plain(value: Any, depth: int = 0) -> bool:
    """True if ``value`` reads back from JSON as an equal value of the same types."""
    kind = type(value)
    if value is None or kind is str or kind is bool or kind is int:
        return True
    if kind is float:
        return math.isfinite(value)
    if depth >= _MAX_DEPTH:
        return False
    if kind is list:
        return all(_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    return False


def _message_fields(value: Any) -> list[Any] | None:
    """``[type name, fields]`` of a built-in LangChain message that reads back equal."""
    cls = type(value)
    if _MESSAGES.get(cls.__name__) is not cls:
        return None
    fields = dumpd(value).get("kwargs")
    if not isinstance(fields, dict) or not _plain(fields):
        return None
    # Empty fields are the defaults of every built-in message; dropping them is checked.
    short = {k: v for k, v in fields.items() if v not in _EMPTY or type(v) is bool}
    for candidate in (short, fields):
        try:
            if cls(**candidate) == value:
                return [cls.__name__, candidate]
        except ValueError:  # HumanMessage("") needs its empty content
            continue
    return None


def _message(item: Any) -> BaseMessage:
    try:
        name, fields = item
        cls = _MESSAGES[name]
        return _assembled(cls, fields) or cls(**fields)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise StoreCorruptError(f"a stored LangChain message is damaged: {exc}") from exc


def _assembled(cls: type[BaseMessage], fields: dict[str, Any]) -> BaseMessage | None:
    """The message validation would build from ``fields``, without validating, when every
    field given is a declared string field and every required one is given (a plain chat
    turn), or None. Validation changes none of those (the built-in messages' validators
    act on tool calls, lists and non-strings only), so the result is the same object state
    as ``cls(**fields)``; tests/integrations/test_langgraph_segments.py checks it per type.
    A message costs ~3 us this way, ~7 us validated: most of a long thread's cold read."""
    declared = _DECLARED.get(cls)
    if declared is None:
        declared = _DECLARED[cls] = _Declared(cls)
    if not (declared.required <= fields.keys() <= declared.names) or not all(
        type(v) is str for v in fields.values()
    ):
        return None
    state = declared.template.copy()  # the declared order, as validation leaves it
    state.update(fields)
    for name, make in declared.fresh:
        if name not in fields:
            state[name] = make()
    message = cls.__new__(cls)
    _set(message, "__dict__", state)
    _set(message, "__pydantic_fields_set__", set(fields))
    _set(message, "__pydantic_extra__", {} if declared.extra else None)
    _set(message, "__pydantic_private__", None)
    return message


_set = object.__setattr__


class _Declared:
    """A message type's fields: their names, the required ones, the defaults (``fresh``:
    the mutable ones, made anew for each message as pydantic does), and whether it keeps
    extra fields. A type with private attributes or another extra policy gets a required
    field no message has: its messages are always validated."""

    def __init__(self, cls: type[BaseMessage]) -> None:
        extra = cls.model_config.get("extra")
        self.extra = extra == "allow"
        self.names = frozenset(cls.model_fields)
        self.required = frozenset(n for n, f in cls.model_fields.items() if f.is_required())
        self.template: dict[str, Any] = {}
        self.fresh: list[tuple[str, Callable[[], Any]]] = []
        for name, info in cls.model_fields.items():
            self.template[name] = None if info.is_required() else info.default
            if info.default_factory is not None:
                self.fresh.append((name, info.default_factory))  # type: ignore[arg-type]
            elif not info.is_required() and not isinstance(
                info.default, (str, int, float, type(None))
            ):
                self.fresh.append((name, functools.partial(copy.deepcopy, info.default)))
        if cls.__private_attributes__ or extra not in (None, "allow", "ignore"):
            self.required = frozenset({"\x00never"})


_DECLARED: dict[type[BaseMessage], _Declared] = {}


class ValueCodec:
    """Encodes values as JSON documents with a LangGraph serializer."""

    def __init__(self, serde: SerializerProtocol) -> None:
        check_serde(serde)
        self.serde = serde

    def encode(self, value: Any) -> dict[str, Any]:
        """``{"json": value}`` for plain JSON, else the serializer's type and base64 bytes."""
        if _plain(value):
            return {"json": value}
        if type(value) is list and value:
            fields = [_message_fields(item) for item in value]
            if all(f is not None for f in fields):
                return {"msgs": fields}
        type_, data = self.serde.dumps_typed(value)
        if _is_pickle(type_):
            raise PickleRefusedError(
                f"LangGraph's serializer produced pickle for a {type(value).__name__}; "
                "statekeeper stores JSON only: make the value msgpack-serializable"
            )
        return {"type": type_, "b64": base64.b64encode(data).decode("ascii")}

    def decode(self, doc: Any) -> Any:
        """The value a document from `encode` stands for."""
        if not isinstance(doc, dict):
            raise StoreCorruptError(f"a stored LangGraph value is not a document: {doc!r:.80}")
        if "json" in doc:
            return doc["json"]
        if "msgs" in doc:
            items = doc["msgs"]
            if len(items) < 64:
                return [_message(item) for item in items]
            # Built-in message types only, no user code: their thousands of containers
            # would otherwise trigger repeated full collections over everything loaded.
            with gc_paused():
                return [_message(item) for item in items]
        type_ = doc.get("type")
        if _is_pickle(type_):
            raise PickleRefusedError("a stored LangGraph value is pickle; refusing to load it")
        try:
            data = base64.b64decode(doc["b64"], validate=True)
        except (KeyError, TypeError, binascii.Error) as exc:
            raise StoreCorruptError(f"a stored LangGraph value is damaged: {exc}") from exc
        return self.serde.loads_typed((str(type_), data))
