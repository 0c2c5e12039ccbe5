"""Store operations that bring a run back: resume (in place) and fork (a new instance).

The part ``store.recovery`` of :class:`~.store.Store`; each public method is one
transaction that takes the instance row first and is guarded by the status it
read. Nothing recorded is deleted: the rows a resume takes out of the current
history move, as they were, to the archive table under the generation they
belonged to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import exceptions as exc
from ..engine.events import (
    CLOSE_KEY,
    CMD_CLOSE,
    EV_ACTIVITY_CANCELLED,
    EV_ACTIVITY_FAILED,
    EV_AWAIT_CANCELLED,
    EV_CHILD_CANCELLED,
    EV_CHILD_FAILED,
    EV_CHILD_START_FAILED,
    EV_SIGNAL_CANCELLED,
    EV_TIMER_CANCELLED,
    EV_WORKFLOW_CONTINUED,
    Fence,
    HistoryRow,
)
from ..engine.identifiers import check_instance_id
from ..models import WorkflowInstance, WorkflowStatus
from . import sql
from .attributes import Attributes
from .children import Children
from .db import Database
from .operation import operation
from .options import StoreOptions
from .starts import Starts, input_field

__all__ = [
    "CLOSED_UNFINISHED_MESSAGE",
    "TERMINATED_TYPE",
    "Recovery",
    "ResumeOutcome",
    "closed_kind",
]

# An id past every row (the cut of a running source without a key).
_PAST_ID = 2**62
# A position past every recorded one (a cut at the close, or a running source's end).
_PAST_EVERY_POSITION = 2**62

# The error type of a terminated run (closed as failed with it).
TERMINATED_TYPE = exc.WorkflowTerminated.__name__

# The message of the cancellation a close writes into the rows it left unfinished.
CLOSED_UNFINISHED_MESSAGE = "workflow closed before it finished"

# Event types whose value can be the failure that closed the run.
_FAILURE_EVENTS = (EV_ACTIVITY_FAILED, EV_CHILD_FAILED, EV_CHILD_START_FAILED)
# Event types a close writes into the rows it leaves unfinished.
_CLOSE_FILLED_EVENTS = (EV_ACTIVITY_CANCELLED, EV_TIMER_CANCELLED)
# Event types whose value can be the cancel request that closed the run (as the wait
# that observed it recorded it; activity and timer rows are among the close-filled).
_CANCEL_EVENTS = (EV_SIGNAL_CANCELLED, EV_AWAIT_CANCELLED, EV_CHILD_CANCELLED)

# -- statements ----------------------------------------------------------------------------

# What a resume reads of the instance (after taking its row lock on PostgreSQL).
SELECT_RESUME_HEAD = (
    "SELECT status, workflow_name, generation, error FROM {instance}"
    " WHERE instance_id = %(instance_id)s"
)
# The rows that decide where a resume cuts: the close, the requested key, failures,
# cancellations, and rows a close left without a value or filled with its cancellation.
# Bounded by what failed, was cancelled or was left open, not by the history's length.
SELECT_RESUME_CANDIDATES = (
    "SELECT id, key, seq, event_type, data FROM {history} WHERE instance_id = %(instance_id)s"
    " AND (key = %(close_key)s OR key = %(from_key)s OR data IS NULL"
    " OR event_type IN ({events}))"
    " ORDER BY id"
)
# Running again under a new lease epoch and the next generation, guarded by the status
# and generation that were read.
RESUME_INSTANCE = (
    "UPDATE {instance} SET status = %(running)s, output = NULL, error = NULL, error_type = '',"
    " lease_owner = '',"
    " lease_expires_ms = NULL, lease_epoch = lease_epoch + 1, runnable = %(runnable)s,"
    " ready_ms = {now}, execution_deadline_ms = {now} + execution_timeout_ms,"
    " closed_at = NULL, cancel_requested = %(cancel_requested)s, cancel_reason = '',"
    " cancel_trace_context = NULL, execution_errors = 0, execution_error = '', current_step = '',"
    " generation = generation + 1, resumed_count = resumed_count + 1,"
    " updated_at = %(updated_at)s, parked_seq = 0, parked_key = ''"
    " WHERE instance_id = %(instance_id)s AND status = %(status)s"
    " AND generation = %(generation)s"
)
# Copy the rows from the cut on into the archive, as they are.
ARCHIVE_ROWS = (
    "INSERT INTO {archive} (instance_id, generation, event_id, key, seq, command, event_type,"
    " data, reservation, delivered_seq, created_at, arrived_at, archived_at, task)"
    " SELECT instance_id, %(generation)s, id, key, seq, command, event_type, data, reservation,"
    " delivered_seq, created_at, arrived_at, %(archived_at)s, NULL FROM {history}"
    " WHERE instance_id = %(instance_id)s AND id >= %(cut_id)s"
)
# The activity tasks of the archived rows (their summary goes with the archived row).
SELECT_ARCHIVED_TASKS = (
    "SELECT key, name, queue, status, attempts, failures, last_error FROM {task}"
    " WHERE instance_id = %(instance_id)s AND key IN"
    " (SELECT key FROM {history} WHERE instance_id = %(instance_id)s AND id >= %(cut_id)s)"
)
# One archived row's task summary.
ARCHIVE_TASK = (
    "UPDATE {archive} SET task = %(task)s WHERE instance_id = %(instance_id)s"
    " AND generation = %(generation)s AND key = %(key)s"
)
# The archived rows' tasks leave the task table: the re-run reserves its own.
DELETE_ARCHIVED_TASKS = (
    "DELETE FROM {task} WHERE instance_id = %(instance_id)s AND key IN"
    " (SELECT key FROM {history} WHERE instance_id = %(instance_id)s AND id >= %(cut_id)s)"
)
# Signals consumed or delivered by the archived part go back to the inbox (their ids,
# and so their order, unchanged).
RETURN_SIGNALS = (
    "UPDATE {signal} SET delivered_seq = NULL, consumed_seq = NULL, consumed_key = ''"
    " WHERE instance_id = %(instance_id)s AND archived_generation IS NULL"
    " AND (consumed_seq >= %(seq_bound)s OR delivered_seq >= %(seq_bound)s OR consumed_key IN"
    " (SELECT key FROM {history} WHERE instance_id = %(instance_id)s AND id >= %(cut_id)s))"
)
# Values of kept rows that the archived part delivered are undelivered again: the re-run
# delivers them at its own waits.
UNDELIVER_ROWS = (
    "UPDATE {history} SET delivered_seq = NULL"
    " WHERE instance_id = %(instance_id)s AND id < %(cut_id)s AND delivered_seq >= %(seq_bound)s"
)
# The keys one generation archived, in their order.
SELECT_ARCHIVED_KEYS = (
    "SELECT key FROM {archive} WHERE instance_id = %(instance_id)s"
    " AND generation = %(generation)s ORDER BY event_id"
)
# What a fork reads of its source.
SELECT_FORK_SOURCE = (
    "SELECT status, workflow_name, error, service_name, execution_timeout_ms, priority"
    " FROM {instance} WHERE instance_id = %(instance_id)s"
)
# How many forks of the source exist (the default id of the next one counts from it).
COUNT_FORKS = "SELECT count(*) FROM {instance} WHERE forked_from = %(instance_id)s"
# The fork names its source.
MARK_FORK = "UPDATE {instance} SET forked_from = %(source)s WHERE instance_id = %(instance_id)s"
# A copy of the source's rows before the cut, positions and values as they are.
COPY_ROWS = (
    "INSERT INTO {history} (instance_id, key, seq, command, event_type, data, reservation,"
    " delivered_seq, created_at, arrived_at) SELECT %(instance_id)s, key, seq, command,"
    " event_type, data, reservation, delivered_seq, %(created_at)s, arrived_at FROM {history}"
    " WHERE instance_id = %(source)s AND id < %(cut_id)s AND key <> %(close_key)s ORDER BY id"
)
# A copy of the source's signals, in their order, with their idempotency keys; what the
# source consumed or delivered from the cut on is pending again in the copy.
COPY_SIGNALS = (
    "INSERT INTO {signal} (instance_id, channel, payload, sent_at, delivered_seq,"
    " consumed_seq, consumed_key, idempotency_key)"
    " SELECT %(instance_id)s, channel, payload, sent_at,"
    " CASE WHEN delivered_seq < %(bound)s AND (consumed_seq IS NULL OR consumed_seq < %(bound)s)"
    " THEN delivered_seq END,"
    " CASE WHEN consumed_seq < %(bound)s THEN consumed_seq END,"
    " CASE WHEN consumed_seq < %(bound)s THEN consumed_key ELSE '' END, idempotency_key"
    " FROM {signal} WHERE instance_id = %(source)s AND archived_generation IS NULL ORDER BY id"
)
# The archived rows leave the current history (their copy is in the archive).
REMOVE_ARCHIVED_ROWS = (
    "DELETE FROM {history} WHERE instance_id = %(instance_id)s AND id >= %(cut_id)s"
)
# continue-as-new, under the fence: the next input, the next generation (which begins
# the new history), a new lease epoch, the lease released and the instance runnable.
CONTINUE_INSTANCE = (
    "UPDATE {instance} SET input = %(input)s, lease_owner = '', lease_expires_ms = NULL,"
    " lease_epoch = lease_epoch + 1, runnable = %(runnable)s, ready_ms = {now},"
    " execution_errors = 0, execution_error = '', current_step = '',"
    " generation = generation + 1, history_generation = generation + 1,"
    " updated_at = %(updated_at)s, parked_seq = 0, parked_key = ''"
    " WHERE instance_id = %(instance_id)s AND lease_owner = %(owner)s"
    " AND lease_epoch = %(epoch)s AND status = %(running)s"
)
# The generation continue-as-new opened.
SELECT_GENERATION = "SELECT generation FROM {instance} WHERE instance_id = %(instance_id)s"
# Signals the closed generation consumed stay consumed, marked with it (positions of
# its history, which the next one does not see); delivered_seq is set so that no later
# delivery batch takes them.
ARCHIVE_CONSUMED_SIGNALS = (
    "UPDATE {signal} SET archived_generation = %(generation)s,"
    " delivered_seq = COALESCE(delivered_seq, consumed_seq) WHERE instance_id = %(instance_id)s"
    " AND consumed_seq IS NOT NULL AND archived_generation IS NULL"
)
# Signals it had not consumed carry over, undelivered: the next generation's waits
# deliver them (ids, and so their order, unchanged).
CARRY_SIGNALS = (
    "UPDATE {signal} SET delivered_seq = NULL"
    " WHERE instance_id = %(instance_id)s AND consumed_seq IS NULL"
    " AND delivered_seq IS NOT NULL"
)


@dataclass(frozen=True)
class ResumeOutcome:
    """What a resume did: the workflow, the generation now running, the keys archived."""

    workflow_name: str
    generation: int
    archived_keys: tuple[str, ...]


def _error_identity(text: str | None) -> tuple[Any, Any] | None:
    """(type, message) of an error envelope's JSON text; None when it is not one."""
    if not text:
        return None
    try:
        envelope = json.loads(text)
    except ValueError:
        return None
    if not isinstance(envelope, dict) or "type" not in envelope:
        return None
    return envelope.get("type"), envelope.get("message")


def closed_kind(status: str, error: str | None) -> str:
    """How a run closed: its status, except "terminated" for a run an operator (or its
    execution timeout) terminated, which is failed with ``WorkflowTerminated``."""
    if status == WorkflowStatus.FAILED:
        identity = _error_identity(error)
        if identity is not None and identity[0] == TERMINATED_TYPE:
            return "terminated"
    return status


def _closed_unfinished(event_type: str, data: str | None) -> bool:
    """Whether a row holds the cancellation a close wrote into what it left unfinished."""
    if event_type not in _CLOSE_FILLED_EVENTS:
        return False
    identity = _error_identity(data)
    return identity is not None and identity[1] == CLOSED_UNFINISHED_MESSAGE


class Recovery:
    """Resume: archive the history from a key on and run the instance again; fork; and
    continue-as-new (``store.recovery``). New instances are ``starts``'; what a
    cut-off run left running among its children, ``children``'. Search attributes
    (``attributes``) stay with the instance through a resume and a continue-as-new, and
    a fork copies them."""

    def __init__(
        self,
        db: Database,
        options: StoreOptions,
        *,
        starts: Starts,
        children: Children,
        attributes: Attributes,
    ) -> None:
        self.db = db
        self.options = options
        self.starts = starts
        self.children = children
        self.attributes = attributes

    @operation
    def continue_as_new(self, fence: Fence, input_text: str) -> int:
        """End the generation ``fence`` runs and start the next with ``input_text``, in one
        fenced transaction; return the new generation.

        The fence check is the instance update itself (the new input, the next
        generation, which also begins the new history, a new lease epoch, the
        lease released, runnable). Then, as a close does, unfinished activities
        are cancelled (their rows filled with the cancellation), timers deleted
        and running children asked to cancel; a close record whose value is the
        new input is written; and, as a resume does, every row moves to the
        archive under the generation that ends, with its task's summary (the
        task rows go: the next history reuses keys). Signals that generation
        consumed stay consumed, marked with it; the others carry over,
        undelivered, in their order. Raises :class:`Fenced` when the lease is no
        longer held.
        """
        iid = fence.instance_id
        with self.db.atomic():
            next_input = input_field().get_db_prep_save(json.loads(input_text), self.db.connection)
            updated = self.db._execute(
                CONTINUE_INSTANCE,
                {
                    **self.db._fence_params(fence),
                    "input": next_input,
                    "runnable": True,
                    "updated_at": self.db._now_param(),
                },
            )
            if updated != 1:
                raise self.db._fenced_error(fence)
            self.db.apply_deferred(fence)
            (generation,) = self.db._fetch(SELECT_GENERATION, {"instance_id": iid})[0]
            ended = int(generation) - 1
            self.children._close_cleanup(iid)
            self.db._insert_row(
                iid,
                HistoryRow(CLOSE_KEY, None, CMD_CLOSE, EV_WORKFLOW_CONTINUED, data=input_text),
            )
            every = {"instance_id": iid, "cut_id": 0}
            archived_at = self.db._now_param()
            self.db._execute(
                ARCHIVE_ROWS, {**every, "generation": ended, "archived_at": archived_at}
            )
            self._archive_tasks(iid, ended, 0, keys=False)
            self.db._execute(ARCHIVE_CONSUMED_SIGNALS, {"instance_id": iid, "generation": ended})
            self.db._execute(CARRY_SIGNALS, {"instance_id": iid})
            self.db._execute(REMOVE_ARCHIVED_ROWS, every)
            self.children._request_child_cancel(
                iid, self.children._running_children(iid), f"parent {iid} continued as new"
            )
            self.db.after_commit("runnable")
        return int(generation)

    @operation
    def resume(
        self, instance_id: str, from_key: str | None, *, only_failed: bool = False
    ) -> ResumeOutcome:
        """Run a closed instance again, in place, in one transaction.

        The cut is ``from_key`` (default: the first row holding the failure that
        closed the run; for a cancelled run, the first wait that observed the
        cancel request, so the re-run waits there again instead of meeting the
        recorded cancellation; only the close for a run that did neither on a
        recorded step) or, when earlier, the first row the close left without a value or
        filled with its cancellation (a terminated run's open activity, timer or
        child). Every row from the cut on, the close included, moves to the
        archive under the current generation, with a summary of its activity task
        (whose row goes, so the re-run reserves a fresh one with a fresh retry
        budget); signals the archived part consumed or delivered return to the
        inbox in their order; values of kept rows it delivered are undelivered.
        The instance is running and runnable under a new lease epoch and the next
        generation, with its cancel request withdrawn (a new request cancels it as
        usual); a run started with an
        execution timeout gets a new deadline that long from now (database clock). Raises
        :class:`WorkflowNotFound`, :class:`InvalidWorkflowState` (running) or
        :class:`HistoryKeyConflict` (``from_key`` is not in the history). With
        ``only_failed`` (a bulk resume's rule), a run that did not fail on its own
        (completed, cancelled or terminated) raises :class:`InvalidWorkflowState`
        too, judged by what this transaction read under the row lock.
        """
        with self.db.atomic():
            self.db._lock_instance(instance_id)
            head = self.db._fetch(SELECT_RESUME_HEAD, {"instance_id": instance_id})
            if not head:
                raise exc.WorkflowNotFound(instance_id)
            status, workflow_name, generation, error = head[0]
            if status == WorkflowStatus.RUNNING:
                raise exc.InvalidWorkflowState(
                    instance_id, str(status), f"workflow instance {instance_id!r} is running"
                )
            if only_failed and (kind := closed_kind(str(status), error)) != "failed":
                raise exc.InvalidWorkflowState(
                    instance_id,
                    str(status),
                    f"workflow instance {instance_id!r} is {kind}, not failed",
                )
            cut_id, cut_seq = self._resume_cut(instance_id, from_key, str(status), error)
            now = self.db._now_param()
            resumed = self.db._execute(
                RESUME_INSTANCE,
                {
                    "running": str(WorkflowStatus.RUNNING),
                    "runnable": True,
                    "cancel_requested": False,
                    "updated_at": now,
                    "instance_id": instance_id,
                    "status": str(status),
                    "generation": generation,
                },
            )
            if resumed != 1:  # pragma: no cover - the row lock makes this unreachable
                raise exc.InvalidWorkflowState(instance_id, str(status))
            cut = {"instance_id": instance_id, "cut_id": cut_id}
            self.db._execute(ARCHIVE_ROWS, {**cut, "generation": generation, "archived_at": now})
            archived_keys = self._archive_tasks(instance_id, int(generation), cut_id)
            # A cut at the close (no position) leaves every consumption and delivery.
            seq_bound = cut_seq if cut_seq is not None else _PAST_EVERY_POSITION
            self.db._execute(RETURN_SIGNALS, {**cut, "seq_bound": seq_bound})
            self.db._execute(UNDELIVER_ROWS, {**cut, "seq_bound": seq_bound})
            self.db._execute(REMOVE_ARCHIVED_ROWS, cut)
            self.db.after_commit("runnable")
        return ResumeOutcome(str(workflow_name), int(generation) + 1, archived_keys)

    @operation
    def fork(
        self,
        instance_id: str,
        from_key: str | None,
        new_instance_id: str | None,
        trace: Callable[[str, str], str | None] | None = None,
    ) -> tuple[str, str]:
        """Start a new instance from a copy of another's history before a cut, in one
        transaction; return (the new id, the workflow name).

        The cut is as for :meth:`resume` (a completed source: every row but the
        close; a running one: every row up to the first still waiting for a value).
        The new instance has the source's workflow and input, its priority, its
        execution timeout (counted from the fork), its search attributes, no parent, and
        ``forked_from`` set; it is runnable. The source's signals are copied in
        their order, pending again from the cut on. The source is read, never
        written. The default id is ``<instance_id>/fork-<n>``. ``trace(new id,
        workflow name)``, when given, returns the trace context the new instance
        stores (JSON text or None). Raises
        :class:`WorkflowNotFound`, :class:`HistoryKeyConflict` or
        :class:`WorkflowAlreadyStarted` (the new id is taken).
        """
        with self.db.atomic():
            self.db._lock_instance(instance_id)
            head = self.db._fetch(SELECT_FORK_SOURCE, {"instance_id": instance_id})
            if not head:
                raise exc.WorkflowNotFound(instance_id)
            status, workflow_name, error, service_name, timeout_ms, priority = head[0]
            input_value = (
                WorkflowInstance.objects.using(self.db.alias)
                .filter(instance_id=instance_id)
                .values_list("input", flat=True)
                .get()
            )
            cut_id, cut_seq = self._resume_cut(instance_id, from_key, str(status), error)
            if new_instance_id is None:
                (forks,) = self.db._fetch(COUNT_FORKS, {"instance_id": instance_id})[0]
                new_instance_id = check_instance_id(
                    f"{instance_id}/fork-{int(forks) + 1}", "fork id (the source's id and a count)"
                )
            self.starts.create_instance(
                new_instance_id,
                str(workflow_name),
                input_value,
                service_name=str(service_name),
                code_version=self.options.code_version,
                execution_timeout_ms=None if timeout_ms is None else int(timeout_ms),
                priority=int(priority),
                trace_context=None if trace is None else trace(new_instance_id, str(workflow_name)),
            )
            copy = {"instance_id": new_instance_id, "source": instance_id}
            self.db._execute(MARK_FORK, copy)
            self.attributes.copy(instance_id, new_instance_id)
            created_at = self.db._now_param()
            self.db._execute(
                COPY_ROWS,
                {**copy, "created_at": created_at, "cut_id": cut_id, "close_key": CLOSE_KEY},
            )
            bound = cut_seq if cut_seq is not None else _PAST_EVERY_POSITION
            undelivered = {"instance_id": new_instance_id, "cut_id": _PAST_ID, "seq_bound": bound}
            self.db._execute(UNDELIVER_ROWS, undelivered)
            self.db._execute(COPY_SIGNALS, {**copy, "bound": bound})
        return new_instance_id, str(workflow_name)

    def _resume_cut(
        self, instance_id: str, from_key: str | None, status: str, error: str | None
    ) -> tuple[int, int | None]:
        """The id and position of the first row a resume archives."""
        candidates = (*_FAILURE_EVENTS, *_CLOSE_FILLED_EVENTS, *_CANCEL_EVENTS)
        rows = self.db._fetch(
            sql.compose(SELECT_RESUME_CANDIDATES, events=sql.marks(len(candidates), "event")),
            {
                "instance_id": instance_id,
                "close_key": CLOSE_KEY,
                "from_key": from_key if from_key is not None else CLOSE_KEY,
                **sql.numbered("event", candidates),
            },
        )
        by_key = {str(key): (int(row_id), seq) for row_id, key, seq, _, _ in rows}
        # A running source (a fork) has no close: its end is past every row.
        cut: tuple[int, int | None] = by_key.get(CLOSE_KEY, (_PAST_ID, None))
        if from_key is not None:
            if from_key not in by_key:
                raise exc.HistoryKeyConflict(
                    f"history key {from_key!r} is not in the current history of {instance_id!r}"
                )
            cut = by_key[from_key]
        elif status in (WorkflowStatus.FAILED, WorkflowStatus.CANCELLED):
            # A failed run: the first row holding the failure that closed it. A cancelled
            # run: the first wait that observed the cancel request (the replay would meet
            # it again and raise it, with no request left to close the run as cancelled).
            closing = _error_identity(error)
            events = (
                _FAILURE_EVENTS
                if status == WorkflowStatus.FAILED
                else _CANCEL_EVENTS + _CLOSE_FILLED_EVENTS
            )
            for row_id, _key, seq, event_type, data in rows:
                if (
                    event_type in events
                    and closing is not None
                    and _error_identity(data) == closing
                ):
                    cut = (int(row_id), seq)
                    break
        for row_id, key, seq, event_type, data in rows:
            if key == CLOSE_KEY or int(row_id) >= cut[0]:
                break
            if data is None or _closed_unfinished(str(event_type), data):
                cut = (int(row_id), seq)
                break
        return cut

    def _archive_tasks(
        self, instance_id: str, generation: int, cut_id: int, *, keys: bool = True
    ) -> tuple[str, ...]:
        """Summarise the archived rows' tasks on their archive rows and remove them;
        return the archived keys (with ``keys``; none read without)."""
        cut = {"instance_id": instance_id, "cut_id": cut_id}
        tasks = self.db._fetch(SELECT_ARCHIVED_TASKS, cut)
        for key, name, queue, status, attempts, failures, last_error in tasks:
            summary = {
                "name": name,
                "queue": queue,
                "status": status,
                "attempts": attempts,
                "failures": failures,
                "last_error": last_error,
            }
            self.db._execute(
                ARCHIVE_TASK,
                {
                    "task": json.dumps(summary),
                    "instance_id": instance_id,
                    "generation": generation,
                    "key": key,
                },
            )
        if tasks:
            self.db._execute(DELETE_ARCHIVED_TASKS, cut)
        if not keys:
            return ()
        archived = self.db._fetch(
            SELECT_ARCHIVED_KEYS, {"instance_id": instance_id, "generation": generation}
        )
        return tuple(str(key) for (key,) in archived)
