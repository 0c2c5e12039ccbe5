"""Row inserts without the ORM's query building: which field of a model takes which value.

The engine's hottest inserts (activity tasks, signals) are composed by hand
(:meth:`~.db.Database._insert`): a column list, one named mark per column and the
values they bind, each field's value prepared as the ORM prepares it (the value
given, the current time for ``auto_now`` and ``auto_now_add`` fields, else the
field's default). Which field takes which of those depends only on the model and the
keys given, so :class:`InsertPlans` works it out once per key set, with the columns,
the marks and the prepared value of each plain constant default; a row then prepares
only its given values, its times and its callable defaults. A :class:`~.sql.Sql`
value (an expression, such as the database clock) is inlined in place of its mark,
its parameters named after the column.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from .sql import Sql

__all__ = ["InsertPlans"]

Parts = tuple[str, str, dict[str, Any]]


class _Plan:
    """Which field of a model takes which value, for one key set."""

    __slots__ = ("columns", "constants", "defaults", "given", "mark_list", "marks", "stamped")

    def __init__(self) -> None:
        self.columns = ""
        self.marks = ""  # every value bound: ", ".join(mark_list)
        self.mark_list: list[str] = []
        # (place in mark_list, mark, field, the key of the values holding it)
        self.given: list[tuple[int, str, Any, str]] = []
        # auto_now and auto_now_add fields: the current time, prepared per row
        self.stamped: list[tuple[str, Any]] = []
        # defaults prepared per row: callable, or not a plain value once prepared
        self.defaults: list[tuple[str, Any]] = []
        # defaults prepared once (immutable, so every row can share them): mark -> value
        self.constants: dict[str, Any] = {}


class InsertPlans:
    """The insert plans of one database, by model, key set and mark prefix."""

    def __init__(self) -> None:
        # Filled once per key set; a race computes the same plan twice, harmlessly.
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def parts(
        self, conn: Any, model: Any, values: dict[str, Any], *, skip_pk: bool, name: str
    ) -> Parts:
        """The column list, the value expressions and their parameters of one row of
        ``model`` on ``conn`` (see :meth:`~.db.Database._insert_parts`)."""
        key = (model, skip_pk, name, tuple(values))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan(conn, model, values, skip_pk, name)
        params: dict[str, Any] = dict(plan.constants)
        inlined: list[str] | None = None  # the marks, when a value is an expression
        for place, mark, field, given in plan.given:
            value = values[given]
            if isinstance(value, Sql):
                text, named = value.named(mark)
                if inlined is None:
                    inlined = list(plan.mark_list)
                inlined[place] = text
                params.update(named)
            else:
                params[mark] = field.get_db_prep_save(value, conn)
        for mark, field in plan.stamped:
            params[mark] = field.get_db_prep_save(timezone.now(), conn)
        for mark, field in plan.defaults:
            params[mark] = field.get_db_prep_save(field.get_default(), conn)
        marks = plan.marks if inlined is None else ", ".join(inlined)
        return plan.columns, marks, params


def _plan(conn: Any, model: Any, values: dict[str, Any], skip_pk: bool, name: str) -> _Plan:
    plan = _Plan()
    columns: list[str] = []
    marks = plan.mark_list
    for f in model._meta.concrete_fields:
        if f.primary_key and skip_pk and f.name not in values:
            continue
        columns.append(conn.ops.quote_name(f.column))
        mark = f"{name}_{f.column}"
        if f.attname in values:
            plan.given.append((len(marks), mark, f, f.attname))
        elif f.name in values:
            plan.given.append((len(marks), mark, f, f.name))
        elif getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            plan.stamped.append((mark, f))
        elif callable(f.default):
            plan.defaults.append((mark, f))
        else:
            prepared = f.get_db_prep_save(f.get_default(), conn)
            if prepared is None or isinstance(prepared, (str, int, float)):
                plan.constants[mark] = prepared
            else:
                plan.defaults.append((mark, f))
        marks.append(f"%({mark})s")
    plan.columns, plan.marks = ", ".join(columns), ", ".join(marks)
    return plan
