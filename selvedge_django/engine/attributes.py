"""Search attributes: the one rule for their names and values, and their filters.

A name is 1 to 64 characters of ``[a-z0-9_]``; a value is a ``str`` of at most 255
characters (no control characters or lone surrogates, which PostgreSQL or every
database refuses), an ``int`` of 64 bits, a finite ``float``, a ``bool``, an aware
``datetime`` (kept in UTC) or ``None``, which removes the name. A filter maps
``name`` or ``name__lookup`` to a value, with the lookups of :data:`LOOKUPS`. The
client, the workflow command and the operators' filters all validate here, so a bad
name or value raises ``ValueError`` before anything is written. Nothing here does I/O.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

__all__ = [
    "LOOKUPS",
    "MAX_ATTRIBUTES",
    "AttributeCondition",
    "AttributeValue",
    "check_attributes",
    "check_name",
    "decode_attributes",
    "encode_attributes",
    "parse_filters",
    "value_from_text",
]

#: What an attribute holds.
AttributeValue: TypeAlias = str | int | float | bool | datetime

NAME_RE = re.compile(r"[a-z0-9_]{1,64}")
MAX_TEXT = 255
#: At most this many names in one start or one ``set_attributes`` call.
MAX_ATTRIBUTES = 64
#: The lookups of a filter (``name__lookup``); ``exact`` is the default.
LOOKUPS = ("exact", "gt", "gte", "lt", "lte", "in")
_INT_BOUND = 2**63
_REFUSED_CATEGORIES = ("Cc", "Cs")


def check_name(name: object) -> str:
    """Return ``name`` if it can name an attribute; else raise ValueError."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError(
            f"attribute name {name!r} must be 1 to 64 characters of a-z, 0-9 and _"[:300]
        )
    return name


def _check_value(name: str, value: object) -> AttributeValue:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT_BOUND <= value < _INT_BOUND:
            raise ValueError(f"attribute {name!r}: an int must fit in 64 bits")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"attribute {name!r}: a float must be finite, not {value!r}")
        return value
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(
                f"attribute {name!r}: a string holds at most {MAX_TEXT} characters, "
                f"not {len(value)}"
            )
        if any(unicodedata.category(ch) in _REFUSED_CATEGORIES for ch in value):
            raise ValueError(
                f"attribute {name!r}: a string must not contain control characters or "
                "lone surrogates"
            )
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"attribute {name!r}: a datetime must be aware (have a timezone)")
        return value.astimezone(UTC)
    raise ValueError(
        f"attribute {name!r}: a value is a str, int, float, bool, aware datetime or None, "
        f"not {type(value).__name__}"
    )


def check_attributes(mapping: object, what: str = "attributes") -> dict[str, AttributeValue | None]:
    """Validate a mapping of attributes (``None`` removes a name); ValueError otherwise.

    Returns a new dict with datetimes in UTC, in the mapping's order.
    """
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{what} must be a mapping of names to values")
    if len(mapping) > MAX_ATTRIBUTES:
        raise ValueError(f"{what} holds at most {MAX_ATTRIBUTES} names, not {len(mapping)}")
    checked: dict[str, AttributeValue | None] = {}
    for name, value in mapping.items():
        checked[check_name(name)] = None if value is None else _check_value(name, value)
    return checked


def _tagged(value: AttributeValue | None) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return {"$datetime": value.isoformat()}


def encode_attributes(attributes: Mapping[str, AttributeValue | None]) -> str:
    """The JSON text a ``set_attributes`` command records (datetimes tagged)."""
    return json.dumps({name: _tagged(value) for name, value in attributes.items()})


def decode_attributes(text: str) -> dict[str, AttributeValue | None]:
    """The attributes of :func:`encode_attributes`' text."""
    decoded: dict[str, AttributeValue | None] = {}
    for name, value in json.loads(text).items():
        if isinstance(value, dict):
            decoded[name] = datetime.fromisoformat(value["$datetime"])
        else:
            decoded[name] = value
    return decoded


@dataclass(frozen=True)
class AttributeCondition:
    """One filter: the attribute ``name`` compared by ``lookup`` with ``values``.

    ``values`` holds one value, or for ``in`` every value (any of them matches).
    """

    name: str
    lookup: str
    values: tuple[AttributeValue, ...]


def parse_filters(filters: object) -> list[AttributeCondition]:
    """Validate ``{"name": value, "name__lookup": value}``; ValueError on anything else.

    ``in`` takes a non-empty list, tuple or set of values; a range lookup a str, a
    number or a datetime (a bool has no order here); ``None`` is no filter value.
    """
    if filters is None:
        return []
    if not isinstance(filters, Mapping):
        raise ValueError("attributes filters must be a mapping of names to values")
    conditions: list[AttributeCondition] = []
    for key, value in filters.items():
        if not isinstance(key, str):
            raise ValueError(f"attribute filter {key!r} must be a string")
        name, _, lookup = key.partition("__")
        lookup = lookup or "exact"
        if lookup not in LOOKUPS:
            raise ValueError(
                f"unknown attribute lookup {lookup!r} in {key!r}: use one of {', '.join(LOOKUPS)}"[
                    :300
                ]
            )
        check_name(name)
        if lookup == "in":
            if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set):
                raise ValueError(f"attribute filter {key!r} takes a list of values")
            items = list(value)
            if not items or len(items) > 1000:
                raise ValueError(f"attribute filter {key!r} takes 1 to 1000 values")
        else:
            items = [value]
        checked = []
        for item in items:
            if item is None:
                raise ValueError(f"attribute filter {key!r}: None is no filter value")
            item = _check_value(name, item)
            if lookup not in ("exact", "in") and isinstance(item, bool):
                raise ValueError(f"attribute filter {key!r}: a bool has no order")
            checked.append(item)
        conditions.append(AttributeCondition(name, lookup, tuple(checked)))
    return conditions


def value_from_text(text: str) -> list[AttributeValue]:
    """Every value an operator's text may mean, for ``name=value`` on a command line.

    The text itself, then the int, float, bool (``true``/``false``) or aware ISO
    datetime it spells, if any: a filter matches an attribute holding any of them.
    """
    values: list[AttributeValue] = [text]
    try:
        whole = int(text)
        if -_INT_BOUND <= whole < _INT_BOUND:
            values.append(whole)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                values.append(number)
    if text in ("true", "false"):
        values.append(text == "true")
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        pass
    else:
        if when.tzinfo is not None:
            values.append(when.astimezone(UTC))
    return values
