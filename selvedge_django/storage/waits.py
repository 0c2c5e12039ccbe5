"""Waits: timers, signals and observations (delivery batches).

Every method is one transaction. Arrivals (timer fires, signals) never need the
lease; observations always do (they start with the fence check).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NoReturn

from django.db import transaction
from django.utils import timezone

from .. import exceptions as exc
from ..engine.events import CMD_RECEIVE, EV_TIMER_EXPIRED, Arrivals, Fence, HistoryRow
from ..engine.ports import Observation, ObservationResult, ReceiveOutcome, SignalMessage
from ..models import (
    ActivityTask,
    ActivityTaskStatus,
    HistoryEvent,
    TimerSubscription,
    WorkflowInstance,
    WorkflowStatus,
)
from ..models import (
    SignalMessage as SignalRow,
)
from . import sql
from .children import Children
from .clock import aware_utc
from .db import Database
from .operation import operation
from .sql import Sql
from .wakeups import TOPIC_RUNNABLE, TOPIC_TIMER

__all__ = ["Waits"]


class Waits:
    """Timers, signals and observations (``store.waits``); a cancellation an observation
    carries reaches the instance's children through ``children``."""

    def __init__(self, db: Database, *, children: Children) -> None:
        self.db = db
        self.children = children

    # -- timers -------------------------------------------------------------------------

    @operation
    def reserve_timer(
        self, fence: Fence, row: HistoryRow, expires_at: datetime, delay: float
    ) -> HistoryRow:
        """Reserve a sleep or timed receive and arm its timer, in one fenced transaction.

        The timer fires ``delay`` seconds from now on the database clock (``fire_at_ms``),
        and records ``expires_at``, the workflow time the configured clock gave.
        """
        with self.db.atomic():
            self.db._fence(fence, current_step=f"{row.command} until {expires_at.isoformat()}")
            stored = self.db._insert_row(fence.instance_id, row)
            if stored is row:
                self.db._insert(
                    TimerSubscription,
                    {
                        "instance_id": fence.instance_id,
                        "key": row.key,
                        "expires_at": expires_at,
                        "fire_at_ms": self.db.now_sql(max(0.0, delay)),
                    },
                    returning_id=True,  # (the id column is left to the database)
                )
                self.db.after_commit(TOPIC_TIMER)
            return stored

    @operation
    def timer_fired(self, instance_id: str, key: str) -> bool:
        return (
            TimerSubscription.objects.using(self.db.alias)
            .filter(instance_id=instance_id, key=key, fired=True)
            .exists()
        )

    @operation
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
        # A read first where a write transaction locks the whole database.
        if not self.db._worth_writing(sql.TIMER_DUE_PROBE, {"fired": False}):
            return 0
        with self.db.atomic():
            due = self.db._fetch(
                sql.compose(sql.DUE_TIMERS, lock=self.db.DUE_TIMERS_LOCK),
                {"fired": False, "limit": limit},
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
                    self.db._execute(
                        sql.FILL_HISTORY,
                        {
                            "event_type": EV_TIMER_EXPIRED,
                            "data": json.dumps(aware_utc(expires_at).isoformat()),
                            "arrived_at": self.db._now_param(),
                            "instance_id": instance_id,
                            "key": key,
                        },
                    )
                    delete_ids.append(timer_id)
                woken.add(instance_id)
                if fired is not None:
                    fired.append((instance_id, key, workflow_name))
            if delete_ids:
                TimerSubscription.objects.using(self.db.alias).filter(id__in=delete_ids).delete()
            if mark_ids:
                TimerSubscription.objects.using(self.db.alias).filter(id__in=mark_ids).update(
                    fired=True
                )
            if woken:
                WorkflowInstance.objects.using(self.db.alias).filter(
                    instance_id__in=woken, status=WorkflowStatus.RUNNING
                ).update(**self.db.wake_fields())
                self.db.after_commit(TOPIC_RUNNABLE)
            return len(due)

    @operation
    def next_timer_due_ms(self) -> int | None:
        """Milliseconds until the next timer fires on the database clock (None: none armed)."""
        rows = self.db._fetch(sql.NEXT_TIMER_DUE, {"fired": False})
        return max(0, int(rows[0][0])) if rows else None

    # -- signals ------------------------------------------------------------------------

    @operation
    def append_signal(
        self,
        instance_id: str,
        channel: str,
        payload: str,
        *,
        max_pending: int | None = None,
        idempotency_key: str | None = None,
        trace_context: str | None = None,
    ) -> int:
        """Append a signal while the instance runs, and wake it; return the signal's id.

        ``trace_context`` is the sender's trace context (JSON text), kept with it.

        Marking the instance runnable comes first: that update also locks the row,
        so a close committing meanwhile is seen (no signal lands on a closed instance).
        With ``max_pending`` the insert is conditional on the instance holding fewer
        unconsumed signals (counted by the insert itself, after the lock, so
        concurrent signals cannot overshoot); otherwise :class:`InboxFull` is raised
        and nothing is written.

        With ``idempotency_key`` a signal that key already delivered to the instance
        makes this a no-op (no row, no wake) returning the first signal's id: the
        instance row is locked first, then the partial unique index decides the insert
        (``ON CONFLICT DO NOTHING``), and the wake follows only a new row.
        """
        where = None
        if max_pending is not None:
            # The partial index of pending signals answers the count; LIMIT bounds it.
            where = Sql(
                sql.PENDING_SIGNALS_BELOW,
                {"inbox_instance_id": instance_id, "inbox_limit": max_pending},
            )
        if idempotency_key is not None:
            row = {"channel": channel, "payload": payload, "trace_context": trace_context}
            return self._append_keyed_signal(instance_id, row, where, max_pending, idempotency_key)
        with self.db.atomic():
            if not self.db._wake(instance_id):
                self._not_running(instance_id)
            signal_id = self.db._insert(
                SignalRow,
                {
                    "instance_id": instance_id,
                    "channel": channel,
                    "payload": payload,
                    "trace_context": trace_context,
                },
                returning_id=True,
                where=where,
            )
            if signal_id is None:
                assert max_pending is not None
                raise exc.InboxFull(instance_id, max_pending)
            return int(signal_id)

    def _append_keyed_signal(
        self,
        instance_id: str,
        row: dict[str, Any],
        where: Sql | None,
        max_pending: int | None,
        key: str,
    ) -> int:
        """append_signal with an idempotency key: lock, insert unless the key is there, wake."""
        with self.db.atomic():
            # The instance row first (the one lock order), so racing senders of one key
            # queue here and the second one's insert sees the first one's row.
            self.db._lock_instance(instance_id)
            signal_id = self.db._insert(
                SignalRow,
                {"instance_id": instance_id, **row, "idempotency_key": key},
                returning_id=True,
                where=where,
                on_conflict=sql.SIGNAL_KEY_CONFLICT,
            )
            if signal_id is None:
                status = self.db._fetch(sql.SELECT_STATUS, {"instance_id": instance_id})
                if not status or status[0][0] != WorkflowStatus.RUNNING:
                    self._not_running(instance_id)
                rows = self.db._fetch(sql.SIGNAL_BY_KEY, {"instance_id": instance_id, "key": key})
                if rows:
                    return int(rows[0][0])  # already delivered: nothing written, no wake
                assert max_pending is not None
                raise exc.InboxFull(instance_id, max_pending)
            if not self.db._wake(instance_id):
                self._not_running(instance_id)  # rolls the insert back
            return int(signal_id)

    def _not_running(self, instance_id: str) -> NoReturn:
        """Raise why a signal cannot land: no such instance, or it is closed."""
        rows = self.db._fetch(sql.SELECT_STATUS, {"instance_id": instance_id})
        if not rows:
            raise exc.WorkflowNotFound(instance_id)
        raise exc.InstanceClosed.for_status(instance_id, rows[0][0])

    @operation
    def next_signal(self, instance_id: str, channel: str) -> SignalMessage | None:
        rows = self.db._fetch(sql.NEXT_SIGNAL, {"instance_id": instance_id, "channel": channel})
        return SignalMessage(*rows[0]) if rows else None

    @operation
    def receive_next(
        self, fence: Fence, seq: int, key: str, channel: str, uncancelled: bool
    ) -> ReceiveOutcome | None:
        """Not offered by the portable store: the engine reads, then observes."""
        return None

    @operation
    def signal_payload(self, signal_id: int) -> str | None:
        return (
            SignalRow.objects.using(self.db.alias)
            .filter(id=signal_id)
            .values_list("payload", flat=True)
            .first()
        )

    # -- observations -------------------------------------------------------------------

    @operation
    def arrivals(self, instance_id: str) -> Arrivals:
        keys = (
            HistoryEvent.objects.using(self.db.alias)
            .filter(instance_id=instance_id, delivered_seq__isnull=True, data__isnull=False)
            .exclude(seq__isnull=True)
        )
        signals = SignalRow.objects.using(self.db.alias).filter(
            instance_id=instance_id, delivered_seq__isnull=True
        )
        return Arrivals(
            keys=tuple(keys.order_by("id").values_list("key", flat=True)),
            signals=tuple(signals.order_by("id").values_list("id", "channel")),
        )

    @operation
    def observe(self, fence: Fence, observation: Observation) -> ObservationResult:
        iid = fence.instance_id
        seq = observation.seq
        with self.db.atomic():
            self.db._fence(fence)
            consumed = True
            if observation.consume is not None:
                consumed = bool(
                    self.db._execute(
                        sql.CONSUME_SIGNAL,
                        {
                            "seq": seq,
                            "key": (
                                observation.record or observation.fill or HistoryRow("", None, "")
                            ).key,
                            "signal_id": observation.consume,
                            "instance_id": iid,
                        },
                    )
                )
                if not consumed:
                    transaction.set_rollback(True, using=self.db.alias)
                    return ObservationResult(None, Arrivals(), consumed=False)
            stored: HistoryRow | None = None
            if observation.record is not None:
                stored = self.db._insert_row(iid, observation.record)
            elif observation.fill is not None:
                fill = observation.fill
                HistoryEvent.objects.using(self.db.alias).filter(
                    instance_id=iid, key=fill.key, data__isnull=True
                ).update(event_type=fill.event_type, data=fill.data, arrived_at=timezone.now())
                stored = self.db.get_row(iid, fill.key)
            if observation.retire_timer is not None:
                TimerSubscription.objects.using(self.db.alias).filter(
                    instance_id=iid, key=observation.retire_timer
                ).delete()
            for key, event_type, data in observation.fill_cancelled:
                HistoryEvent.objects.using(self.db.alias).filter(
                    instance_id=iid, key=key, data__isnull=True
                ).update(event_type=event_type, data=data, delivered_seq=seq)
            for keys in self.db._chunks(list(observation.cancel_tasks)):
                ActivityTask.objects.using(self.db.alias).filter(
                    instance_id=iid, key__in=keys
                ).unfinished().update(
                    status=ActivityTaskStatus.CANCELLED, claim_owner="", claim_expires_ms=None
                )
                TimerSubscription.objects.using(self.db.alias).filter(
                    instance_id=iid, key__in=keys
                ).delete()
            if observation.cancel_children:
                self.children._request_child_cancel(
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
            key_lists = self.db._chunks(list(wanted.keys))
            signal_lists = self.db._chunks([sid for sid, _ in wanted.signals])
        else:
            return Arrivals()
        key_rows: list[tuple[Any, ...]] = []
        signal_rows: list[tuple[Any, ...]] = []
        for keys in key_lists:
            key_rows += self.db._fetch(
                sql.compose(sql.DELIVER_HISTORY, keys=sql.in_list("key", len(keys), "key")),
                {"seq": seq, "instance_id": iid, **sql.numbered("key", keys)},
            )
        for ids in signal_lists:
            signal_rows += self.db._fetch(
                sql.compose(sql.DELIVER_SIGNALS, ids=sql.in_list("id", len(ids), "signal")),
                {"seq": seq, "instance_id": iid, **sql.numbered("signal", ids)},
            )
        return Arrivals(
            keys=tuple(key for _, key in sorted(key_rows)),
            signals=tuple((int(sid), str(channel)) for sid, channel in sorted(signal_rows)),
        )

    def _deliver_read_first(self, iid: str, seq: int, observation: Observation) -> Arrivals:
        """_deliver without UPDATE ... RETURNING: read the batch, then mark it (the SQLite
        store uses it before SQLite 3.35)."""
        events = HistoryEvent.objects.using(self.db.alias).filter(
            instance_id=iid, delivered_seq__isnull=True, data__isnull=False, seq__isnull=False
        )
        signals = SignalRow.objects.using(self.db.alias).filter(
            instance_id=iid, delivered_seq__isnull=True
        )
        if observation.deliver_all:
            keys = tuple(events.order_by("id").values_list("key", flat=True))
            sigs = tuple(signals.order_by("id").values_list("id", "channel"))
        else:
            assert observation.deliver is not None
            wanted = observation.deliver
            found: list[tuple[int, str]] = []
            for part in self.db._chunks(list(wanted.keys)):
                found += events.filter(key__in=part).values_list("id", "key")
            keys = tuple(key for _, key in sorted(found))
            sigs = tuple(
                sorted(
                    signal
                    for part in self.db._chunks([sid for sid, _ in wanted.signals])
                    for signal in signals.filter(id__in=part).values_list("id", "channel")
                )
            )
        for part in self.db._chunks(list(keys)):
            events.filter(key__in=part).update(delivered_seq=seq)
        for part in self.db._chunks([sid for sid, _ in sigs]):
            signals.filter(id__in=part).update(delivered_seq=seq)
        return Arrivals(keys=keys, signals=sigs)
