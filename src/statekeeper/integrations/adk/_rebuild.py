"""Models rebuilt from JSON data without running pydantic's validation on it.

Reading a long ADK session is mostly building its events: validating one `Event` from
JSON costs tens of microseconds, most of it in genai's Python hooks (a custom
``Part.__init__``, a before-validator on every genai model) that change nothing in data
a model dump produced. `builder` makes, per model class, a function that builds the
instance from such data directly, as ``model_construct`` does, but recursively and with
every value checked against its field's type.

The result equals what ``cls.model_validate_json(json.dumps(data))`` returns: the same
classes, values, field order and ``model_fields_set``. Whatever the builder cannot
prove it builds the same way raises `Unsupported`, and the caller validates instead:
a key that is not a field name (an alias, an extra), a value of another JSON type than
its field's, an enum value that is not a member, a type it does not know (datetimes,
unions of models, tuples, constrained or annotated fields ...), a model with a
validator, ``__init__`` or setting it does not know to be neutral on such data.
"""

from __future__ import annotations

import enum
import functools
import json
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter
from pydantic_core import PydanticUndefined

__all__ = ["Unsupported", "builder"]

Build = Callable[[Any], Any]
M = typing.TypeVar("M", bound=BaseModel)


class Unsupported(Exception):
    """The data is not of a shape the builder knows; validate it instead."""


# Hooks known to leave a model dump's data alone. The genai validator only warns about
# model *instances* in the input (JSON data holds none); ADK's routes a few keys that
# are not fields (a key that is not a field is `Unsupported` here); genai's
# ``Part.__init__`` hands keyword fields to pydantic unchanged, except None values,
# which it drops (so data with a None value is `Unsupported` for such a class).
_NEUTRAL_MODEL_VALIDATORS = frozenset(
    {
        "google.genai._common.BaseModel._check_field_type_mismatches",
        "google.adk.events.event.Event._accept_convenience_kwargs",
    }
)
_NONE_DROPPING_INITS = frozenset({"google.genai.types.Part.__init__"})
# Field validators that return an empty value unchanged (other values: `Unsupported`).
_EMPTY_NEUTRAL_FIELD_VALIDATORS = frozenset(
    {"google.adk.events.event_actions.EventActions._parse_auth_configs"}
)
# Settings under which validation changes or refuses values a plain check would pass.
_ALTERING_SETTINGS = (
    "strict",
    "use_enum_values",
    "validate_default",
    "str_strip_whitespace",
    "str_to_lower",
    "str_to_upper",
    "str_min_length",
    "str_max_length",
    "coerce_numbers_to_str",
)
_IMMUTABLE = (type(None), str, int, float, bool, bytes, enum.Enum, frozenset, tuple)

_builders: dict[type[BaseModel], Build] = {}
_setattr = object.__setattr__


def builder(cls: type[M]) -> Callable[[Any], M]:
    """The function that builds ``cls`` from a dict of JSON data (cached per class)."""
    found = _builders.get(cls)
    if found is None:
        # Planned on first use: only the classes that data holds are (a model may
        # contain itself, and genai defines hundreds).
        def first(data: Any) -> Any:
            try:
                plan[0] = _plan_model(cls)
            except Exception:  # a class not known here: its values are validated instead
                plan[0] = _refuse
            return plan[0](data)

        plan: list[Build] = [first]
        _builders[cls] = found = lambda data: plan[0](data)
    return typing.cast("Callable[[Any], M]", found)


def _refuse(_: Any) -> Any:
    raise Unsupported


def _required() -> Any:
    raise Unsupported


def _name(func: Any) -> str:
    func = getattr(func, "__func__", func)
    return f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', '')}"


def _plan_model(cls: type[BaseModel]) -> Build:
    if not cls.__pydantic_fields_complete__ and not cls.model_rebuild():
        raise Unsupported  # forward references that do not resolve
    config: ConfigDict = cls.model_config
    if cls.__pydantic_root_model__ or any(config.get(k) for k in _ALTERING_SETTINGS):
        raise Unsupported
    by_name = config.get("populate_by_name") or config.get("validate_by_name")
    names = set(cls.__pydantic_fields__)
    for name, field in cls.__pydantic_fields__.items():
        alias = field.validation_alias if field.validation_alias is not None else field.alias
        # Data is keyed by field name: fine when validation accepts names, and no
        # name is another field's alias.
        if alias is not None and alias != name and (not by_name or alias in names):
            raise Unsupported
    decorators = cls.__pydantic_decorators__
    if any(
        _name(d.func) not in _NEUTRAL_MODEL_VALIDATORS for d in decorators.model_validators.values()
    ):
        raise Unsupported
    drops_none = cls.__init__ is not BaseModel.__init__
    if drops_none and _name(cls.__init__) not in _NONE_DROPPING_INITS:
        raise Unsupported
    checked: dict[str, bool] = {}  # field -> its validators pass empty values through
    for d in decorators.field_validators.values():
        neutral = _name(d.func) in _EMPTY_NEUTRAL_FIELD_VALIDATORS
        for name in d.info.fields:
            checked[name] = checked.get(name, True) and neutral
    # Every field in declaration order (validation's order), constant defaults filled
    # in; data then overwrites its fields in place, and factories fill the rest.
    template: dict[str, Any] = {}
    converters: dict[str, Build | None] = {}
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, field in cls.__pydantic_fields__.items():
        if field.metadata or field.validate_default or field.default_factory_takes_validated_data:
            raise Unsupported
        convert = _plan_type(field.annotation, config)
        if name in checked:
            convert = _empty_only(convert) if checked[name] else _refuse
        converters[name] = convert
        default: Any = field.default
        template[name] = default
        if field.default_factory is not None:
            factories.append((name, typing.cast("Callable[[], Any]", field.default_factory)))
        elif default is PydanticUndefined:
            factories.append((name, _required))  # its absence is for validation to report
        elif not isinstance(default, _IMMUTABLE):
            copy = functools.partial(field.get_default, call_default_factory=True)
            factories.append((name, copy))
    post_init = bool(cls.__pydantic_post_init__)
    allow_extra = config.get("extra") == "allow"
    new = cls.__new__
    unknown = _refuse

    def build(data: Any) -> Any:
        if type(data) is not dict:
            raise Unsupported
        values = template.copy()
        for key, value in data.items():
            convert = converters.get(key, unknown)
            values[key] = value if convert is None else convert(value)
        for name, factory in factories:
            if name not in data:
                values[name] = factory()
        if drops_none and None in data.values():
            raise Unsupported
        model = new(cls)
        _setattr(model, "__dict__", values)
        _setattr(model, "__pydantic_fields_set__", set(data))
        _setattr(model, "__pydantic_extra__", {} if allow_extra else None)
        _setattr(model, "__pydantic_private__", None)
        if post_init:
            model.model_post_init(None)
        return model

    return build


def _empty_only(convert: Build | None) -> Build:
    def check(value: Any) -> Any:
        if value:
            raise Unsupported
        return value if convert is None else convert(value)

    return check


def _plan_type(annotation: Any, config: ConfigDict) -> Build | None:
    """How a JSON value becomes a field's value: None when it is kept as it is (any
    JSON value fits); raises `Unsupported` for a type not known here."""
    if annotation is Any or annotation is object:
        return None
    if annotation in _EXACT:
        return _EXACT[annotation]
    if annotation is float:
        return _float
    if annotation is bytes:
        return _bytes(config.get("val_json_bytes", "utf8"))
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return _plan_union(args, config)
    if origin is typing.Literal:
        return _literal(args)
    if origin is list and len(args) == 1:
        return _list(_plan_type(args[0], config), list)
    if origin in (set, frozenset) and len(args) == 1:
        return _list(_plan_type(args[0], config), origin)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _dict(_plan_type(args[1], config))
    if annotation is dict:
        return _dict(None)
    if isinstance(annotation, type) and origin is None:
        if issubclass(annotation, enum.Enum):
            return _enum(annotation)
        if issubclass(annotation, BaseModel):
            return builder(annotation)
    raise Unsupported


def _exact(kind: type) -> Build:
    def check(value: Any) -> Any:
        if type(value) is not kind:
            raise Unsupported
        return value

    return check


_EXACT: dict[Any, Build] = {kind: _exact(kind) for kind in (str, int, bool)}
_EXACT[type(None)] = _exact(type(None))
_SCALARS = frozenset({str, int, bool, type(None)})


def _float(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return value
    if kind is int:
        return float(value)  # what validation makes of a JSON integer
    raise Unsupported


def _bytes(mode: str) -> Build:
    adapter = TypeAdapter(bytes, config=ConfigDict(val_json_bytes=mode))  # type: ignore[typeddict-item]

    def convert(value: Any) -> Any:
        if type(value) is not str:
            raise Unsupported
        return adapter.validate_json(json.dumps(value))

    return convert


def _plan_union(args: tuple[Any, ...], config: ConfigDict) -> Build | None:
    others = [a for a in args if a is not type(None)]
    if len(others) == 1 and len(args) == 2:
        inner = _plan_type(others[0], config)
        if inner is None:
            return None

        def optional(value: Any) -> Any:
            return None if value is None else inner(value)

        return optional
    # Several arms: only JSON scalars (and lists of them), where validation keeps the
    # value whose type matches an arm exactly (float is left out: an int would become one).
    scalars = {a for a in args if a in _SCALARS}
    lists = [a for a in args if typing.get_origin(a) is list]
    if len(scalars) + len(lists) != len(args) or len(lists) > 1:
        raise Unsupported
    item = typing.get_args(lists[0])[0] if lists else None
    arms = (
        typing.get_args(item)
        if typing.get_origin(item) in (typing.Union, types.UnionType)
        else (item,)
    )
    items = set(arms) if lists else set()
    if lists and not items <= _SCALARS:
        raise Unsupported

    def union(value: Any) -> Any:
        kind = type(value)
        if kind in scalars:
            return value
        if kind is list and lists and all(type(v) in items for v in value):
            return value
        raise Unsupported

    return union


def _literal(args: tuple[Any, ...]) -> Build:
    allowed = {(type(a), a) for a in args}

    def literal(value: Any) -> Any:
        if (type(value), value) not in allowed:
            raise Unsupported
        return value

    return literal


def _list(item: Build | None, kind: type) -> Build:
    def convert(value: Any) -> Any:
        if type(value) is not list:
            raise Unsupported
        if item is None:
            return value if kind is list else kind(value)
        built = [item(v) for v in value]
        return built if kind is list else kind(built)

    return convert


def _dict(item: Build | None) -> Build:
    def convert(value: Any) -> Any:
        if type(value) is not dict:
            raise Unsupported
        return value if item is None else {k: item(v) for k, v in value.items()}

    return convert


def _enum(cls: type[enum.Enum]) -> Build:
    members = {(type(m.value), m.value): m for m in cls}

    def convert(value: Any) -> Any:
        member = members.get((type(value), value))
        if member is None:
            raise Unsupported
        return member

    return convert
