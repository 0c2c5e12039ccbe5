"""``find_instances(input_filters=...)``: one meaning of "equal" on SQLite and PostgreSQL.

A filter value matches the input's value at its path as a JSON value, as
PostgreSQL's ``jsonb`` equality defines it: numbers by value (``5`` matches
``5.0``, never ``"5"`` nor ``true``), ``None`` only a recorded ``null`` (a missing
key matches nothing), objects whatever their key order, lists element by element.
Django's key lookups already give that on both databases for scalars; on SQLite
they compare objects and lists by their text, so there an object or a list is
compared through :func:`canonical_json`, registered on the engine's SQLite
connections as the SQL function ``selvedge_json_canonical``.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db.models import F
from django.db.models.fields import json as json_fields
from django.db.models.fields.json import KeyTransform, KeyTransformExact

__all__ = ["SQLITE_FUNCTION", "InputValueEquals", "canonical_json", "input_value_equals"]

SQLITE_FUNCTION = "selvedge_json_canonical"


def _tagged(value: Any) -> Any:
    """A form of a JSON value whose JSON text is the same for equal values (injective)."""
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, Decimal):
        if value == 0:
            return ["n", "0"]  # -0 and 0.0 are 0
        return ["n", str(value.normalize())]
    if isinstance(value, str):
        return ["s", value]
    if value is None:
        return ["z"]
    if isinstance(value, list):
        return ["l", [_tagged(item) for item in value]]
    return ["o", sorted([key, _tagged(item)] for key, item in value.items())]


def canonical_json(text: str | None) -> str | None:
    """The canonical text of a JSON document (None for None or text that is not JSON)."""
    if text is None:
        return None
    try:
        value = json.loads(text, parse_float=Decimal, parse_int=Decimal)
        return json.dumps(_tagged(value), separators=(",", ":"), ensure_ascii=False)
    except (ValueError, InvalidOperation, RecursionError, TypeError):
        return None


def _json_path(connection: Any, key_transforms: list[str]) -> str:
    """The SQLite JSON path of key transforms (``$."a"[0]``), on every supported Django.

    Django 6.1 moved ``compile_json_path`` from ``django.db.models.fields.json`` onto
    the backend's operations; 5.2 and 6.0 have only the module function.
    """
    on_backend = getattr(connection.ops, "compile_json_path", None)
    if on_backend is not None:
        return str(on_backend(key_transforms))
    return str(json_fields.compile_json_path(key_transforms))  # type: ignore[attr-defined]


class InputValueEquals(KeyTransformExact):
    """A key lookup's exact match, comparing objects and lists as JSON values on SQLite too."""

    def as_sqlite(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        if not isinstance(self.rhs, dict | list):
            sql, params = self.as_sql(compiler, connection)
            return sql, tuple(params)
        lhs, lhs_params, key_transforms = self.lhs.preprocess_lhs(compiler, connection)
        path = _json_path(connection, key_transforms)
        expected = canonical_json(json.dumps(self.rhs))
        return (
            f"(JSON_TYPE({lhs}, %s) IN ('array', 'object')"
            f" AND {SQLITE_FUNCTION}(JSON_EXTRACT({lhs}, %s)) = %s)",
            (*lhs_params, path, *lhs_params, path, expected),
        )


def input_value_equals(query: Any, parts: list[str], value: Any) -> InputValueEquals:
    """The condition "the input at the path ``parts`` equals ``value``", for ``filter()``.

    The path is resolved against ``query`` first, as ``filter(**kwargs)`` would, so the
    lookup prepares ``value`` as the JSON field's value.
    """
    expr: Any = F("input")
    for part in parts:
        expr = KeyTransform(part, expr)
    return InputValueEquals(expr.resolve_expression(query), value)


def register_sqlite_function(connection: Any) -> None:
    """Make ``selvedge_json_canonical`` available on one SQLite connection."""
    connection.connection.create_function(SQLITE_FUNCTION, 1, canonical_json, deterministic=True)
