"""Search attributes (``store.attributes``): typed rows beside the instance, and their filters.

One row per (instance, name) in ``WorkflowAttribute``, the value in the column of
its type, so that every lookup of ``find_instances(attributes=...)`` is a range or
equality on one index keyed by the name and the value, on both databases (see the
model, and docs/attributes.md for why a side table and not a JSON column).

Writes happen inside the caller's transaction: a start's (with the instance
insert), a ``set_attributes`` command's (with the fence check and its history row)
and a fork's (a copy of the source's rows). Reads are one statement each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q

from ..engine.attributes import AttributeCondition, AttributeValue
from ..engine.events import Fence, HistoryRow
from ..models import WorkflowAttribute
from . import sql
from .db import Database
from .operation import operation

__all__ = ["Attributes", "attribute_filter", "columns_of", "value_of"]

# Insert or replace attribute rows ({rows}: one "(%s, %s, %s, %s, %s, %s)" per row).
UPSERT_ATTRIBUTES = (
    "INSERT INTO {attribute} (instance_id, name, kind, text_value, number_value, time_value)"
    " VALUES {rows} ON CONFLICT (instance_id, name) DO UPDATE SET kind = excluded.kind,"
    " text_value = excluded.text_value, number_value = excluded.number_value,"
    " time_value = excluded.time_value"
)
# The attributes of a page of instances ({ids}: an IN list).
SELECT_ATTRIBUTES = (
    "SELECT instance_id, name, kind, text_value, number_value, time_value FROM {attribute}"
    " WHERE instance_id IN ({ids}) ORDER BY instance_id, name"
)
# One row of UPSERT_ATTRIBUTES.
ATTRIBUTE_ROW = "(%s, %s, %s, %s, %s, %s)"
# Remove named attributes of one instance ({names}: an IN list).
DELETE_ATTRIBUTES = "DELETE FROM {attribute} WHERE instance_id = %s AND name IN ({names})"
# Copy every attribute of one instance (the last %s) to another (the first).
COPY_ATTRIBUTES = (
    "INSERT INTO {attribute} (instance_id, name, kind, text_value, number_value, time_value)"
    " SELECT %s, name, kind, text_value, number_value, time_value FROM {attribute}"
    " WHERE instance_id = %s"
)

KIND_TEXT = "s"
KIND_BOOL = "b"
KIND_INT = "i"
KIND_FLOAT = "f"
KIND_TIME = "t"


def columns_of(value: AttributeValue) -> tuple[str, str | None, float | None, datetime | None]:
    """The (kind, text_value, number_value, time_value) columns of a checked value."""
    if isinstance(value, bool):
        return KIND_BOOL, "true" if value else "false", None, None
    if isinstance(value, int):
        return KIND_INT, str(value), float(value), None
    if isinstance(value, float):
        return KIND_FLOAT, None, value, None
    if isinstance(value, str):
        return KIND_TEXT, value, None, None
    return KIND_TIME, None, None, value


def value_of(
    kind: str, text: str | None, number: float | None, when: datetime | str | None
) -> AttributeValue:
    """The value stored in a row's columns."""
    if kind == KIND_TEXT:
        return text or ""
    if kind == KIND_BOOL:
        return text == "true"
    if kind == KIND_INT:
        return int(text or 0)
    if kind == KIND_FLOAT:
        return float(number or 0.0)
    if isinstance(when, str):  # SQLite, read without the ORM
        when = datetime.fromisoformat(when)
    assert when is not None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _value_q(lookup: str, value: AttributeValue) -> Q:
    """The condition on one attribute row that ``value`` compared by ``lookup`` sets."""
    suffix = "" if lookup in ("exact", "in") else f"__{lookup}"
    if isinstance(value, bool):
        return Q(kind=KIND_BOOL, text_value="true" if value else "false")
    if isinstance(value, int | float):
        return Q(**{f"number_value{suffix}": float(value)})
    if isinstance(value, str):
        return Q(kind=KIND_TEXT, **{f"text_value{suffix}": value})
    return Q(**{f"time_value{suffix}": value})


def _condition_q(condition: AttributeCondition) -> Q:
    if condition.lookup != "in":
        return _value_q(condition.lookup, condition.values[0])
    # Values of one type make one IN list on that type's index; several types, an OR.
    texts = [v for v in condition.values if isinstance(v, str)]
    numbers = [
        float(v) for v in condition.values if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    bools = sorted({"true" if v else "false" for v in condition.values if isinstance(v, bool)})
    times = [v for v in condition.values if isinstance(v, datetime)]
    parts: list[Q] = []
    if texts:
        parts.append(Q(kind=KIND_TEXT, text_value__in=texts))
    if bools:
        parts.append(Q(kind=KIND_BOOL, text_value__in=bools))
    if numbers:
        parts.append(Q(number_value__in=numbers))
    if times:
        parts.append(Q(time_value__in=times))
    combined = parts[0]
    for part in parts[1:]:
        combined |= part
    return combined


def attribute_filter(alias: str, conditions: Sequence[AttributeCondition]) -> Q:
    """The condition on instances that every one of ``conditions`` holds (AND).

    The conditions on one name are one ``instance_id IN (attribute rows of that name
    and value)`` (an instance has one row per name, so ``amount >= 5 AND amount < 9``
    is one range on the index, not two), answered from the attribute index of the
    value's type.
    """
    by_name: dict[str, Q] = {}
    for condition in conditions:
        by_name[condition.name] = by_name.get(condition.name, Q()) & _condition_q(condition)
    combined = Q()
    rows = WorkflowAttribute.objects.using(alias)
    for name, value_q in by_name.items():
        matching = rows.filter(Q(name=name) & value_q)
        combined &= Q(instance_id__in=matching.values("instance_id"))
    return combined


class Attributes:
    """Write and read the attribute rows of instances."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _write(self, instance_id: str, attributes: Mapping[str, AttributeValue | None]) -> None:
        """Apply ``attributes`` to one instance inside the caller's transaction."""
        removed = [name for name, value in attributes.items() if value is None]
        if removed:
            self.db._execute(
                sql.compose(DELETE_ATTRIBUTES, names=sql.marks(len(removed))),
                [instance_id, *removed],
            )
        rows, params = self._rows(instance_id, attributes)
        if rows:
            self.db._execute(sql.compose(UPSERT_ATTRIBUTES, rows=", ".join(rows)), params)

    def _rows(
        self,
        instance_id: str | None,
        attributes: Mapping[str, AttributeValue | None],
        row: str = ATTRIBUTE_ROW,
    ) -> tuple[list[str], list[Any]]:
        """The VALUES rows (``row`` each) and their parameters of the attributes that are
        not None: (instance_id, name, kind, text, number, time), or without the instance
        id when ``instance_id`` is None (a statement that takes it from elsewhere)."""
        rows: list[str] = []
        params: list[Any] = []
        for name, value in attributes.items():
            if value is None:
                continue
            kind, text, number, when = columns_of(value)
            if instance_id is not None:
                params.append(instance_id)
            params += [name, kind, text, number, None if when is None else self.db._now_param(when)]
            rows.append(row)
        return rows, params

    @operation
    def set_attributes(
        self, fence: Fence, row: HistoryRow, attributes: Mapping[str, AttributeValue | None]
    ) -> HistoryRow:
        """Record a ``set_attributes`` command and change the rows: one fenced transaction."""
        with self.db.atomic():
            self.db._fence(fence)
            stored = self.db._insert_row(fence.instance_id, row)
            self._write(fence.instance_id, attributes)
        return stored

    @operation
    def copy(self, source_id: str, target_id: str) -> None:
        """Copy every attribute of ``source_id`` to ``target_id`` (a fork), in the caller's
        transaction."""
        self.db._execute(COPY_ATTRIBUTES, [target_id, source_id])

    @operation
    def of(self, instance_id: str) -> dict[str, AttributeValue]:
        """The attributes of one instance, by name (empty when it has none)."""
        return self.of_many([instance_id]).get(instance_id, {})

    @operation
    def of_many(self, instance_ids: Sequence[str]) -> dict[str, dict[str, AttributeValue]]:
        """The attributes of each of ``instance_ids`` (a page), by id and name; one read."""
        found: dict[str, dict[str, AttributeValue]] = {}
        if not instance_ids:
            return found
        # One hand-written statement: the ORM's query building costs more than the read.
        rows = self.db._fetch(
            sql.compose(SELECT_ATTRIBUTES, ids=sql.marks(len(instance_ids))), list(instance_ids)
        )
        for iid, name, kind, text, number, when in rows:
            found.setdefault(iid, {})[name] = value_of(kind, text, number, when)
        return found
