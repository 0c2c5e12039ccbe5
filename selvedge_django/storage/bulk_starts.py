"""Bulk starts: many new instances in one transaction, one statement per batch and table.

``sv.start_workflows`` and the ``django.tasks`` backend's ``enqueue_many`` insert
their instances here: the instance rows of a batch in one ``INSERT ... ON CONFLICT
(instance_id) DO NOTHING`` (the primary key decides between racing starts of one
id, as for a single start), then, for the starts that record their first command
(a task due now), the history rows of the batch in one statement and the queued
tasks in another. A batch is as many rows as one statement may bind. Every batch
commits in one transaction (the caller's, when there is one): an id found taken
that may not be returned rolls the whole call back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from .. import exceptions as exc
from ..engine.events import Fence, HistoryRow
from ..engine.ports import TaskSpec
from ..models import (
    ActivityTask,
    ActivityTaskStatus,
    HistoryEvent,
    WorkflowInstance,
    WorkflowStatus,
)
from . import sql
from .db import Database
from .operation import operation
from .task_rows import task_fields
from .wakeups import TOPIC_RUNNABLE, TOPIC_TASK

__all__ = ["BulkStarts", "NewInstance"]


@dataclass(frozen=True)
class NewInstance:
    """One start of a bulk start, validated by the caller.

    ``if_exists`` is ``"fail"`` or ``"return"`` (an id taken by an instance of the
    same workflow is then no error); ``first_task`` is the history reservation of
    the workflow's first command, an activity, and its task (the start records it,
    as ``Starts.create_instance`` does with ``first_task``).
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
        seen: set[str] = set()
        flags = []
        for start in starts:  # an id given twice creates its instance once, the first time
            flags.append(start.instance_id in created and start.instance_id not in seen)
            seen.add(start.instance_id)
        return flags

    # -- the statements ----------------------------------------------------------------------

    def _instance_params(self) -> int:
        """Parameters of one instance row (its columns, and the clock's offsets)."""
        return len(WorkflowInstance._meta.concrete_fields) + 4

    @staticmethod
    def _batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
        return [items[i : i + size] for i in range(0, len(items), size)]

    def _batches_of(self, items: Sequence[Any], params_each: int) -> list[Sequence[Any]]:
        return self._batches(items, max(1, self.db.max_params() // params_each))

    def _insert_instances(
        self,
        batch: Sequence[NewInstance],
        now: datetime,
        service_name: str,
        code_version: str | None,
    ) -> list[str]:
        """One INSERT of a batch's instance rows; the ids it inserted."""
        db = self.db
        rows: list[tuple[str, list[Any]]] = []
        columns = ""
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
                "created_seq": db.next_seq_sql(offset),
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
            columns, marks, params = db._insert_parts(WorkflowInstance, values, skip_pk=False)
            rows.append((f"({marks})", params))
        return db._insert_new(sql.compose(sql.INSERT_INSTANCES, columns=columns), rows)

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
            statement = sql.compose(sql.SELECT_WORKFLOW_NAMES, ids=sql.marks(len(chunk)))
            names.update((str(i), str(n)) for i, n in self.db._fetch(statement, chunk))
        for start in taken:
            if names.get(start.instance_id) != start.workflow_name:
                raise exc.WorkflowAlreadyStarted(start.instance_id)

    def _insert_first_tasks(self, starts: Sequence[NewInstance]) -> None:
        """The history row and the queued task of each start's first command: one
        statement per batch for each table."""
        db = self.db
        now_ms = db.now_sql()
        history: list[tuple[str, list[Any]]] = []
        tasks: list[tuple[str, list[Any]]] = []
        history_columns = task_columns = ""
        for start in starts:
            assert start.first_task is not None
            row, spec = start.first_task
            history_columns, marks, params = db._insert_parts(
                HistoryEvent,
                {
                    "instance_id": start.instance_id,
                    "key": row.key,
                    "seq": row.seq,
                    "command": row.command,
                    "event_type": row.event_type,
                    "data": row.data,
                    "reservation": row.reservation,
                    "delivered_seq": row.delivered_seq,
                },
                skip_pk=True,
            )
            history.append((f"({marks})", params))
            fields = task_fields(Fence(start.instance_id, "", 0), row, spec, now_ms)
            schedule_ms = fields["schedule_to_start_ms"]
            fields["status"] = str(ActivityTaskStatus.QUEUED)
            fields["schedule_deadline_ms"] = (
                None if schedule_ms is None else db.now_sql(plus_seconds=schedule_ms / 1000)
            )
            task_columns, marks, params = db._insert_parts(ActivityTask, fields, skip_pk=True)
            tasks.append((f"({marks})", params))
        self._insert_rows(HistoryEvent, history_columns, history)
        self._insert_rows(ActivityTask, task_columns, tasks)

    def _insert_rows(self, model: Any, columns: str, rows: list[tuple[str, list[Any]]]) -> None:
        if not rows:
            return
        table = self.db.connection.ops.quote_name(model._meta.db_table)
        for batch in self._batches_of(rows, max(1, len(rows[0][1]))):
            statement = sql.compose(
                sql.INSERT_ROWS,
                table=table,
                columns=columns,
                rows=", ".join(marks for marks, _ in batch),
            )
            self.db._execute(statement, [value for _, values in batch for value in values])
