"""Schedule rows: definitions, and the leader's firing of due slots.

A schedule row is its own aggregate: no instance path ever locks it, and every
path here locks it first (then the instances it starts or cancels), so the lock
order is schedule row, then instance rows.

Firing is one transaction per batch of due schedules: the schedule rows are
locked (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two leaders for a moment
take different rows; the write lock on SQLite), each schedule's plan is made
(:func:`selvedge_django.schedules.slots.plan`), the slots' runs are inserted
with ``ON CONFLICT (instance_id) DO NOTHING``, and the bookkeeping (next slot,
buffered slot, last run, counters) is written under the row's version. The start
of a slot and the schedule's update commit together; a run id that already exists
(started before, by whatever path) counts as that slot's run, so a slot starts at
most once whatever fails.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError
from django.db.models import Exists, OuterRef
from django.utils import timezone

from .. import exceptions as exc
from ..models import Schedule, WorkflowInstance, WorkflowStatus
from ..schedules.slots import SlotRule, jitter_offset_ms, plan, slot_id, trigger_id
from . import sql
from .db import Database
from .operation import operation
from .options import StoreOptions
from .wakeups import TOPIC_RUNNABLE

__all__ = ["FireResult", "Schedules", "TraceSource", "rule_of"]

logger = logging.getLogger("selvedge_django.schedules")

# Ids of runs a schedule keeps for ``recent_instance_ids``, newest first.
RECENT_RUNS = 10
# (run id, schedule) -> the trace context the run stores (JSON text), or None.
TraceSource = Callable[[str, Schedule], "str | None"]
# Rows of one INSERT of runs.
INSERT_CHUNK = 100
# A schedule whose plan cannot be made (a row edited by hand into nonsense) is
# tried again this much later, with the error recorded on it.
PLAN_ERROR_RETRY_MS = 60_000


def _ceil_second_ms(moment: datetime | None) -> int | None:
    """A bound as Unix ms on a whole second (slots fall on whole seconds)."""
    if moment is None:
        return None
    ms = int(moment.timestamp() * 1000)
    return -(-ms // 1000) * 1000


def rule_of(schedule: Schedule) -> SlotRule:
    """The slot rule of a schedule row."""
    end = schedule.end_at
    return SlotRule(
        cron=schedule.cron or None,
        interval_ms=schedule.interval_ms,
        timezone=schedule.timezone,
        start_ms=_ceil_second_ms(schedule.start_at),
        end_ms=None if end is None else int(end.timestamp() * 1000),
    )


def due_ms(schedule: Schedule, slot: int | None) -> int | None:
    """When ``slot`` is due: the slot plus its jitter offset."""
    if slot is None:
        return None
    return slot + jitter_offset_ms(schedule.name, slot, schedule.jitter_ms)


class _Conflict(Exception):
    """A schedule row changed under a writer that held its lock (a bug): roll back."""


@dataclass
class _Record:
    """The bookkeeping written for one schedule."""

    schedule: Schedule
    next_slot_ms: int | None
    buffered_slot_ms: int | None
    started: list[str] = field(default_factory=list)  # run ids, oldest slot first
    new_runs: int = 0
    missed: int = 0
    overlap_skipped: int = 0
    last_error: str = ""
    due_ms: int | None = None


@dataclass
class FireResult:
    """What one firing round did."""

    schedules: int = 0  # schedules whose state changed
    started: list[tuple[str, str]] = field(default_factory=list)  # (run id, workflow name)


class Schedules:
    """Schedule rows and the runs they start (``store.schedules``).

    Transactions, locks and statements are ``db``'s, so the dialect's own ways
    (``BEGIN IMMEDIATE``, ``SKIP LOCKED``) apply here too; runs start with the
    store's ``options`` (the code version they record).
    """

    def __init__(self, db: Database, options: StoreOptions) -> None:
        self.db = db
        self.options = options
        self.alias = db.alias

    @operation
    def now_ms(self) -> int:
        """The database clock in Unix milliseconds (the clock slots are due on)."""
        return self.db.now_ms()

    def _schedules(self) -> Any:
        return Schedule.objects.using(self.alias)

    # -- definitions (the operations layer) ---------------------------------------------

    @operation
    def get(self, name: str) -> Schedule:
        try:
            return self._schedules().get(name=name)
        except Schedule.DoesNotExist:
            raise exc.ScheduleNotFound(name) from None

    @operation
    def all(self) -> list[Schedule]:
        return list(self._schedules().order_by("name"))

    @operation
    def create(self, values: Callable[[int], dict[str, Any]], name: str) -> Schedule:
        """Insert schedule ``name`` with the columns ``values(now_ms)`` returns."""
        with self.db.atomic():
            if self._schedules().filter(name=name).exists():
                raise exc.ScheduleAlreadyExists(name)
            now = timezone.now()
            row = Schedule(name=name, created_at=now, updated_at=now, **values(self.db.now_ms()))
            try:
                with self.db.atomic():  # a savepoint: a racing create fails alone
                    row.save(using=self.alias, force_insert=True)
            except IntegrityError as error:
                if self._schedules().filter(name=name).exists():
                    raise exc.ScheduleAlreadyExists(name) from error
                raise
        return row

    @operation
    def change(
        self, name: str, values: Callable[[Schedule, int], dict[str, Any] | None]
    ) -> Schedule:
        """Lock schedule ``name`` and write the columns ``values(row, now_ms)`` returns.

        ``values`` may raise (nothing is written) or return None (nothing to write).
        """
        with self.db.atomic():
            row = self._locked(name)
            changes = values(row, self.db.now_ms())
            if not changes:
                return row
            changes["updated_at"] = timezone.now()
            changes["version"] = row.version + 1
            if not self._schedules().filter(name=name, version=row.version).update(**changes):
                raise _Conflict(name)
            for key, value in changes.items():
                setattr(row, key, value)
        return row

    @operation
    def delete(self, name: str) -> None:
        with self.db.atomic():
            deleted, _ = self._schedules().filter(name=name).delete()
        if not deleted:
            raise exc.ScheduleNotFound(name)

    def _locked(self, name: str) -> Schedule:
        try:
            return self._schedules().select_for_update().get(name=name)
        except Schedule.DoesNotExist:
            raise exc.ScheduleNotFound(name) from None

    # -- starts outside the slots' order: trigger and backfill --------------------------

    @operation
    def trigger(self, name: str, trace: TraceSource | None = None) -> tuple[str, str]:
        """Start a run of schedule ``name`` now (id with milliseconds); return (id, workflow).

        ``trace`` gives each run's trace context, as for :meth:`fire_due`."""
        with self.db.atomic():
            row = self._locked(name)
            now = self.db.now_ms()
            for step in range(1000):  # two triggers in one millisecond take the next one
                run_id = trigger_id(name, now + step)
                if self._start_runs([(run_id, row)], trace):
                    break
            else:  # pragma: no cover - a thousand triggers in one millisecond
                raise exc.WorkflowAlreadyStarted(run_id)
            record = _Record(row, row.next_slot_ms, row.buffered_slot_ms, [run_id], 1)
            record.due_ms = row.next_due_ms
            self._record(record, now)
            self.db.after_commit(TOPIC_RUNNABLE)
        return run_id, row.workflow_name

    @operation
    def backfill(
        self,
        name: str,
        slots: Callable[[Schedule, int], list[int]],
        trace: TraceSource | None = None,
    ) -> tuple[list[str], list[str], str]:
        """Start the runs of the slots ``slots(row, now_ms)`` names that do not exist yet.

        Returns every slot's run id, the ids started now, and the workflow name.
        """
        with self.db.atomic():
            row = self._locked(name)
            now = self.db.now_ms()
            ids = [slot_id(name, slot) for slot in slots(row, now)]
            started: list[str] = []
            for first in range(0, len(ids), INSERT_CHUNK):
                chunk = ids[first : first + INSERT_CHUNK]
                started += self._start_runs([(run_id, row) for run_id in chunk], trace)
            if started:
                record = _Record(row, row.next_slot_ms, row.buffered_slot_ms, started)
                record.new_runs = len(started)
                record.due_ms = row.next_due_ms
                self._record(record, now)
                self.db.after_commit(TOPIC_RUNNABLE)
        return ids, started, row.workflow_name

    # -- the leader's duty ----------------------------------------------------------------

    @operation
    def probe_due(self) -> bool:
        """Whether any schedule needs the leader now (one read, no lock)."""
        params = {"paused": False, "running": str(WorkflowStatus.RUNNING)}
        return bool(self.db._fetch(sql.SCHEDULES_DUE_PROBE, params))

    @operation
    def fire_due(self, limit: int, trace: TraceSource | None = None) -> FireResult:
        """Handle up to ``limit`` schedules that need it, in one transaction.

        A schedule needs the leader when its next slot is due, or when it holds a
        slot back and its last run has closed. Each one's plan is applied: its runs
        started, the last run asked to cancel (``cancel_other``), the bookkeeping
        written. A plan that cannot be made is recorded as the schedule's
        ``last_error`` and tried again a minute later; the others go on.
        ``trace(run id, schedule)``, when given, returns the trace context each new
        run stores (JSON text or None), asked inside the transaction.
        """
        result = FireResult()
        if limit <= 0 or not self.probe_due():
            return result
        with self.db.atomic():
            now = self.db.now_ms()
            rows = list(
                self._schedules()
                .due(now)
                .order_by("next_due_ms")
                .select_for_update(skip_locked=True)[:limit]
            )
            if len(rows) < limit:
                running = WorkflowInstance.objects.using(self.alias).filter(
                    instance_id=OuterRef("last_run_id"), status=WorkflowStatus.RUNNING
                )
                taken = [row.name for row in rows]
                rows += list(
                    self._schedules()
                    .buffered()
                    .exclude(name__in=taken)
                    .filter(~Exists(running))
                    .order_by("buffered_slot_ms")
                    .select_for_update(skip_locked=True)[: limit - len(rows)]
                )
            if not rows:
                return result
            statuses = self._statuses([row.last_run_id for row in rows if row.last_run_id])
            records: list[_Record] = []
            starts: list[tuple[str, Schedule]] = []
            for row in rows:
                record = self._plan(row, now, statuses.get(row.last_run_id) == "running")
                if record is None:
                    continue
                records.append(record)
                starts += [(run_id, row) for run_id in record.started]
            inserted: set[str] = set()
            for first in range(0, len(starts), INSERT_CHUNK):
                inserted.update(self._start_runs(starts[first : first + INSERT_CHUNK], trace))
            for record in records:
                record.new_runs = sum(run_id in inserted for run_id in record.started)
                self._record(record, now)
            if inserted:
                self.db.after_commit(TOPIC_RUNNABLE)
            result.schedules = len(records)
            result.started = [
                (run_id, row.workflow_name) for run_id, row in starts if run_id in inserted
            ]
        return result

    def _plan(self, row: Schedule, now: int, last_running: bool) -> _Record | None:
        """The record of one schedule's plan at ``now``; None when it changes nothing."""
        try:
            decided = plan(
                name=row.name,
                rule=rule_of(row),
                overlap=row.overlap,
                catchup_ms=row.catchup_window_ms,
                jitter_ms=row.jitter_ms,
                next_slot_ms=row.next_slot_ms,
                buffered_slot_ms=row.buffered_slot_ms,
                last_running=last_running,
                now_ms=now,
            )
        except Exception as error:  # a row edited by hand into something no plan can read
            logger.exception(
                "schedule %s cannot be planned", row.name, extra={"schedule": row.name}
            )
            record = _Record(row, row.next_slot_ms, row.buffered_slot_ms)
            record.last_error = f"{type(error).__name__}: {error}"[:2000]
            record.due_ms = now + PLAN_ERROR_RETRY_MS
            return record
        if not decided.changes(row.next_slot_ms, row.buffered_slot_ms):
            expected = due_ms(row, row.next_slot_ms)
            if row.next_due_ms == expected:
                return None
            record = _Record(row, row.next_slot_ms, row.buffered_slot_ms)  # jitter changed
            record.due_ms = expected
            return record
        if decided.cancel_last and not self._cancel(row, now):
            return None  # its last run is held by another transaction: next round
        record = _Record(
            row,
            decided.next_slot_ms,
            decided.buffered_slot_ms,
            [slot_id(row.name, slot) for slot in decided.starts],
            missed=decided.missed,
            overlap_skipped=decided.overlap_skipped,
        )
        record.due_ms = due_ms(row, decided.next_slot_ms)
        return record

    def _cancel(self, row: Schedule, now: int) -> bool:
        """Ask the last run of ``row`` to cancel (cancel_other); False if its row is busy."""
        if not self.db._lock_instance(row.last_run_id, skip_locked=True):
            return False
        reason = f"schedule {row.name!r}: a newer slot is due (overlap cancel_other)"
        cancel = {
            "cancel_requested": True,
            "reason": reason,
            "instance_id": row.last_run_id,
            "running": str(WorkflowStatus.RUNNING),
        }
        if self.db._execute(sql.CANCEL_RUN, {**cancel, **self.db.wake_params()}):
            self.db.after_commit(TOPIC_RUNNABLE)
        return True

    def _statuses(self, run_ids: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        unique = sorted(set(run_ids))
        for first in range(0, len(unique), 500):
            chunk = unique[first : first + 500]
            statement = sql.compose(sql.RUN_STATUSES, ids=sql.marks(len(chunk), "run"))
            rows = self.db._fetch(statement, sql.numbered("run", chunk))
            found.update((str(i), str(s)) for i, s in rows)
        return found

    def _start_runs(
        self, runs: Sequence[tuple[str, Schedule]], trace: TraceSource | None = None
    ) -> list[str]:
        """Insert the runs that do not exist yet (one statement); return their ids."""
        if not runs:
            return []
        now = timezone.now()
        columns = ""
        rows: list[tuple[str, dict[str, Any]]] = []
        for offset, (run_id, schedule) in enumerate(runs):
            columns, marks, values = self.db._insert_parts(
                WorkflowInstance,
                {
                    "instance_id": run_id,
                    "workflow_name": schedule.workflow_name,
                    "status": str(WorkflowStatus.RUNNING),
                    "input": schedule.input,
                    "runnable": True,
                    "ready_ms": self.db.now_sql(),
                    "created_seq": self.db._next_seq_sql(offset),
                    "started_at": now,
                    "updated_at": now,
                    "code_version": self.options.code_version,
                    "trace_context": None if trace is None else trace(run_id, schedule),
                },
                skip_pk=False,
                name=f"run{offset}",
            )
            rows.append((f"({marks})", values))
        return self.db._insert_new(sql.compose(sql.START_RUNS, columns=columns), rows)

    def _record(self, record: _Record, now: int) -> None:
        """Write one schedule's bookkeeping under its version (a changed row rolls back)."""
        row = record.schedule
        last_run_id, last_run_ms = row.last_run_id, row.last_run_ms
        recent = json.loads(row.recent_runs or "[]")
        if record.started:
            last_run_id, last_run_ms = record.started[-1], now
            recent = [*reversed(record.started), *recent][:RECENT_RUNS]
        updated = self.db._execute(
            sql.RECORD_SCHEDULE,
            {
                "next_slot_ms": record.next_slot_ms,
                "next_due_ms": record.due_ms,
                "buffered_slot_ms": record.buffered_slot_ms,
                "last_run_id": last_run_id,
                "last_run_ms": last_run_ms,
                "recent_runs": json.dumps(recent),
                "new_runs": record.new_runs,
                "missed": record.missed,
                "overlap_skipped": record.overlap_skipped,
                "last_error": record.last_error,
                "updated_at": self.db._now_param(),
                "name": row.name,
                "version": row.version,
            },
        )
        if updated != 1:
            raise _Conflict(row.name)
