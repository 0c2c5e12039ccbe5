"""Bulk starts: many new instances in one transaction, one statement per batch and table.

``sv.start_workflows`` and the ``django.tasks`` backend's ``enqueue_many`` insert
their instances here: the instance rows of a batch in one ``INSERT ... ON CONFLICT
(instance_id) DO NOTHING`` (the primary key decides between racing starts of one
id, as for a single start), then, for the starts that record their first command
(a task due now), the history rows of the batch in one statement and the queued
tasks in another; the search attributes of the new instances, one statement per
batch too. A batch is as many rows as one statement may bind. Every batch
commits in one transaction (the caller's, when there is one): an id found taken
that may not be returned rolls the whole call back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone

from .. import exceptions as exc
from ..engine.attributes import AttributeValue
from ..engine.events import Fence, HistoryRow
from ..engine.ports import TaskSpec
from ..models import (
    ActivityTask,
    ActivityTaskStatus,
    HistoryEvent,
    WorkflowAttribute,
    WorkflowInstance,
    WorkflowStatus,
)
from . import sql
from .attributes import columns_of
from .db import Database, Sql
from .operation import operation
from .task_rows import task_fields
from .wakeups import TOPIC_RUNNABLE, TOPIC_TASK

__all__ = ["BulkStarts", "NewInstance"]

# The statements of this part alone, beside it. ({columns}, {rows}): the new
# instances, one statement per batch; an id already taken is left alone
# (RETURNING_INSTANCE_ID: the ids it inserted).
INSERT_INSTANCES = (
    "INSERT INTO {instance} ({columns}) VALUES {rows} ON CONFLICT (instance_id) DO NOTHING"
)
# The first history rows or the queued tasks of the new instances ({table}).
INSERT_ROWS = "INSERT INTO {table} ({columns}) VALUES {rows}"
# The workflows of the ids a bulk start found taken ({ids}: marks).
SELECT_WORKFLOW_NAMES = (
    "SELECT instance_id, workflow_name FROM {instance} WHERE instance_id IN ({ids})"
)

# Columns whose conversion leaves a value of exactly this Python type (or None) as it
# is: bound without the field's conversion.
_PLAIN_FIELDS: tuple[tuple[type[models.Field[Any, Any]], type], ...] = (
    (models.CharField, str),
    (models.TextField, str),
    (models.IntegerField, int),
    (models.BooleanField, bool),
)
_NOTHING = object()


@dataclass(frozen=True)
class NewInstance:
    """One start of a bulk start, validated by the caller.

    ``if_exists`` is ``"fail"`` or ``"return"`` (an id taken by an instance of the
    same workflow is then no error); ``first_task`` is the history reservation of
    the workflow's first command, an activity, and its task (the start records it,
    as ``Starts.create_instance`` does with ``first_task``); ``attributes`` are the
    instance's first search attributes, checked by the caller (no ``None`` value),
    written only when this start creates the instance.
    """

    instance_id: str
    workflow_name: str
    input_value: Any
    if_exists: str = "fail"
    execution_timeout_ms: int | None = None
    trace_context: str | None = None
    priority: int = 0
    started_at: datetime | None = None
    first_task: tuple[HistoryRow, TaskSpec] | None = None
    attributes: Mapping[str, AttributeValue] | None = None


class BulkStarts:
    """Insert many instances at once (``store.bulk_starts``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @operation
    def create_instances(
        self,
        starts: Sequence[NewInstance],
        *,
        service_name: str = "",
        code_version: str | None = None,
    ) -> list[bool]:
        """Insert ``starts`` in one transaction; return, in order, whether each created
        its instance (False: its id was taken and ``if_exists="return"`` allowed it).

        An id taken by another workflow, or with ``if_exists="fail"``, raises
        :class:`~selvedge_django.exceptions.WorkflowAlreadyStarted` and nothing of the
        call is written. Dispatchers (and, for first tasks, activity workers) are woken
        after commit.
        """
        if not starts:
            return []
        now = timezone.now()
        with self.db.atomic():
            created: set[str] = set()
            for batch in self._batches_of(starts, self._instance_params()):
                created.update(self._insert_instances(batch, now, service_name, code_version))
            taken = [start for start in starts if start.instance_id not in created]
            self._check_taken(taken)
            tasks = [s for s in starts if s.first_task is not None and s.instance_id in created]
            if tasks:
                self._insert_first_tasks(tasks)
                self.db.after_commit(TOPIC_TASK)
            if any(s.first_task is None and s.instance_id in created for s in starts):
                self.db.after_commit(TOPIC_RUNNABLE)
            flags = self._created_flags(starts, created)
            self._insert_attributes([s for s, made in zip(starts, flags, strict=True) if made])
        return flags

    @staticmethod
    def _created_flags(starts: Sequence[NewInstance], created: set[str]) -> list[bool]:
        """Whether each start created its instance: an id given twice creates its
        instance once, the first time."""
        seen: set[str] = set()
        flags = []
        for start in starts:
            flags.append(start.instance_id in created and start.instance_id not in seen)
            seen.add(start.instance_id)
        return flags

    # -- what the dialects answer ------------------------------------------------------------

    def _max_params(self) -> int:
        """The most parameters one statement binds (PostgreSQL's protocol: 65,535)."""
        return 65_535

    def _next_seqs(self, count: int) -> list[Sql | int]:
        """The creation numbers of a batch's ``count`` rows (a sequence: one query each)."""
        return [Sql(self.db._tables(self.db.NEXT_SEQ))] * count

    # -- the statements ----------------------------------------------------------------------

    def _instance_params(self) -> int:
        """Parameters of one instance row (its columns, and the clock's offsets)."""
        return len(WorkflowInstance._meta.concrete_fields) + 4

    @staticmethod
    def _batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
        return [items[i : i + size] for i in range(0, len(items), size)]

    def _batches_of(self, items: Sequence[Any], params_each: int) -> list[Sequence[Any]]:
        return self._batches(items, max(1, self._max_params() // params_each))

    def _insert_instances(
        self,
        batch: Sequence[NewInstance],
        now: datetime,
        service_name: str,
        code_version: str | None,
    ) -> list[str]:
        """One INSERT of a batch's instance rows; the ids it inserted."""
        db = self.db
        values_list: list[dict[str, Any]] = []
        seqs = self._next_seqs(len(batch))
        for offset, start in enumerate(batch):
            started = start.started_at or now
            timeout = start.execution_timeout_ms
            leased_with_task = start.first_task is not None
            values: dict[str, Any] = {
                "instance_id": start.instance_id,
                "workflow_name": start.workflow_name,
                "status": str(WorkflowStatus.RUNNING),
                "input": start.input_value,
                # A start with its first task recorded waits for that task, not a dispatch.
                "runnable": not leased_with_task,
                "ready_ms": db.now_sql(),
                "priority": start.priority,
                "created_seq": seqs[offset],
                "service_name": service_name,
                "current_step": (
                    f"activity {start.first_task[1].name}" if start.first_task else ""
                ),
                "started_at": started,
                "updated_at": started,
                "code_version": code_version,
                "execution_timeout_ms": timeout,
                "execution_deadline_ms": (
                    None if timeout is None else db.now_sql(plus_seconds=timeout / 1000)
                ),
                "trace_context": start.trace_context,
            }
            values_list.append(values)
        return self._write_instances(values_list)

    def _write_instances(self, values_list: list[dict[str, Any]]) -> list[str]:
        """One INSERT of instance rows (their column values) that skips taken ids; the
        ids it inserted."""
        columns, rows = self._rows(WorkflowInstance, values_list)
        return self.db._insert_new(sql.compose(INSERT_INSTANCES, columns=columns), rows)

    def _write_rows(self, model: Any, rows: list[dict[str, Any]]) -> None:
        """INSERT ``rows`` (their column values) into ``model``'s table, one statement
        per batch."""
        self._insert_rows(model, *self._rows(model, rows))

    def _check_taken(self, taken: Sequence[NewInstance]) -> None:
        """Raise WorkflowAlreadyStarted for the first id found taken that may not be
        returned (the transaction then rolls back)."""
        for start in taken:
            if start.if_exists != "return":
                raise exc.WorkflowAlreadyStarted(start.instance_id)
        if not taken:
            return
        names: dict[str, str] = {}
        ids = sorted({start.instance_id for start in taken})
        for chunk in self.db._chunks(ids):
            statement = sql.compose(SELECT_WORKFLOW_NAMES, ids=sql.marks(len(chunk)))
            names.update((str(i), str(n)) for i, n in self.db._fetch(statement, chunk))
        for start in taken:
            if names.get(start.instance_id) != start.workflow_name:
                raise exc.WorkflowAlreadyStarted(start.instance_id)

    def _insert_first_tasks(self, starts: Sequence[NewInstance]) -> None:
        """The history row and the queued task of each start's first command: one
        statement per batch for each table."""
        db = self.db
        now_ms = db.now_sql()
        history: list[dict[str, Any]] = []
        tasks: list[dict[str, Any]] = []
        for start in starts:
            assert start.first_task is not None
            row, spec = start.first_task
            history.append(
                {
                    "instance_id": start.instance_id,
                    "key": row.key,
                    "seq": row.seq,
                    "command": row.command,
                    "event_type": row.event_type,
                    "data": row.data,
                    "reservation": row.reservation,
                    "delivered_seq": row.delivered_seq,
                }
            )
            fields = task_fields(Fence(start.instance_id, "", 0), row, spec, now_ms)
            schedule_ms = fields["schedule_to_start_ms"]
            fields["status"] = str(ActivityTaskStatus.QUEUED)
            fields["schedule_deadline_ms"] = (
                None if schedule_ms is None else db.now_sql(plus_seconds=schedule_ms / 1000)
            )
            tasks.append(fields)
        self._write_rows(HistoryEvent, history)
        self._write_rows(ActivityTask, tasks)

    def _insert_attributes(self, starts: Sequence[NewInstance]) -> None:
        """The search attribute rows of the instances ``starts`` created: one statement
        per batch."""
        rows: list[dict[str, Any]] = []
        for start in starts:
            for name, value in (start.attributes or {}).items():
                kind, text, number, when = columns_of(value)
                rows.append(
                    {
                        "instance_id": start.instance_id,
                        "name": name,
                        "kind": kind,
                        "text_value": text,
                        "number_value": number,
                        "time_value": when,
                    }
                )
        if rows:
            self._write_rows(WorkflowAttribute, rows)

    def _rows(
        self, model: Any, rows: list[dict[str, Any]]
    ) -> tuple[str, list[tuple[str, list[Any]]]]:
        """The column list and each row's value marks and parameters for ``model``.

        What ``Database._insert_parts`` does for one row, done once per column: a
        column no row names takes the field's default, converted once; a value of a
        plain text, number or boolean column is bound as it is (what the field's
        conversion returns for it), others go through the field. :class:`Sql` values
        are inlined. Every row names the same columns; an auto primary key no row
        names is left to the database.
        """
        conn = self.db.connection
        named = rows[0].keys() if rows else set()
        # Per column: (the row's key or None, the field or the converted default, the
        # Python type bound as it is or None).
        plan: list[tuple[str | None, Any, type | None]] = []
        columns: list[str] = []
        for f in model._meta.concrete_fields:
            key = f.attname if f.attname in named else f.name if f.name in named else None
            if key is None and f.primary_key:
                continue
            columns.append(conn.ops.quote_name(f.column))
            if key is not None:
                plain = next((t for c, t in _PLAIN_FIELDS if isinstance(f, c)), None)
                plan.append((key, f, plain))
                continue
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                default = timezone.now()
            else:
                default = f.get_default()
            plan.append((None, f.get_db_prep_save(default, conn), None))
        # The last value converted per column: rows often share one (a start time).
        last: list[tuple[Any, Any]] = [(_NOTHING, None)] * len(plan)
        built: list[tuple[str, list[Any]]] = []
        for row in rows:
            marks: list[str] = []
            params: list[Any] = []
            for index, (key, field, plain) in enumerate(plan):
                if key is None:
                    marks.append("%s")
                    params.append(field)  # the default, converted once
                    continue
                value = row[key]
                if isinstance(value, Sql):
                    marks.append(value.sql)
                    params += value.params
                    continue
                marks.append("%s")
                if value is None or type(value) is plain:
                    params.append(value)
                    continue
                seen, converted = last[index]
                if seen is not value:
                    converted = field.get_db_prep_save(value, conn)
                    last[index] = (value, converted)
                params.append(converted)
            built.append((f"({', '.join(marks)})", params))
        return ", ".join(columns), built

    def _insert_rows(self, model: Any, columns: str, rows: list[tuple[str, list[Any]]]) -> None:
        """INSERT ``rows`` into ``model``'s table, one statement per batch."""
        if not rows:
            return
        table = self.db.connection.ops.quote_name(model._meta.db_table)
        for batch in self._batches_of(rows, max(1, len(rows[0][1]))):
            statement = sql.compose(
                INSERT_ROWS,
                table=table,
                columns=columns,
                rows=", ".join(marks for marks, _ in batch),
            )
            self.db._execute(statement, [value for _, values in batch for value in values])
