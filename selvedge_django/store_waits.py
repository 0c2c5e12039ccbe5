"""Store operations for waits: timers, signals, observations (delivery batches), children.

Mixed into :class:`selvedge_django.store.DjangoStore`; every method is one
transaction. Arrivals (timer fires, signals, child outcomes) never need the
lease; observations always do (they start with the fence check).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import exceptions as exc
from .engine.events import (
    CMD_CHILD,
    CMD_RECEIVE,
    CMD_SLEEP,
    EV_ACTIVITY_CANCELLED,
    EV_CHILD_CANCELLED,
    EV_CHILD_COMPLETED,
    EV_CHILD_FAILED,
    EV_CHILD_START_FAILED,
    EV_TIMER_CANCELLED,
    EV_TIMER_EXPIRED,
    Arrivals,
    Fence,
    HistoryRow,
    error_data,
)
from .engine.ports import ChildSpec, Observation, ObservationResult, SignalMessage
from .models import (
    ActivityTask,
    ActivityTaskStatus,
    HistoryEvent,
    TimerSubscription,
    WorkflowInstance,
    WorkflowStatus,
)
from .models import (
    SignalMessage as SignalRow,
)
from .store_base import Sql, StoreBase

__all__ = ["WaitStoreMixin"]


class WaitStoreMixin(StoreBase):
    """Timers, signals, observations and child starts."""

    # -- timers -------------------------------------------------------------------------

    def reserve_timer(
        self, fence: Fence, row: HistoryRow, expires_at: datetime, delay: float
    ) -> HistoryRow:
        """Reserve a sleep or timed receive and arm its timer, in one fenced transaction.

        The timer fires ``delay`` seconds from now on the database clock (``fire_at_ms``),
        and records ``expires_at``, the workflow time the configured clock gave.
        """
        with self.atomic():
            self._fence(fence, current_step=f"{row.command} until {expires_at.isoformat()}")
            stored = self._insert_row(fence.instance_id, row)
            if stored is row:
                self._insert(
                    TimerSubscription,
                    {
                        "instance_id": fence.instance_id,
                        "key": row.key,
                        "expires_at": expires_at,
                        "fire_at_ms": self.now_sql(max(0.0, delay)),
                    },
                    returning_id=True,  # (the id column is left to the database)
                )
                self.after_commit("timer")
            return stored

    def timer_fired(self, instance_id: str, key: str) -> bool:
        return (
            TimerSubscription.objects.using(self.alias)
            .filter(instance_id=instance_id, key=key, fired=True)
            .exists()
        )

    def fire_due_timers(self, limit: int, fired: list[tuple[str, str, str]] | None = None) -> int:
        """Fire up to ``limit`` timers due on the database clock, in one transaction.

        Returns how many were handled; ``fired`` collects (instance id, key, workflow
        name) of the timers that woke a running instance (those of closed instances
        are discarded).

        Lock order: the instance row first, as on every other write path (a fence,
        a close, an activity arrival), then its timer rows, then its history rows.
        On PostgreSQL one statement picks the due timers together with their
        instance rows and locks both, skipping instances another transaction holds
        (their timers fire at the next round), so a fire never waits for, nor
        deadlocks with, an execution observing its timed receive or closing.
        """
        now = self.now_sql()
        where = f"t.fired = %s AND t.fire_at_ms <= {now.sql}"
        params: list[Any] = [False, *now.params]
        # On SQLite a read first: a write transaction locks the whole database.
        if (
            self.vendor == "sqlite"
            and not self.connection.in_atomic_block
            and not self._fetch(f"SELECT 1 FROM {{timer}} t WHERE {where} LIMIT 1", params)
        ):
            return 0
        lock = " FOR NO KEY UPDATE OF i, t SKIP LOCKED" if self.vendor == "postgresql" else ""
        with self.atomic():
            due = self._fetch(
                "SELECT t.id, t.instance_id, t.key, t.expires_at, i.status, i.workflow_name,"
                " h.command"
                " FROM {timer} t JOIN {instance} i ON i.instance_id = t.instance_id"
                " LEFT JOIN {history} h ON h.instance_id = t.instance_id AND h.key = t.key"
                f" WHERE {where} ORDER BY t.fire_at_ms, t.id LIMIT %s{lock}",
                [*params, limit],
            )
            if not due:
                return 0
            delete_ids: list[int] = []
            mark_ids: list[int] = []
            woken: set[str] = set()
            for timer_id, instance_id, key, expires_at, status, workflow_name, command in due:
                if status != WorkflowStatus.RUNNING:
                    delete_ids.append(timer_id)  # closed: discarded, no history, no wake
                    continue
                if command == CMD_RECEIVE:
                    mark_ids.append(timer_id)
                else:
                    self._execute(
                        "UPDATE {history} SET event_type = %s, data = %s, arrived_at = %s"
                        " WHERE instance_id = %s AND key = %s AND data IS NULL",
                        [
                            EV_TIMER_EXPIRED,
                            json.dumps(self._aware(expires_at).isoformat()),
                            self._now_param(),
                            instance_id,
                            key,
                        ],
                    )
                    delete_ids.append(timer_id)
                woken.add(instance_id)
                if fired is not None:
                    fired.append((instance_id, key, workflow_name))
            if delete_ids:
                TimerSubscription.objects.using(self.alias).filter(id__in=delete_ids).delete()
            if mark_ids:
                TimerSubscription.objects.using(self.alias).filter(id__in=mark_ids).update(
                    fired=True
                )
            if woken:
                WorkflowInstance.objects.using(self.alias).filter(
                    instance_id__in=woken, status=WorkflowStatus.RUNNING
                ).update(**self.wake_fields())
                self.after_commit("runnable")
            return len(due)

    @staticmethod
    def _aware(value: Any) -> datetime:
        """A datetime column read by a hand-written statement, as an aware UTC datetime."""
        if isinstance(value, str):  # SQLite returns the stored text
            parsed = parse_datetime(value)
            if parsed is None:
                raise ValueError(f"not a datetime: {value!r}")
            value = parsed
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def next_timer_due_ms(self) -> int | None:
        """Milliseconds until the next timer fires on the database clock (None: none armed)."""
        now = self.now_sql()
        rows = self._fetch(
            f"SELECT fire_at_ms - {now.sql} FROM {{timer}} WHERE fired = %s"
            " ORDER BY fire_at_ms LIMIT 1",
            [*now.params, False],
        )
        return max(0, int(rows[0][0])) if rows else None

    # -- signals ------------------------------------------------------------------------

    def append_signal(
        self, instance_id: str, channel: str, payload: str, *, max_pending: int | None = None
    ) -> int:
        """Append a signal while the instance runs, and wake it.

        Marking the instance runnable comes first: that update also locks the row,
        so a close committing meanwhile is seen (no signal lands on a closed instance).
        With ``max_pending`` the insert is conditional on the instance holding fewer
        unconsumed signals (counted by the insert itself, after the lock, so
        concurrent signals cannot overshoot); otherwise :class:`InboxFull` is raised
        and nothing is written.
        """
        where = None
        if max_pending is not None:
            # The partial index of pending signals answers the count; LIMIT bounds it.
            where = Sql(
                "(SELECT COUNT(*) FROM (SELECT 1 FROM {signal} WHERE instance_id = %s"
                " AND consumed_seq IS NULL LIMIT %s) pending) < %s",
                [instance_id, max_pending, max_pending],
            )
        wake = self.wake_sql()
        with self.atomic():
            if not self._execute(
                f"UPDATE {{instance}} SET {wake.sql} WHERE instance_id = %s AND status = %s",
                [*wake.params, instance_id, str(WorkflowStatus.RUNNING)],
            ):
                rows = self._fetch(
                    "SELECT status FROM {instance} WHERE instance_id = %s", [instance_id]
                )
                if not rows:
                    raise exc.WorkflowNotFound(instance_id)
                raise exc.InstanceClosed.for_status(instance_id, rows[0][0])
            signal_id = self._insert(
                SignalRow,
                {"instance_id": instance_id, "channel": channel, "payload": payload},
                returning_id=True,
                where=None if where is None else Sql(self._tables(where.sql), where.params),
            )
            if signal_id is None:
                assert max_pending is not None
                raise exc.InboxFull(instance_id, max_pending)
            self.after_commit("runnable")
            return int(signal_id)

    def next_signal(self, instance_id: str, channel: str) -> SignalMessage | None:
        rows = self._fetch(
            "SELECT id, channel, payload FROM {signal} WHERE instance_id = %s AND channel = %s"
            " AND consumed_seq IS NULL ORDER BY id LIMIT 1",
            [instance_id, channel],
        )
        return SignalMessage(*rows[0]) if rows else None

    def signal_payload(self, signal_id: int) -> str | None:
        return (
            SignalRow.objects.using(self.alias)
            .filter(id=signal_id)
            .values_list("payload", flat=True)
            .first()
        )

    # -- cancellation -------------------------------------------------------------------

    def request_cancel(self, instance_id: str, reason: str) -> str:
        """Store a durable cancel request and wake the instance; return its status."""
        with self.atomic():
            status = (
                WorkflowInstance.objects.using(self.alias)
                .filter(instance_id=instance_id)
                .select_for_update(no_key=True)
                .values_list("status", flat=True)
                .first()
            )
            if status is None:
                raise exc.WorkflowNotFound(instance_id)
            if status == WorkflowStatus.CANCELLED:
                return str(status)
            if status != WorkflowStatus.RUNNING:
                raise exc.InstanceClosed.for_status(instance_id, status)
            WorkflowInstance.objects.using(self.alias).filter(
                instance_id=instance_id, cancel_requested=False
            ).update(cancel_requested=True, cancel_reason=reason)
            WorkflowInstance.objects.using(self.alias).filter(instance_id=instance_id).update(
                **self.wake_fields()
            )
            self.after_commit("runnable")
            return str(status)

    def cancel_state(self, instance_id: str) -> tuple[bool, str]:
        rows = self._fetch(
            "SELECT cancel_requested, cancel_reason FROM {instance} WHERE instance_id = %s",
            [instance_id],
        )
        if not rows:
            return False, ""
        return bool(rows[0][0]), str(rows[0][1])

    def _request_child_cancel(
        self, parent_id: str, children: list[tuple[str, str]], reason: str
    ) -> None:
        """Ask running children of ``parent_id`` to cancel; each is (child id, parent key).

        The parent and key conditions make sure that only an instance this parent
        created from that command is reached: an id the parent named but never
        created (a cancelled scope, a failed duplicate start) may belong to anyone.
        """
        if not children:
            return
        for part in self._chunks(children, values_each=2):
            mine = WorkflowInstance.objects.using(self.alias).filter(
                instance_id__in=[child_id for child_id, _ in part],
                parent_instance_id=parent_id,
                parent_key__in=[key for _, key in part],
                status=WorkflowStatus.RUNNING,
            )
            mine.filter(cancel_requested=False).update(cancel_requested=True, cancel_reason=reason)
            mine.update(**self.wake_fields())
        self.after_commit("runnable")

    # -- observations -------------------------------------------------------------------

    def arrivals(self, instance_id: str) -> Arrivals:
        keys = (
            HistoryEvent.objects.using(self.alias)
            .filter(instance_id=instance_id, delivered_seq__isnull=True, data__isnull=False)
            .exclude(seq__isnull=True)
        )
        signals = SignalRow.objects.using(self.alias).filter(
            instance_id=instance_id, delivered_seq__isnull=True
        )
        return Arrivals(
            keys=tuple(keys.order_by("id").values_list("key", flat=True)),
            signals=tuple(signals.order_by("id").values_list("id", "channel")),
        )

    def observe(self, fence: Fence, observation: Observation) -> ObservationResult:
        iid = fence.instance_id
        seq = observation.seq
        with self.atomic():
            self._fence(fence)
            consumed = True
            if observation.consume is not None:
                consumed = bool(
                    self._execute(
                        "UPDATE {signal} SET consumed_seq = %s, consumed_key = %s"
                        " WHERE id = %s AND instance_id = %s AND consumed_seq IS NULL",
                        [
                            seq,
                            (
                                observation.record or observation.fill or HistoryRow("", None, "")
                            ).key,
                            observation.consume,
                            iid,
                        ],
                    )
                )
                if not consumed:
                    transaction.set_rollback(True, using=self.alias)
                    return ObservationResult(None, Arrivals(), consumed=False)
            stored: HistoryRow | None = None
            if observation.record is not None:
                stored = self._insert_row(iid, observation.record)
            elif observation.fill is not None:
                fill = observation.fill
                HistoryEvent.objects.using(self.alias).filter(
                    instance_id=iid, key=fill.key, data__isnull=True
                ).update(event_type=fill.event_type, data=fill.data, arrived_at=timezone.now())
                stored = self.get_row(iid, fill.key)
            if observation.retire_timer is not None:
                TimerSubscription.objects.using(self.alias).filter(
                    instance_id=iid, key=observation.retire_timer
                ).delete()
            for key, event_type, data in observation.fill_cancelled:
                HistoryEvent.objects.using(self.alias).filter(
                    instance_id=iid, key=key, data__isnull=True
                ).update(event_type=event_type, data=data, delivered_seq=seq)
            for keys in self._chunks(list(observation.cancel_tasks)):
                ActivityTask.objects.using(self.alias).filter(
                    instance_id=iid,
                    key__in=keys,
                    status__in=(ActivityTaskStatus.QUEUED, ActivityTaskStatus.RUNNING),
                ).update(status=ActivityTaskStatus.CANCELLED, claim_owner="", claim_expires_ms=None)
                TimerSubscription.objects.using(self.alias).filter(
                    instance_id=iid, key__in=keys
                ).delete()
            if observation.cancel_children:
                self._request_child_cancel(
                    iid,
                    list(observation.cancel_children),
                    observation.cancel_reason or "cancelled by parent",
                )
            delivered = self._deliver(iid, seq, observation)
        return ObservationResult(stored, delivered, consumed)

    def _deliver(self, iid: str, seq: int, observation: Observation) -> Arrivals:
        """Mark a delivery batch (everything arrived, or exactly what a predicate saw)."""
        key_lists: list[list[Any]]
        signal_lists: list[list[Any]]
        if observation.deliver_all:
            key_lists, signal_lists = [[]], [[]]
        elif observation.deliver is not None:
            wanted = observation.deliver
            if not wanted.keys and not wanted.signals:
                return Arrivals()
            key_lists = self._chunks(list(wanted.keys))
            signal_lists = self._chunks([sid for sid, _ in wanted.signals])
        else:
            return Arrivals()
        if not self.connection.features.can_return_columns_from_insert:
            return self._deliver_read_first(iid, seq, observation)
        key_rows: list[tuple[Any, ...]] = []
        signal_rows: list[tuple[Any, ...]] = []
        for keys in key_lists:
            key_rows += self._fetch(
                "UPDATE {history} SET delivered_seq = %s WHERE instance_id = %s"
                " AND delivered_seq IS NULL AND data IS NOT NULL AND seq IS NOT NULL"
                f"{self._in('key', keys)} RETURNING id, key",
                [seq, iid, *keys],
            )
        for ids in signal_lists:
            signal_rows += self._fetch(
                "UPDATE {signal} SET delivered_seq = %s WHERE instance_id = %s"
                f" AND delivered_seq IS NULL{self._in('id', ids)} RETURNING id, channel",
                [seq, iid, *ids],
            )
        return Arrivals(
            keys=tuple(key for _, key in sorted(key_rows)),
            signals=tuple((int(sid), str(channel)) for sid, channel in sorted(signal_rows)),
        )

    # A list of keys or ids (a delivery batch, the tasks or children a cancellation
    # reaches) binds at most this many values per statement (PostgreSQL takes 65,535
    # parameters with server-side binding, SQLite 32,766 by default).
    DELIVERY_CHUNK = 5000

    @classmethod
    def _chunks(cls, values: list[Any], *, values_each: int = 1) -> list[list[Any]]:
        """A list in statement-sized parts (``values_each`` bound values per item); no
        part at all when the list is empty."""
        size = max(1, cls.DELIVERY_CHUNK // values_each)
        return [values[i : i + size] for i in range(0, len(values), size)]

    @staticmethod
    def _in(column: str, values: list[Any]) -> str:
        """`` AND column IN (...)`` for one part of a delivery batch; empty means every row."""
        if not values:
            return ""
        return f" AND {column} IN ({', '.join(['%s'] * len(values))})"

    def _deliver_read_first(self, iid: str, seq: int, observation: Observation) -> Arrivals:
        """_deliver for databases without UPDATE ... RETURNING (SQLite before 3.35)."""
        events = HistoryEvent.objects.using(self.alias).filter(
            instance_id=iid, delivered_seq__isnull=True, data__isnull=False, seq__isnull=False
        )
        signals = SignalRow.objects.using(self.alias).filter(
            instance_id=iid, delivered_seq__isnull=True
        )
        if observation.deliver_all:
            keys = tuple(events.order_by("id").values_list("key", flat=True))
            sigs = tuple(signals.order_by("id").values_list("id", "channel"))
        else:
            assert observation.deliver is not None
            wanted = observation.deliver
            found: list[tuple[int, str]] = []
            for part in self._chunks(list(wanted.keys)):
                found += events.filter(key__in=part).values_list("id", "key")
            keys = tuple(key for _, key in sorted(found))
            sigs = tuple(
                sorted(
                    signal
                    for part in self._chunks([sid for sid, _ in wanted.signals])
                    for signal in signals.filter(id__in=part).values_list("id", "channel")
                )
            )
        for part in self._chunks(list(keys)):
            events.filter(key__in=part).update(delivered_seq=seq)
        for part in self._chunks([sid for sid, _ in sigs]):
            signals.filter(id__in=part).update(delivered_seq=seq)
        return Arrivals(keys=keys, signals=sigs)

    # -- children -----------------------------------------------------------------------

    def start_child(self, fence: Fence, row: HistoryRow, child: ChildSpec) -> HistoryRow:
        with self.atomic():
            self._fence(fence, current_step=f"child {child.workflow_name} {child.instance_id}")
            stored = self._insert_row(fence.instance_id, row)
            if stored is not row:
                return stored
            now = timezone.now()
            try:
                with transaction.atomic(using=self.alias):
                    WorkflowInstance.objects.using(self.alias).create(
                        instance_id=child.instance_id,
                        workflow_name=child.workflow_name,
                        input=child.input,
                        status=WorkflowStatus.RUNNING,
                        runnable=True,
                        ready_ms=self.now_expr(),
                        parent_instance_id=fence.instance_id,
                        parent_key=row.key,
                        started_at=now,
                        updated_at=now,
                    )
            except IntegrityError:
                attached = self._reattach_child(fence, row, child)
                if attached is not None:
                    return attached
                data = error_data(exc.WorkflowAlreadyStarted(child.instance_id))
                HistoryEvent.objects.using(self.alias).filter(
                    instance_id=fence.instance_id, key=row.key
                ).update(event_type=EV_CHILD_START_FAILED, data=data, delivered_seq=row.seq)
                stored = HistoryRow(
                    row.key,
                    row.seq,
                    row.command,
                    EV_CHILD_START_FAILED,
                    data,
                    row.reservation,
                    row.seq,
                )
            else:
                self.after_commit("runnable")
            return stored

    def _reattach_child(self, fence: Fence, row: HistoryRow, child: ChildSpec) -> HistoryRow | None:
        """A child start whose id is taken by this very child: re-attach to it.

        A resumed (or re-run) parent starts again, under the same key, a child it
        started in an archived part of its history. When the existing instance is
        that child (this parent, this key, the same workflow), its outcome is the
        command's: a closed child's arrives now (recorded, undelivered, the parent
        woken), a running child's arrives at its close, as for any child. None when
        the id belongs to another instance.
        """
        found = (
            WorkflowInstance.objects.using(self.alias)
            .filter(
                instance_id=child.instance_id,
                parent_instance_id=fence.instance_id,
                parent_key=row.key,
                workflow_name=child.workflow_name,
            )
            .values_list("status", "output", "error")
            .first()
        )
        if found is None:
            return None
        status, output, error = found
        if status == WorkflowStatus.RUNNING:
            return row
        event = {
            WorkflowStatus.COMPLETED: EV_CHILD_COMPLETED,
            WorkflowStatus.FAILED: EV_CHILD_FAILED,
            WorkflowStatus.CANCELLED: EV_CHILD_CANCELLED,
        }[WorkflowStatus(status)]
        data = output if status == WorkflowStatus.COMPLETED else error
        HistoryEvent.objects.using(self.alias).filter(
            instance_id=fence.instance_id, key=row.key, data__isnull=True
        ).update(event_type=event, data=data, arrived_at=timezone.now())
        wake = self.wake_sql()
        self._execute(
            f"UPDATE {{instance}} SET {wake.sql} WHERE instance_id = %s",
            [*wake.params, fence.instance_id],
        )
        # An arrival, as a child closing now would make it: the next wait delivers it.
        return row

    def _wake_waiting_parent(
        self, iid: str, parent: tuple[str, str] | None
    ) -> tuple[str, str] | None:
        """The first statement of a child's close: lock the parent's row and wake it.

        Only a running parent whose child command still waits for an outcome is
        woken (and so locked until this close commits, so it cannot close meanwhile);
        its (id, key) is returned for :meth:`_close_cascade` to fill. None when there
        is no parent, or it closed (a parent's history never changes after its
        close: the child's outcome stays in the child's own record), or it already
        has the outcome (a cancelled scope resolved it). ``parent`` is (id, key)
        when known, None to read it.
        """
        if parent is None:
            rows = self._fetch(
                "SELECT parent_instance_id, parent_key FROM {instance} WHERE instance_id = %s",
                [iid],
            )
            parent = (str(rows[0][0]), str(rows[0][1])) if rows else ("", "")
        parent_id, parent_key = parent
        if not parent_id:
            return None
        wake = self.wake_sql()
        woken = self._execute(
            f"UPDATE {{instance}} SET {wake.sql} WHERE instance_id = %s AND status = %s"
            " AND EXISTS (SELECT 1 FROM {history} WHERE instance_id = %s AND key = %s"
            " AND command = %s AND data IS NULL)",
            [
                *wake.params,
                parent_id,
                str(WorkflowStatus.RUNNING),
                parent_id,
                parent_key,
                CMD_CHILD,
            ],
        )
        if not woken:
            return None
        self.after_commit("runnable")
        return parent_id, parent_key

    def _close_cascade(
        self,
        iid: str,
        status: str,
        data: str | None,
        *,
        children: bool = True,
        parent: tuple[str, str] | None = None,
    ) -> None:
        """What a close does to children and the parent (inside the close transaction).

        ``children`` False skips the child lookup (the history started none);
        ``parent`` is the (parent id, parent key) that :meth:`_wake_waiting_parent`
        locked and woke, whose child row gets this close's outcome; None: nothing
        to fill.
        """
        if children:
            # The partial index's own condition, repeated, and the status checked here:
            # otherwise SQLite scans every running instance through the status index.
            running = [
                (child_id, key)
                for child_id, key, child_status in WorkflowInstance.objects.using(self.alias)
                .filter(parent_instance_id=iid)
                .exclude(parent_instance_id="")
                .order_by()
                .values_list("instance_id", "parent_key", "status")
                if child_status == WorkflowStatus.RUNNING
            ]
            self._request_child_cancel(iid, running, f"parent {iid} closed")
        if parent is None:
            return
        parent_id, parent_key = parent
        event = {
            WorkflowStatus.COMPLETED: EV_CHILD_COMPLETED,
            WorkflowStatus.FAILED: EV_CHILD_FAILED,
            WorkflowStatus.CANCELLED: EV_CHILD_CANCELLED,
        }[WorkflowStatus(status)]
        HistoryEvent.objects.using(self.alias).filter(
            instance_id=parent_id, key=parent_key, command=CMD_CHILD, data__isnull=True
        ).update(event_type=event, data=data, arrived_at=timezone.now())

    def _close_cleanup(self, iid: str, *, fill: bool = True) -> None:
        """Cancel unfinished tasks and timers of a closing instance.

        With ``fill`` the history rows of unfinished activities and sleeps get a
        cancellation as their value (the workflow code closed without them); a
        terminate leaves them as they are.
        """
        ActivityTask.objects.using(self.alias).filter(
            instance_id=iid,
            status__in=(ActivityTaskStatus.QUEUED, ActivityTaskStatus.RUNNING),
        ).update(status=ActivityTaskStatus.CANCELLED, claim_owner="", claim_expires_ms=None)
        if not fill:
            TimerSubscription.objects.using(self.alias).filter(instance_id=iid).delete()
            return
        closed = error_data(exc.Cancelled("workflow closed before it finished"))
        unfinished = HistoryEvent.objects.using(self.alias).filter(
            instance_id=iid, data__isnull=True
        )
        unfinished.filter(command="activity").update(event_type=EV_ACTIVITY_CANCELLED, data=closed)
        unfinished.filter(command=CMD_SLEEP).update(event_type=EV_TIMER_CANCELLED, data=closed)
        TimerSubscription.objects.using(self.alias).filter(instance_id=iid).delete()
