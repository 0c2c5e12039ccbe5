"""Payload converters: how values become stored JSON and what code gets back.

The default (``SELVEDGE["PAYLOAD_CONVERTER"]`` unset) is plain JSON through
Django's ``DjangoJSONEncoder``: a ``Decimal``, ``date`` or ``UUID`` is stored as a
string and comes back as that string. With
``"selvedge_django.converters.TypedConverter"`` values are stored the same way
(the history format does not change), and on the way back into code they are
rebuilt from the annotations of the workflow and activity functions: a workflow's
input (its second parameter), an activity's input (its first) and result (its
return annotation, as ``execute`` returns it) and a child's result (when the child
is started by its definition). ``Decimal``, ``date``, ``datetime``, ``time``,
``timedelta``, ``UUID``, enums, dataclasses and Pydantic models (when Pydantic is
installed), nested in ``list``, ``tuple``, ``set``, ``dict`` and ``X | None``,
come back as what went in. Unannotated values, ``Any`` and signal payloads stay
JSON. A value that does not fit its annotation raises
:class:`~selvedge_django.exceptions.PayloadConversionError`; scalars are checked
by their JSON type (``bool`` is not ``int``; an integer is a ``float``; ``null``
passes for any annotation).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import json
import re
import threading
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.dateparse import parse_duration
from django.utils.duration import duration_iso_string

from . import exceptions as exc

__all__ = ["JSONConverter", "PayloadConverter", "TypedConverter", "TypedJSONEncoder"]

_NO_TYPE = object()


class PayloadConverter:
    """The interface: an ``encoder`` class for storing, ``from_json`` for reading back.

    ``from_json(value, annotation)`` receives the decoded JSON value and the
    annotation it is read as (never ``None``: unannotated values are not passed
    here) and returns what code receives.
    """

    encoder: type[json.JSONEncoder] = DjangoJSONEncoder

    def from_json(self, value: Any, annotation: Any) -> Any:
        """Return the value code receives for ``value`` read as ``annotation``."""
        return value

    # -- what the engine asks ------------------------------------------------------------

    def argument(self, fn: Callable[..., Any], position: int, value: Any) -> Any:
        """``value`` as the ``position``-th parameter of ``fn`` is annotated."""
        annotation = _hints(fn).get(("param", position), _NO_TYPE)
        return value if annotation is _NO_TYPE else self.from_json(value, annotation)

    def result(self, fn: Callable[..., Any], value: Any) -> Any:
        """``value`` as ``fn``'s return annotation says."""
        annotation = _hints(fn).get(("return", 0), _NO_TYPE)
        return value if annotation is _NO_TYPE else self.from_json(value, annotation)


class JSONConverter(PayloadConverter):
    """The default: JSON in, JSON out (``DjangoJSONEncoder``)."""


class TypedJSONEncoder(DjangoJSONEncoder):
    """DjangoJSONEncoder that keeps full precision and encodes dataclasses and models.

    Datetimes and times keep their microseconds (Django's encoder cuts them to
    milliseconds, so they would not round-trip); dataclasses become objects of
    their fields, Pydantic models their ``model_dump(mode="json")``, sets lists.
    """

    def default(self, o: Any) -> Any:
        if isinstance(o, dt.datetime | dt.time):
            return o.isoformat()
        if isinstance(o, dt.timedelta):
            return duration_iso_string(o)
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
        dump = getattr(o, "model_dump", None)
        if callable(dump) and _is_pydantic_model(type(o)):
            return dump(mode="json")
        if isinstance(o, enum.Enum):
            return o.value
        if isinstance(o, set | frozenset):
            return list(o)
        return super().default(o)


class TypedConverter(PayloadConverter):
    """Rebuild typed values from JSON by the functions' annotations."""

    encoder = TypedJSONEncoder

    def from_json(self, value: Any, annotation: Any) -> Any:
        try:
            return _convert(value, annotation)
        except exc.PayloadConversionError:
            raise
        except (TypeError, ValueError, KeyError, InvalidOperation) as error:
            raise exc.PayloadConversionError(
                f"cannot read {_preview(value)} as {_type_name(annotation)}: {error}"
            ) from error


# -- annotations ---------------------------------------------------------------------------

_hints_lock = threading.Lock()
_hints_cache: dict[Any, dict[tuple[str, int], Any]] = {}


def _hints(fn: Callable[..., Any]) -> dict[tuple[str, int], Any]:
    """The annotations of ``fn``'s positional parameters and result (cached per function)."""
    key = getattr(fn, "__wrapped__", fn)
    with _hints_lock:
        found = _hints_cache.get(key)
    if found is not None:
        return found
    found = {}
    try:
        hints = typing.get_type_hints(key)
        parameters = list(inspect.signature(key).parameters.values())
    except Exception:  # unresolvable annotations: the values stay JSON
        hints, parameters = {}, []
    for position, parameter in enumerate(parameters):
        if parameter.name in hints and hints[parameter.name] is not Any:
            found[("param", position)] = hints[parameter.name]
    if "return" in hints and hints["return"] not in (Any, type(None), None):
        found[("return", 0)] = hints["return"]
    with _hints_lock:
        _hints_cache[key] = found
    return found


def _is_pydantic_model(tp: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:
        return False
    return isinstance(tp, type) and issubclass(tp, BaseModel)


# -- conversion ----------------------------------------------------------------------------


def _convert(value: Any, tp: Any) -> Any:
    """``value`` (decoded JSON) read as the type ``tp``."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _convert(value, typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        return _union(value, typing.get_args(tp))
    if origin is typing.Literal:
        for option in typing.get_args(tp):
            if type(value) is type(option) and value == option:  # True is not 1
                return value
        raise ValueError(f"expected one of {list(typing.get_args(tp))!r}")
    if origin is not None:
        return _generic(value, origin, typing.get_args(tp))
    if value is None or not isinstance(tp, type):
        return value
    return _plain(value, tp)


def _union(value: Any, args: tuple[Any, ...]) -> Any:
    if value is None and type(None) in args:
        return None
    if type(value) in _SCALARS and type(value) in args:
        return value  # the member of the value's own JSON type first: 5 stays an int
    errors: list[str] = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _convert(value, arg)
        except (TypeError, ValueError, KeyError, InvalidOperation) as error:
            errors.append(str(error))
    raise ValueError("; ".join(errors) or "no member of the union fits")


def _generic(value: Any, origin: Any, args: tuple[Any, ...]) -> Any:
    if value is None:
        return None
    if isinstance(origin, type) and issubclass(origin, Mapping):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        key_type, value_type = (*args, Any, Any)[:2]
        return {_key(k, key_type): _convert(v, value_type) for k, v in value.items()}
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0]) for v in value)
        if args and len(args) != len(value):
            raise ValueError(f"expected {len(args)} items, got {len(value)}")
        return tuple(_convert(v, t) for v, t in zip(value, args or [Any] * len(value), strict=True))
    item = args[0] if args else Any
    items = [_convert(v, item) for v in value]
    if isinstance(origin, type) and issubclass(origin, set | frozenset):
        return origin(items)
    return items


def _key(key: str, tp: Any) -> Any:
    """An object key (JSON keys are text) as ``tp``: as ``json`` writes int, float, bool keys."""
    if tp in (Any, str):
        return key
    if tp is int:
        if not _INT_KEY.fullmatch(key):
            raise ValueError(f"expected an integer key, got {key!r}")
        return int(key)
    if tp is float:
        return float(key)
    if tp is bool:
        if key not in ("true", "false"):
            raise ValueError(f"expected the key 'true' or 'false', got {key!r}")
        return key == "true"
    return _convert(key, tp)


# The JSON types of scalars, each read only as its own annotation (and int as float).
_SCALARS = (bool, int, float, str)
_INT_KEY = re.compile(r"-?[0-9]+")


def _plain(value: Any, tp: type) -> Any:
    if tp in (bool, str, dict, list):
        if not isinstance(value, tp):
            raise TypeError(f"expected {_json_type(tp)}, got {_json_type(type(value))}")
        return value
    if tp is int:
        if type(value) is not int:  # bool is not an int, nor is 5.0
            raise TypeError(f"expected an integer, got {_json_type(type(value))}")
        return value
    if tp is float:
        if type(value) not in (int, float):  # an integer is a float too, a bool is not
            raise TypeError(f"expected a number, got {_json_type(type(value))}")
        return float(value)
    if tp is Decimal:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise TypeError(f"expected a decimal string, got {type(value).__name__}")
        return Decimal(str(value))
    if issubclass(tp, dt.datetime):
        return _text(value, dt.datetime.fromisoformat)
    if issubclass(tp, dt.date):
        return _text(value, dt.date.fromisoformat)
    if issubclass(tp, dt.time):
        return _text(value, dt.time.fromisoformat)
    if issubclass(tp, dt.timedelta):
        parsed = _text(value, parse_duration)
        if parsed is None:
            raise ValueError(f"not a duration: {value!r}")
        return parsed
    if issubclass(tp, uuid.UUID):
        return _text(value, uuid.UUID)
    if issubclass(tp, enum.Enum):
        if isinstance(value, bool) and not any(isinstance(m.value, bool) for m in tp):
            raise TypeError(f"expected a value of {tp.__qualname__}, got a boolean")
        return tp(value)
    if dataclasses.is_dataclass(tp):
        return _dataclass(value, tp)
    if _is_pydantic_model(tp):
        return tp.model_validate(value)  # type: ignore[attr-defined]
    return value


def _json_type(tp: type) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names.update({dict: "an object", list: "a list", type(None): "null"})
    return names.get(tp, tp.__name__)


def _text(value: Any, parse: Callable[[str], Any]) -> Any:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    if value.endswith("Z"):  # DjangoJSONEncoder's UTC datetimes
        value = value[:-1] + "+00:00"
    return parse(value)


def _dataclass(value: Any, tp: type) -> Any:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object for {tp.__qualname__}, got {type(value).__name__}")
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
    unknown = set(value) - set(fields)
    if unknown:
        raise ValueError(f"{tp.__qualname__} has no field {sorted(unknown)[0]!r}")
    return tp(**{name: _convert(v, hints.get(name, Any)) for name, v in value.items()})


def _type_name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
