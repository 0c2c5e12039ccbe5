"""Starts: a new instance row, runnable or leased at once; a taken id decided by its key.

One statement (PostgreSQL, a start leased to a worker of this process) or one
transaction (the insert and the wake-up of the dispatchers after commit).
``INSERT ... ON CONFLICT (instance_id) DO NOTHING`` lets the primary key decide
between racing starts of one id, so ``if_exists="return"`` needs no read before
the write.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from .. import exceptions as exc
from ..engine.attributes import AttributeValue
from ..engine.events import Fence, HistoryRow
from ..engine.ports import TaskSpec
from ..models import ActivityTask, ActivityTaskStatus, WorkflowInstance, WorkflowStatus
from . import sql
from .attributes import Attributes
from .db import Database
from .operation import operation
from .options import StoreOptions
from .task_rows import task_fields
from .wakeups import TOPIC_RUNNABLE, TOPIC_TASK

__all__ = ["StartResult", "Starts", "input_field"]

# The first columns of INSERT_QUEUED_TASK, as task_fields names them.
QUEUED_TASK_COLUMNS = ("instance_id", "workflow_name", "key", "seq", "name", "input", "queue")


def input_field() -> Any:
    """The instance's ``input`` field, which turns a stored input back into its value."""
    return WorkflowInstance._meta.get_field("input")


@dataclass(frozen=True)
class StartResult:
    """What a start did: ``created`` (False: the id existed, nothing was written) and,
    for a start leased at once to a worker of this process, the lease's fence."""

    created: bool
    fence: Fence | None = None
    # With the fence: a monotonic time of this process no later than the insert that
    # took the lease (after any wait for SQLite's writer turn), which runs from there.
    leased_at: float | None = None


class Starts:
    """Insert instances (``store.starts``): ``sv.start_workflow``, forks, signal-with-start."""

    def __init__(self, db: Database, options: StoreOptions, *, attributes: Attributes) -> None:
        self.db = db
        self.options = options
        self.attributes = attributes

    @operation
    def create_instance(
        self,
        instance_id: str,
        workflow_name: str,
        input_value: Any,
        *,
        service_name: str = "",
        parent_instance_id: str = "",
        parent_key: str = "",
        started_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_ttl: float | None = None,
        code_version: str | None = None,
        execution_timeout_ms: int | None = None,
        if_exists: str = "fail",
        trace_context: str | None = None,
        priority: int = 0,
        first_task: tuple[HistoryRow, TaskSpec] | None = None,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> StartResult:
        """Insert a runnable instance; a taken id raises WorkflowAlreadyStarted.

        With ``if_exists="return"`` a taken id of the same workflow is no error: nothing
        is written and the result says ``created=False``. The primary key decides
        (``INSERT ... ON CONFLICT DO NOTHING``), so of racing starts of one id exactly
        one inserts, and the others see its row.

        ``code_version`` is recorded on it (the starting process's CODE_VERSION), and
        ``trace_context`` (the starting caller's, JSON text) for the spans of the run.
        ``priority`` (validated by the caller) orders its dispatches (sql.READY_RANK).
        With ``execution_timeout_ms`` the run's deadline is that long from now on
        the database clock (the leader terminates it then); without, both columns
        stay NULL.

        With ``lease_owner`` the instance is inserted already leased to that owner
        (epoch 1, expiring ``lease_ttl`` seconds from now on the database clock) and not
        runnable, and the fence is returned: the owner runs it without a dispatch,
        and no dispatcher can take it before the owner does (the result's ``fence``).
        Nobody is woken then.

        With ``first_task`` (the history reservation of the workflow's first command, an
        activity, and its task) the start records that command itself, in the same
        transaction: the instance is inserted not runnable, the row and the queued task
        with it, and activity workers are woken after commit (:mod:`.sole_activity`).

        ``attributes`` (checked by the caller) are the instance's first search
        attributes, inserted in the same transaction as the instance.
        """
        now = self.db._now_param(started_at or timezone.now())
        stored_input = input_field().get_db_prep_save(input_value, self.db.connection)
        # One statement text whether leased or not (no owner: no expiry), so that
        # statement-level tools (the fault injector, pg_stat_statements) see one start.
        ttl = self.options.lease_ttl if lease_ttl is None else lease_ttl
        leased = lease_owner is not None
        if first_task is not None and (leased or attributes):
            raise ValueError("a start that records its first activity is not leased")
        params = {
            "start_instance_id": instance_id,
            "start_workflow_name": workflow_name,
            "start_status": str(WorkflowStatus.RUNNING),
            "start_input": stored_input,
            "start_lease_owner": lease_owner or "",
            "start_lease_epoch": 1 if leased else 0,
            "start_leased": leased,
            "start_ttl_ms": round(ttl * 1000),
            "start_runnable": not leased and first_task is None,
            "start_cancel_requested": False,
            "start_cancel_reason": "",
            "start_parent_instance_id": parent_instance_id,
            "start_parent_key": parent_key,
            "start_service_name": service_name,
            "start_current_step": "" if first_task is None else f"activity {first_task[1].name}",
            "start_started_at": now,
            "start_updated_at": now,
            "start_code_version": code_version,
            "start_timeout_ms": execution_timeout_ms,
            "start_trace_context": trace_context,
            "start_priority": priority,
        }
        asked = time.monotonic()
        if first_task is not None:
            inserted = self._insert_with_task(instance_id, params, *first_task)
        elif attributes:
            inserted = self._insert_with_attributes(instance_id, params, leased, attributes)
        else:
            inserted = self._insert_instance(params, leased)
        if not inserted:
            self._existing_start(instance_id, workflow_name, if_exists)
            return StartResult(created=False, fence=None)
        if lease_owner is None:
            return StartResult(created=True)
        # The insert ran in the last outermost store transaction of this thread if it
        # opened one (after its wait for the database); otherwise inside the caller's
        # transaction or as one statement, after it was asked.
        leased_at = max(asked, self.db.write_began_at())
        return StartResult(
            created=True, fence=Fence(instance_id, lease_owner, 1), leased_at=leased_at
        )

    def _existing_start(self, instance_id: str, workflow_name: str, if_exists: str) -> None:
        """A start whose id was taken: fine for ``if_exists="return"`` and the same workflow.

        The insert's conflict already decided; this read only names the owner of the
        id (a committed row, which pruning alone removes: then the id counts as taken).
        """
        if if_exists == "return":
            rows = self.db._fetch(sql.SELECT_WORKFLOW_NAME, {"instance_id": instance_id})
            if rows and rows[0][0] == workflow_name:
                return
        raise exc.WorkflowAlreadyStarted(instance_id)

    def _insert_instance_sql(self) -> str:
        """sql.INSERT_INSTANCE with this dialect's next creation number."""
        return sql.compose(sql.INSERT_INSTANCE, next_seq=self.db.NEXT_SEQ)

    def _insert_instance(self, params: dict[str, Any], leased: bool) -> bool:
        """Run the start's insert (False: the id was taken, nothing written); a runnable
        start wakes the dispatchers after commit."""
        with self.db.atomic():
            inserted = self.db._execute(self._insert_instance_sql(), params) == 1
            if inserted and not leased:
                self.db.after_commit(TOPIC_RUNNABLE)
        return inserted

    def _insert_with_attributes(
        self,
        instance_id: str,
        params: dict[str, Any],
        leased: bool,
        attributes: Mapping[str, AttributeValue | None],
    ) -> bool:
        """Insert the instance and its attribute rows in one transaction (False: the id
        was taken, nothing written); a runnable start wakes the dispatchers after commit."""
        with self.db.atomic():
            if self.db._execute(self._insert_instance_sql(), params) != 1:
                return False
            self.attributes._write(instance_id, attributes)
            if not leased:
                self.db.after_commit(TOPIC_RUNNABLE)
        return True

    def _insert_with_task(
        self, instance_id: str, params: dict[str, Any], row: HistoryRow, task: TaskSpec
    ) -> bool:
        """Insert the instance, its first command's row and its queued task; wake the
        activity workers after commit (False: the id was taken, nothing written)."""
        with self.db.atomic():
            if self.db._execute(self._insert_instance_sql(), params) != 1:
                return False
            self.db._insert_row(instance_id, row)
            self.db._execute(
                sql.compose(sql.INSERT_QUEUED_TASK, source=""),
                self._queued_task_params(instance_id, row, task),
            )
            self.db.after_commit(TOPIC_TASK)
        return True

    def _queued_task_params(
        self, instance_id: str, row: HistoryRow, task: TaskSpec
    ) -> dict[str, Any]:
        """The values of INSERT_QUEUED_TASK (``queued_*``), from the columns ``task_fields``
        derives."""
        fields = task_fields(Fence(instance_id, "", 0), row, task, None)
        schedule_ms = fields["schedule_to_start_ms"]
        options = ActivityTask._meta.get_field("options")
        return {
            **{f"queued_{column}": fields[column] for column in QUEUED_TASK_COLUMNS},
            "queued_options": options.get_db_prep_save(fields["options"], self.db.connection),
            "queued_max_attempts": fields["max_attempts"],
            "queued_priority": fields["priority"],
            "queued_concurrency_key": fields["concurrency_key"],
            "queued_max_concurrency": fields["max_concurrency"],
            "queued_status": str(ActivityTaskStatus.QUEUED),
            "queued_schedule_ms": schedule_ms,
            "queued_start_to_close_ms": fields["start_to_close_ms"],
            "queued_heartbeat_ms": fields["heartbeat_timeout_ms"],
            "queued_has_schedule": schedule_ms is not None,
            "queued_schedule_to_start_ms": schedule_ms or 0,
            "queued_created_at": self.db._now_param(),
        }
