"""The engine's row inserts (``storage.inserts``): the plan worked out once per
model and key set gives each row what the model's fields give it, row by row."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from selvedge_django.models import ActivityTask, Schedule, SignalMessage
from selvedge_django.operations import _store
from selvedge_django.storage.sql import Sql

ROWS: list[tuple[Any, dict[str, Any]]] = [
    (
        ActivityTask,
        {
            "instance_id": "i-1",
            "key": "a1",
            "activity_name": "shop.charge",
            "input": "{}",
            "status": "claimed",
            "max_attempts": 3,
        },
    ),
    (SignalMessage, {"instance_id": "i-1", "channel": "go", "payload": "1"}),
    (Schedule, {"name": "nightly", "workflow_name": "shop.report", "input": "null"}),
]


def field_by_field(model: Any, values: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """The row as the ORM's fields make it, one field at a time (the reference)."""
    columns, marks, params = [], [], {}
    for f in model._meta.concrete_fields:
        if f.primary_key and f.name not in values:
            continue
        if f.attname in values:
            value = values[f.attname]
        elif f.name in values:
            value = values[f.name]
        elif getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            value = timezone.now()
        else:
            value = f.get_default()
        columns.append(connection.ops.quote_name(f.column))
        mark = f"x_{f.column}"
        if isinstance(value, Sql):
            text, named = value.named(mark)
            marks.append(text)
            params.update(named)
        else:
            marks.append(f"%({mark})s")
            params[mark] = f.get_db_prep_save(value, connection)
    return ", ".join(columns), ", ".join(marks), params


def _without_stamps(params: dict[str, Any]) -> dict[str, Any]:
    """The values that do not depend on the moment of the call (adapted values compared
    by their text: psycopg's JSON wrappers compare by identity)."""
    return {
        k: repr(getattr(v, "obj", v))
        for k, v in params.items()
        if not k.endswith(("_at", "created_at", "updated_at"))
    }


@pytest.mark.parametrize(("model", "values"), ROWS, ids=lambda p: getattr(p, "__name__", ""))
def test_a_planned_row_is_the_row_field_by_field(tdb: None, model: Any, values: Any) -> None:
    db = _store().db
    general = field_by_field(model, values)
    for _ in range(2):  # the plan is made by the first call, reused by the second
        planned = db._insert_parts(model, values, skip_pk=True, name="x")
        assert planned[:2] == general[:2]
        assert planned[2].keys() == general[2].keys()
        assert _without_stamps(planned[2]) == _without_stamps(general[2])


def test_each_row_gets_its_own_time(tdb: None) -> None:
    db = _store().db
    model, values = ROWS[0]
    first = db._insert_parts(model, values, skip_pk=True, name="x")[2]
    # A later row is stamped with a later time (the plan holds no time of its own).
    deadline = time.monotonic() + 5
    while True:
        second = db._insert_parts(model, values, skip_pk=True, name="x")[2]
        if second["x_created_at"] != first["x_created_at"]:
            break
        assert time.monotonic() < deadline, "every row got the first row's time"


def test_an_expression_is_inlined_in_place_of_its_mark(tdb: None) -> None:
    db = _store().db
    model, values = ROWS[1]
    expression = {**values, "payload": Sql("lower(%s)", ["A"])}
    plain = db._insert_parts(model, values, skip_pk=True, name="x")
    for _ in range(2):  # the key set's plan serves a row with an expression and one without
        columns, marks, params = db._insert_parts(model, expression, skip_pk=True, name="x")
        assert (columns, marks) == field_by_field(model, expression)[:2]
        assert "lower(%(x_payload_0)s)" in marks and params["x_payload_0"] == "A"
        assert "x_payload" not in params
        assert db._insert_parts(model, values, skip_pk=True, name="x")[:2] == plain[:2]
