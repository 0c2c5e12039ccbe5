"""The columns of a bulk insert: its rows built a column at a time.

A column whose rows all hold one value (:class:`Const`) is converted for the database
and bound once; a column of each row's value is converted in one pass, a value of a
plain type as it is and a run of one object converted once; a column of SQL (the
clock, a sequence) is the database's own value, alone (:class:`~.sql.Sql`) or plus
each row's number (:class:`Plus`); a column already as the database takes it
(:class:`Prepared`) is bound as it is. :func:`converted` makes the columns of a
model's new rows, :func:`layout` the marks and parameters of a multi-row ``VALUES``
list; the dialects may send them otherwise (PostgreSQL: one array per column).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import repeat
from typing import Any

from django.db import models
from django.utils import timezone

from . import sql
from .sql import Sql

__all__ = ["NOTHING", "Column", "Const", "Plus", "Prepared", "converted", "layout"]

# Columns whose conversion leaves a value of exactly this Python type (or None) as it
# is: bound without the field's conversion.
_PLAIN_FIELDS: tuple[tuple[type[models.Field[Any, Any]], type], ...] = (
    (models.CharField, str),
    (models.TextField, str),
    (models.IntegerField, int),
    (models.BooleanField, bool),
)
#: A sentinel for a value absent (never a stored value).
NOTHING = object()


class Const:
    """One value, converted for the database, of a column in every row."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Plus:
    """A column of SQL values: ``base`` (the same for every row) plus each row's number
    of milliseconds (``None``: the row's value is NULL)."""

    __slots__ = ("base", "values")

    def __init__(self, base: Sql, values: list[int | None]) -> None:
        self.base = base
        self.values = values


#: A column of a bulk insert: each row's value (converted for the database), one value
#: of every row (:class:`Const`), one SQL value of every row (:class:`Sql`), or a SQL
#: value plus each row's own number (:class:`Plus`).
Column = list[Any] | Const | Sql | Plus


class Prepared(list[Any]):
    """Each row's value of a column, already as the database takes it (not converted)."""


def converted(conn: Any, model: Any, values: Mapping[str, list[Any] | Column]) -> dict[str, Column]:
    """Every column of ``model``'s new rows, converted for the database.

    ``values`` names columns by field name or attname; a list is each row's raw
    value, and becomes a :class:`Const` when every row holds the same object. A
    column ``values`` does not name takes the field's default (``auto_now`` and
    ``auto_now_add`` fields the current time), converted once; an auto primary key
    it does not name is left to the database. :class:`Sql` and :class:`Plus`
    columns are the database's own values.
    """
    columns: dict[str, Column] = {}
    for f in model._meta.concrete_fields:
        key = f.attname if f.attname in values else f.name if f.name in values else None
        if key is None:
            if f.primary_key:
                continue
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                default = timezone.now()
            else:
                default = f.get_default()
            columns[f.column] = Const(f.get_db_prep_save(default, conn))
            continue
        column = values[key]
        if isinstance(column, Prepared):
            pass
        elif isinstance(column, list):
            column = _column(f, column, conn)
        elif isinstance(column, Const):
            column = Const(_prepared(f, column.value, conn))
        columns[f.column] = column
    return columns


def layout(
    conn: Any, columns: Mapping[str, Column], count: int
) -> tuple[str, str, list[Iterable[Any]]]:
    """The quoted column list, one row's value marks, and the parameters of the
    ``count`` rows, a column of them each (zipped, they are the rows' parameters in
    order)."""
    quote = conn.ops.quote_name
    marks: list[str] = []
    params: list[Iterable[Any]] = []
    for column in columns.values():
        if isinstance(column, list):
            marks.append("%s")
            params.append(column)
        elif isinstance(column, Const):
            marks.append("%s")
            params.append(repeat(column.value, count))
        elif isinstance(column, Plus):
            marks.append(sql.compose(sql.PLUS_MS, value=column.base.sql))
            params += [repeat(value, count) for value in column.base.params]
            params.append(column.values)
        else:
            marks.append(column.sql)
            params += [repeat(value, count) for value in column.params]
    names = ", ".join(quote(name) for name in columns)
    return names, f"({', '.join(marks)})", params


def _plain_type(field: models.Field[Any, Any]) -> type | None:
    """The type whose values ``field`` binds as they are (a foreign key: its target's)."""
    if isinstance(field, models.ForeignKey):
        field = field.target_field
    return next((t for c, t in _PLAIN_FIELDS if isinstance(field, c)), None)


def _prepared(field: models.Field[Any, Any], value: Any, conn: Any) -> Any:
    """``value`` converted by ``field`` for the database (a plain one as it is)."""
    plain = _plain_type(field)
    if value is None or type(value) is plain:
        return value
    return field.get_db_prep_save(value, conn)


def _column(field: models.Field[Any, Any], values: list[Any], conn: Any) -> Column:
    """A column of each row's raw value, converted: one :class:`Const` when every row
    holds the same object, else a list (a plain value as it is, a run of one value
    converted once)."""
    first = values[0] if values else None
    # Rows of different values usually differ at once: the last row is looked at first.
    if not values or (values[-1] is first and all(value is first for value in values)):
        return Const(_prepared(field, first, conn))
    plain = _plain_type(field)
    if plain is not None and set(map(type, values)) <= {plain, type(None)}:
        return values
    seen: Any = NOTHING
    converted: Any = None
    out: list[Any] = []
    for value in values:
        if value is None or type(value) is plain:
            out.append(value)
            continue
        if seen is not value:
            converted = field.get_db_prep_save(value, conn)
            seen = value
        out.append(converted)
    return out
