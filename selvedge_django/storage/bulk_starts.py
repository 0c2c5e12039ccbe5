"""Bulk starts: many new instances in one transaction, one statement per batch and table.

``sv.start_workflows`` and the ``django.tasks`` backend's ``enqueue_many`` insert
their instances here: the instance rows of a batch in one ``INSERT ... ON CONFLICT
(instance_id) DO NOTHING`` (the primary key decides between racing starts of one
id, as for a single start; when every id of the call must be new, PostgreSQL inserts
without the clause and a unique violation names the taken id), then, for the starts
that record their first command (a task due now), the history rows of the batch in
one statement and the queued tasks in another; the search attributes of the new
instances, one statement per batch too. A batch is as many rows as one statement
may bind. Every batch commits in one transaction (the caller's, when there is one):
an id found taken that may not be returned rolls the whole call back. Starts that
must all be new (the tasks of ``enqueue_many``) may come a batch at a time from the
caller's generator (:meth:`BulkStarts.create_new_instances`): on PostgreSQL their
statements are sent in pipeline mode while the caller prepares the next batch.

The rows are built a column at a time (:mod:`.columns`). How the columns reach the
database is the dialect's: here a multi-row ``VALUES`` list, on SQLite one
statement run for each row (``executemany``), on PostgreSQL one array per column
(``unnest``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Any

from django.db import IntegrityError
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
from .columns import Column, Const, Plus, Prepared, converted, layout
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


@dataclass(frozen=True, slots=True)
class NewInstance:
    """One start of a bulk start, validated by the caller.

    ``if_exists`` is ``"fail"`` or ``"return"`` (an id taken by an instance of the
    same workflow is then no error); ``first_task`` is the history reservation of
    the workflow's first command, an activity, and its task (the start records it,
    as ``Starts.create_instance`` does with ``first_task``); ``attributes`` are the
    instance's first search attributes, checked by the caller (no ``None`` value),
    written only when this start creates the instance. ``input_text``, when given, is
    the input as stored JSON text (the codec's) and ``input_value`` is not read;
    ``task_input``, when given, is the first task's input instead of its spec's.
    Starts of one call that share a value may share the object (one workflow name,
    one first task's reservation and spec): the columns of those rows are then
    converted once.
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
    input_text: str | None = None
    task_input: str | None = None


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
        # Every id must be new (a taken one fails the call): the insert need not skip
        # taken ids, and a unique violation is the taken id's error.
        fresh = all(start.if_exists == "fail" for start in starts)
        try:
            return self._create(starts, now, service_name, code_version, fresh=fresh)
        except IntegrityError:
            if fresh:
                self._check_taken(self._taken(starts))
            raise

    @operation
    def create_new_instances(
        self,
        batches: Iterable[Sequence[NewInstance]],
        *,
        service_name: str = "",
        code_version: str | None = None,
    ) -> int:
        """Insert the starts of ``batches``, each of which must create its instance, in
        one transaction; return how many.

        The batches are drawn one at a time, the first before the transaction begins:
        on PostgreSQL the statements of one go out without waiting for the server
        (:meth:`Database._pipeline`), so the caller prepares the next batch (a
        generator's work) while the server inserts the last. Elsewhere every batch is
        drawn before the transaction begins, so that SQLite's write lock is not held
        while the caller prepares, and they are inserted as one. An error of the
        caller's iterator, or an id found taken
        (:class:`~selvedge_django.exceptions.WorkflowAlreadyStarted`, whatever
        ``if_exists`` says), rolls the whole call back; an id given twice is the
        caller's to reject before. Dispatchers (and, for first tasks, activity
        workers) are woken after commit.
        """
        pending = iter(batches)
        first = next(pending, None)
        if first is None:
            return 0
        pipeline = self.db._pipeline()
        drawn: Iterable[Sequence[NewInstance]] = chain([first], pending)
        if pipeline is None:  # all at once, in the statements' own batches
            drawn = [[start for batch in drawn for start in batch]]
            pipeline = contextlib.nullcontext()
        now = timezone.now()
        sent: list[NewInstance] = []
        try:
            with self.db.atomic():
                with pipeline:
                    for batch in drawn:
                        sent.extend(batch)
                        self._insert_new(batch, now, service_name, code_version)
                if any(start.first_task is not None for start in sent):
                    self.db.after_commit(TOPIC_TASK)
                if any(start.first_task is None for start in sent):
                    self.db.after_commit(TOPIC_RUNNABLE)
        except IntegrityError:
            taken = self._taken(sent)  # the call rolled back: what is left is another's
            if taken:
                raise exc.WorkflowAlreadyStarted(taken[0].instance_id) from None
            raise
        return len(sent)

    def _insert_new(
        self,
        batch: Sequence[NewInstance],
        now: datetime,
        service_name: str,
        code_version: str | None,
    ) -> None:
        """The rows of a batch of starts all new (on PostgreSQL no statement reads a
        result back: a taken id is the insert's unique violation)."""
        for part in self._batches_of(batch, self._instance_params()):
            created = self._insert_instances(part, now, service_name, code_version, fresh=True)
            if len(created) < len(part):  # a dialect whose insert skipped a taken id
                made, seen = set(created), set()
                for start in part:
                    if start.instance_id not in made or start.instance_id in seen:
                        raise exc.WorkflowAlreadyStarted(start.instance_id)
                    seen.add(start.instance_id)
        firsts = [start for start in batch if start.first_task is not None]
        if firsts:
            self._insert_first_tasks(firsts)
        self._insert_attributes(batch)

    def _create(
        self,
        starts: Sequence[NewInstance],
        now: datetime,
        service_name: str,
        code_version: str | None,
        *,
        fresh: bool,
    ) -> list[bool]:
        """:meth:`create_instances` in its transaction (a savepoint inside the caller's,
        so that a unique violation leaves the caller's transaction usable)."""
        with self.db.atomic():
            created: set[str] = set()
            for batch in self._batches_of(starts, self._instance_params()):
                created.update(
                    self._insert_instances(batch, now, service_name, code_version, fresh=fresh)
                )
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

    def _next_seqs(self, count: int) -> Column:
        """The creation numbers of a batch's ``count`` rows (a sequence: one query each)."""
        return Sql(self.db._tables(self.db.NEXT_SEQ))

    def _input_column(self, batch: Sequence[NewInstance]) -> list[Any]:
        """The instances' input column: each start's value (its stored text decoded),
        for the field to convert."""
        return [
            start.input_value if start.input_text is None else json.loads(start.input_text)
            for start in batch
        ]

    @staticmethod
    def _stored_texts(batch: Sequence[NewInstance]) -> Prepared | None:
        """The starts' stored JSON texts, to bind as they are (JSON ``null`` as SQL
        NULL); None when a start gave a value, or when a text is not UTF-8 (a lone
        surrogate, which the field's conversion escapes: the database then takes or
        refuses it as it does the value of a single start)."""
        texts = [start.input_text for start in batch]
        if None in texts:
            return None
        try:
            "".join(texts).encode("utf-8")  # type: ignore[arg-type]
        except UnicodeEncodeError:
            return None
        if "null" in texts:  # an input of None is SQL NULL, as the field stores it
            return Prepared([None if text == "null" else text for text in texts])
        return Prepared(texts)

    def _write_instances(
        self, columns: dict[str, Column], count: int, *, fresh: bool = False
    ) -> list[str]:
        """One INSERT of ``count`` instance rows (their columns) that skips taken ids; the
        ids it inserted. ``fresh``: every id must be new, and a dialect may insert
        without skipping (a taken id then raises ``IntegrityError``)."""
        names, marks, params = layout(self.db.connection, columns, count)
        rows = [(marks, list(row)) for row in zip(*params, strict=True)]
        return self.db._insert_new(sql.compose(INSERT_INSTANCES, columns=names), rows)

    def _write_rows(self, model: Any, columns: dict[str, Column], count: int) -> None:
        """INSERT ``count`` rows (their columns) into ``model``'s table, one statement per
        batch."""
        names, marks, params = layout(self.db.connection, columns, count)
        rows = [list(row) for row in zip(*params, strict=True)]
        table = self.db.connection.ops.quote_name(model._meta.db_table)
        for batch in self._batches_of(rows, max(1, len(params))):
            statement = sql.compose(
                INSERT_ROWS, table=table, columns=names, rows=", ".join([marks] * len(batch))
            )
            self.db._execute(statement, [value for values in batch for value in values])

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
        *,
        fresh: bool = False,
    ) -> list[str]:
        """One INSERT of a batch's instance rows; the ids it inserted."""
        db = self.db
        timeouts = [start.execution_timeout_ms for start in batch]
        started = [start.started_at or now for start in batch]
        # A start with its first task recorded waits for that task, not a dispatch.
        steps: dict[str, str] = {}
        current_steps = [
            ""
            if start.first_task is None
            else steps.setdefault(start.first_task[1].name, f"activity {start.first_task[1].name}")
            for start in batch
        ]
        values: dict[str, list[Any] | Column] = {
            "instance_id": [start.instance_id for start in batch],
            "workflow_name": [start.workflow_name for start in batch],
            "status": Const(str(WorkflowStatus.RUNNING)),
            "input": self._input_column(batch),
            "runnable": [start.first_task is None for start in batch],
            "ready_ms": db.now_sql(),
            "priority": [start.priority for start in batch],
            "created_seq": self._next_seqs(len(batch)),
            "service_name": Const(service_name),
            "current_step": current_steps,
            "started_at": started,
            "updated_at": started,
            "code_version": Const(code_version),
            "execution_timeout_ms": timeouts,
            "execution_deadline_ms": (
                Const(None)
                if timeouts.count(None) == len(timeouts)
                else Plus(db.now_sql(), timeouts)
            ),
            "trace_context": [start.trace_context for start in batch],
        }
        return self._write_instances(
            converted(self.db.connection, WorkflowInstance, values), len(batch), fresh=fresh
        )

    def _check_taken(self, taken: Sequence[NewInstance]) -> None:
        """Raise WorkflowAlreadyStarted for the first id found taken that may not be
        returned (the transaction then rolls back)."""
        for start in taken:
            if start.if_exists != "return":
                raise exc.WorkflowAlreadyStarted(start.instance_id)
        if not taken:
            return
        names = self._workflow_names(taken)
        for start in taken:
            if names.get(start.instance_id) != start.workflow_name:
                raise exc.WorkflowAlreadyStarted(start.instance_id)

    def _taken(self, starts: Sequence[NewInstance]) -> list[NewInstance]:
        """The starts whose ids an instance has, in order."""
        found = self._workflow_names(starts)
        return [start for start in starts if start.instance_id in found]

    def _workflow_names(self, starts: Sequence[NewInstance]) -> dict[str, str]:
        """The workflow of each instance the starts' ids name, by id (the ids found)."""
        names: dict[str, str] = {}
        ids = sorted({start.instance_id for start in starts})
        for chunk in self.db._chunks(ids):
            statement = sql.compose(SELECT_WORKFLOW_NAMES, ids=sql.marks(len(chunk)))
            names.update((str(i), str(n)) for i, n in self.db._fetch(statement, chunk))
        return names

    def _insert_first_tasks(self, starts: Sequence[NewInstance]) -> None:
        """The history row and the queued task of each start's first command: one
        statement per batch for each table."""
        db = self.db
        now_ms = db.now_sql()
        ids = [start.instance_id for start in starts]
        firsts = [start.first_task for start in starts]
        rows = [first[0] for first in firsts if first is not None]
        history: dict[str, list[Any] | Column] = {
            "instance_id": ids,
            **{
                name: [getattr(row, name) for row in rows]
                for name in ("key", "seq", "command", "event_type", "data", "reservation")
            },
            "delivered_seq": [row.delivered_seq for row in rows],
        }
        # One task's columns per distinct reservation and task (the starts of one call
        # share them but for the instance and the input): task_fields, the one
        # definition of a new task row, runs once for each.
        shared: dict[tuple[int, int], dict[str, Any]] = {}
        fields_list: list[dict[str, Any]] = []
        for instance_id, first in zip(ids, firsts, strict=True):
            assert first is not None
            row, spec = first
            fields = shared.get((id(row), id(spec)))
            if fields is None:
                fields = task_fields(Fence(instance_id, "", 0), row, spec, now_ms)
                fields["status"] = str(ActivityTaskStatus.QUEUED)
                shared[(id(row), id(spec))] = fields
            fields_list.append(fields)
        tasks: dict[str, list[Any] | Column] = (
            # One shared set (the usual call): each of its columns holds one value.
            {name: Const(value) for name, value in fields_list[0].items()}
            if len(shared) == 1
            else {name: [fields[name] for fields in fields_list] for name in fields_list[0]}
        )
        tasks["instance_id"] = ids
        tasks["input"] = [
            start.task_input if start.task_input is not None else start.first_task[1].input
            for start in starts
            if start.first_task is not None
        ]
        # Ready now, on the database clock; a schedule-to-start timeout counts from then.
        tasks["not_before_ms"] = now_ms
        waits = tasks["schedule_to_start_ms"]
        if isinstance(waits, Const):
            waits = [waits.value] * len(starts)
        assert isinstance(waits, list)
        tasks["schedule_deadline_ms"] = (
            Const(None) if waits.count(None) == len(waits) else Plus(now_ms, waits)
        )
        self._write_rows(
            HistoryEvent, converted(self.db.connection, HistoryEvent, history), len(starts)
        )
        self._write_rows(
            ActivityTask, converted(self.db.connection, ActivityTask, tasks), len(starts)
        )

    def _insert_attributes(self, starts: Sequence[NewInstance]) -> None:
        """The search attribute rows of the instances ``starts`` created: one statement
        per batch."""
        rows: list[tuple[Any, ...]] = []
        for start in starts:
            for name, value in (start.attributes or {}).items():
                rows.append((start.instance_id, name, *columns_of(value)))
        if not rows:
            return
        names = ("instance_id", "name", "kind", "text_value", "number_value", "time_value")
        values = {
            name: list(column) for name, column in zip(names, zip(*rows, strict=True), strict=True)
        }
        self._write_rows(
            WorkflowAttribute, converted(self.db.connection, WorkflowAttribute, values), len(rows)
        )
