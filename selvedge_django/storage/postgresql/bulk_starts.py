"""Bulk starts on PostgreSQL: a batch's rows sent as one array per column.

A multi-row ``VALUES`` list binds one parameter per value: 10,000 starts are some
300,000 marks, which the driver parses again for every statement (most of the
call's time, measured with bench/bench_bulk.py) and whose text changes with every
batch size. ``INSERT ... SELECT ... FROM unnest(%s::type[], ...)`` binds one array
per column instead: one short statement text whatever the number of rows, parsed
once and prepared like the engine's other statements. The arrays go as array
literals built here (a column of text or of integers joined in one pass, others
element by element): the driver's own array dumping escapes each element with a
regular expression, which cost as much as the statement. A column of one value for
every row (the workflow, the status, the start time) and a column whose value is SQL
(the clock, the next creation number) are written once in the select list; a
deadline is the clock there plus each row's number from an array. The input goes as
the codec's JSON text, which jsonb reads as it is.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...models import WorkflowInstance
from .. import sql
from ..bulk_starts import BulkStarts, NewInstance
from ..columns import NOTHING, Column, Const, Plus
from ..db import Sql

__all__ = ["PostgresBulkStarts"]

# The rows of one batch, a column each array ({values}: the select list over u's
# columns, {arrays}: "%s::type[]" each, {names}: u's column names).
INSERT_UNNEST = (
    "INSERT INTO {table} ({columns}) SELECT {values} FROM unnest({arrays}) AS u({names})"
)
# INSERT_UNNEST for instance rows: an id already taken is left alone.
SKIP_TAKEN = " ON CONFLICT (instance_id) DO NOTHING"
# A select list's SQL value plus the row's number ({element}: its array's column).
PLUS_ELEMENT = "({value} + {element})"


class PostgresBulkStarts(BulkStarts):
    """Bulk starts on PostgreSQL: ``unnest`` of one array per column."""

    def _input_column(self, batch: Sequence[NewInstance]) -> list[Any]:
        # jsonb reads the stored JSON text as it is.
        texts = self._stored_texts(batch)
        return super()._input_column(batch) if texts is None else texts

    def _write_instances(
        self, columns: dict[str, Column], count: int, *, fresh: bool = False
    ) -> list[str]:
        statement, params = self._columnar(WorkflowInstance, columns, count)
        if fresh:
            # A plain insert: ON CONFLICT's speculative insertion costs each row a
            # second look at the primary key and a WAL record of its own.
            self.db._execute(statement, params)
            ids = columns["instance_id"]
            return [ids.value] if isinstance(ids, Const) else list(ids)  # type: ignore[arg-type]
        rows = self.db._fetch(statement + SKIP_TAKEN + sql.RETURNING_INSTANCE_ID, params)
        return [str(row[0]) for row in rows]

    def _write_rows(self, model: Any, columns: dict[str, Column], count: int) -> None:
        self.db._execute(*self._columnar(model, columns, count))

    def _columnar(
        self, model: Any, columns: dict[str, Column], count: int
    ) -> tuple[str, list[Any]]:
        """The ``INSERT_UNNEST`` of ``count`` rows (``columns``, converted, every column
        of the rows) into ``model`` and its parameters.

        A column of one value for every row (:class:`Const`, :class:`Sql`) is written
        once in the select list; the others are each an array. Rows all of whose
        columns are such take an array of ``count`` ones, for the number of rows.
        """
        conn = self.db.connection
        types = {f.column: f.db_type(conn) for f in model._meta.concrete_fields}
        values: list[str] = []
        value_params: list[Any] = []
        arrays: list[str] = []
        array_params: list[Any] = []
        for name, column in columns.items():
            if isinstance(column, Const):
                values.append(f"CAST(%s AS {types[name]})")
                value_params.append(column.value)
                continue
            if isinstance(column, Sql):
                values.append(column.sql)
                value_params += column.params
                continue
            element = f"u.c{len(arrays)}"
            if isinstance(column, Plus):
                values.append(sql.compose(PLUS_ELEMENT, value=column.base.sql, element=element))
                value_params += column.base.params
                arrays.append("%s::bigint[]")
                array_params.append(_array_literal(column.values))
                continue
            values.append(element)
            arrays.append(f"%s::{types[name]}[]")
            literal = _array_literal(column)
            array_params.append(column if literal is None else literal)
        if not arrays:
            arrays.append("%s::int[]")
            array_params.append("{" + ",".join(["1"] * count) + "}")
        statement = sql.compose(
            INSERT_UNNEST,
            table=conn.ops.quote_name(model._meta.db_table),
            columns=", ".join(conn.ops.quote_name(name) for name in columns),
            values=", ".join(values),
            arrays=", ".join(arrays),
            names=", ".join(f"c{n}" for n in range(len(arrays))),
        )
        return statement, [*value_params, *array_params]


@functools.cache
def _json_wrapper() -> type:
    """The driver's JSON wrapper, what a JSONField gives to bind (psycopg or psycopg2)."""
    from django.db.backends.postgresql.psycopg_any import Jsonb

    return Jsonb


def _json_text(value: Any) -> str:
    """The JSON text of the driver's JSON wrapper, as the driver would send it."""
    obj = getattr(value, "obj", NOTHING)
    if obj is not NOTHING:  # psycopg
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
    when one is of a type not written here (the driver then dumps the list).

    A column of text only, or of integers only, is joined in one pass at C speed
    (text joined on NUL, which no stored text holds, then escaped at once)."""
    kinds = set(map(type, values))
    if kinds == {str}:
        joined = "\x00".join(values)
        if joined.count("\x00") == len(values) - 1:
            escaped = joined.replace("\\", "\\\\").replace('"', '\\"')
            return '{"' + escaped.replace("\x00", '","') + '"}'
    elif kinds == {int}:
        return "{" + ",".join(map(str, values)) + "}"
    elements = []
    for value in values:
        element = _element(value)
        if element is None:
            return None
        elements.append(element)
    return "{" + ",".join(elements) + "}"
