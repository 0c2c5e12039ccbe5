"""Bulk starts on PostgreSQL: a batch's rows sent as one array per column.

A multi-row ``VALUES`` list binds one parameter per value: 10,000 starts are some
300,000 marks, which the driver parses again for every statement (most of the
call's time, measured with bench/bench_bulk.py) and whose text changes with every
batch size. ``INSERT ... SELECT ... FROM unnest(%s::type[], ...)`` binds one array
per column instead: one short statement text whatever the number of rows, parsed
once and prepared like the engine's other statements. The arrays go as array
literals built here (str.replace per value): the driver's own array dumping escapes
each element with a regular expression, which cost as much as the statement. A
column whose value is SQL (the clock, the next creation number) is written once in
the select list when every row has the same one; rows that differ there take the
``VALUES`` list.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone

from ...models import WorkflowInstance
from .. import sql
from ..bulk_starts import _NOTHING, _PLAIN_FIELDS, BulkStarts
from ..db import Sql

__all__ = ["PostgresBulkStarts"]

# The rows of one batch, a column each array ({values}: the select list over u's
# columns, {arrays}: "%s::type[]" each, {names}: u's column names).
INSERT_UNNEST = (
    "INSERT INTO {table} ({columns}) SELECT {values} FROM unnest({arrays}) AS u({names})"
)
# INSERT_UNNEST for instance rows: an id already taken is left alone.
SKIP_TAKEN = " ON CONFLICT (instance_id) DO NOTHING"


class PostgresBulkStarts(BulkStarts):
    """Bulk starts on PostgreSQL: ``unnest`` of one array per column."""

    def _write_instances(self, values_list: list[dict[str, Any]]) -> list[str]:
        columnar = self._columnar(WorkflowInstance, values_list)
        if columnar is None:
            return super()._write_instances(values_list)
        statement, params = columnar
        rows = self.db._fetch(statement + SKIP_TAKEN + sql.RETURNING_INSTANCE_ID, params)
        return [str(row[0]) for row in rows]

    def _write_rows(self, model: Any, rows: list[dict[str, Any]]) -> None:
        columnar = self._columnar(model, rows)
        if columnar is None:
            super()._write_rows(model, rows)
            return
        self.db._execute(*columnar)

    def _columnar(self, model: Any, rows: list[dict[str, Any]]) -> tuple[str, list[Any]] | None:
        """The ``INSERT_UNNEST`` of ``rows`` into ``model`` and its parameters, or None
        when a column's SQL value differs between rows.

        Values are converted as ``BulkStarts._rows`` converts them; a column no row
        names takes the field's default, bound once; an auto primary key no row names
        is left to the database.
        """
        conn = self.db.connection
        named = rows[0].keys() if rows else set()
        columns: list[str] = []
        values: list[str] = []
        value_params: list[Any] = []
        arrays: list[str] = []
        array_params: list[Any] = []
        for f in model._meta.concrete_fields:
            key = f.attname if f.attname in named else f.name if f.name in named else None
            if key is None and f.primary_key:
                continue
            columns.append(conn.ops.quote_name(f.column))
            db_type = f.db_type(conn)
            if key is None:
                if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                    default = timezone.now()
                else:
                    default = f.get_default()
                values.append(f"CAST(%s AS {db_type})")
                value_params.append(f.get_db_prep_save(default, conn))
                continue
            column = [row[key] for row in rows]
            first = column[0]
            if isinstance(first, Sql):
                if any(
                    not isinstance(v, Sql) or v.sql != first.sql or v.params != first.params
                    for v in column
                ):
                    return None
                values.append(first.sql)
                value_params += first.params
                continue
            if any(isinstance(v, Sql) for v in column):
                return None
            values.append(f"u.c{len(arrays)}")
            arrays.append(f"%s::{db_type}[]")
            converted = self._converted(f, column)
            literal = _array_literal(converted)
            array_params.append(converted if literal is None else literal)
        statement = sql.compose(
            INSERT_UNNEST,
            table=conn.ops.quote_name(model._meta.db_table),
            columns=", ".join(columns),
            values=", ".join(values),
            arrays=", ".join(arrays),
            names=", ".join(f"c{n}" for n in range(len(arrays))),
        )
        return statement, [*value_params, *array_params]

    def _converted(self, field: models.Field[Any, Any], column: list[Any]) -> list[Any]:
        """A column's values as the field converts them for the database (a value of a
        plain type as it is; a run of one value converted once)."""
        conn = self.db.connection
        plain = next((t for c, t in _PLAIN_FIELDS if isinstance(field, c)), None)
        seen: Any = _NOTHING
        converted: Any = None
        out: list[Any] = []
        for value in column:
            if value is None or type(value) is plain:
                out.append(value)
                continue
            if seen is not value:
                converted = field.get_db_prep_save(value, conn)
                seen = value
            out.append(converted)
        return out


@functools.cache
def _json_wrapper() -> type:
    """The driver's JSON wrapper, what a JSONField gives to bind (psycopg or psycopg2)."""
    from django.db.backends.postgresql.psycopg_any import Jsonb

    return Jsonb


def _json_text(value: Any) -> str:
    """The JSON text of the driver's JSON wrapper, as the driver would send it."""
    obj = getattr(value, "obj", _NOTHING)
    if obj is not _NOTHING:  # psycopg
        return str((value.dumps or json.dumps)(obj))
    return str(value.dumps(value.adapted))  # psycopg2


def _element(value: Any) -> str | None:
    """One array element's text (quoted, NULL unquoted), or None for a value of a type
    not written here."""
    if value is None:
        return "NULL"
    kind = type(value)
    if kind is bool:
        return "t" if value else "f"
    if kind is int or kind is float:
        return repr(value)
    if kind is str:
        text = value
    elif kind is datetime:
        text = value.isoformat()
    elif kind is _json_wrapper():
        text = _json_text(value)
    else:
        return None
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array_literal(values: list[Any]) -> str | None:
    """The PostgreSQL array literal of ``values`` (converted for the database), or None
    when one is of a type not written here (the driver then dumps the list)."""
    elements = []
    for value in values:
        element = _element(value)
        if element is None:
            return None
        elements.append(element)
    return "{" + ",".join(elements) + "}"
