"""Waits on PostgreSQL: a signal and a receive as one statement each.

:class:`PostgresWaits`, the waits part of :class:`~.store.PostgresStore`: a signal
sent outside a transaction (wake the instance, count its inbox, insert the signal)
as one statement where the portable store runs a transaction of two; the wake of a
workflow blocked in ``receive`` (read the cancel state and the oldest signal,
consume it, record the received row, deliver every arrival) as one statement, where
the portable store reads twice and then observes in a transaction of several
statements. Where a statement is not offered (inside a transaction, a signal with an
idempotency key, a receive with an inline result pending) or cannot decide (a
signal racing another write to its instance) the portable path runs whole.
"""

from __future__ import annotations

from django.db import IntegrityError

from ...engine.events import CMD_RECEIVE, EV_SIGNAL_RECEIVED, Arrivals, Fence, HistoryRow
from ...engine.ports import ObservationResult, ReceiveOutcome, SignalMessage
from ...models import SignalMessage as SignalRow
from .. import sql
from ..operation import operation
from ..waits import Waits
from ..wakeups import TOPIC_RUNNABLE
from .db import PostgresDatabase
from .sql import APPEND_SIGNAL, APPEND_SIGNAL_WAKE, RECEIVE_NEXT

__all__ = ["PostgresWaits"]


class PostgresWaits(Waits):
    """Receives in one statement; see the module docstring."""

    db: PostgresDatabase

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
        """append_signal: one statement (``APPEND_SIGNAL``) outside a transaction, which
        commits the wake, the inbox count and the signal together. When it writes
        nothing (the instance closed, unknown, its inbox full, or its row changed since
        the statement's snapshot) the portable transaction runs and decides: it raises
        the error, or appends after a race."""
        if idempotency_key is None and self.db.one_statement:
            signal_id = self._append_in_one_statement(
                instance_id, channel, payload, max_pending, trace_context
            )
            if signal_id is not None:
                return signal_id
        return super().append_signal(
            instance_id,
            channel,
            payload,
            max_pending=max_pending,
            idempotency_key=idempotency_key,
            trace_context=trace_context,
        )

    def _append_in_one_statement(
        self,
        instance_id: str,
        channel: str,
        payload: str,
        max_pending: int | None,
        trace_context: str | None,
    ) -> int | None:
        """The signal's id, or None when the statement wrote nothing."""
        row = {
            "instance_id": instance_id,
            "channel": channel,
            "payload": payload,
            "trace_context": trace_context,
        }
        columns, values, row_params = self.db._insert_parts(
            SignalRow, row, skip_pk=True, name="signal"
        )
        below, below_params = "TRUE", {}
        if max_pending is not None:
            below = sql.PENDING_SIGNALS_BELOW
            below_params = {"inbox_instance_id": instance_id, "inbox_limit": max_pending}
        wake, wake_params = self.db._wake_sql(
            instance_id, sql.compose(APPEND_SIGNAL_WAKE, below=below), below_params
        )
        notify, notify_params = self.db.notifier.from_cte("s", [TOPIC_RUNNABLE])
        statement = sql.compose(
            APPEND_SIGNAL, wake=wake, columns=columns, values=values, notify=notify
        )
        params = sql.bind(wake_params, row_params, notify_params)
        woke, signal_id, _ = self.db._fetch(statement, params)[0]
        if not woke or signal_id is None:
            return None
        self.db._publish_now(TOPIC_RUNNABLE)
        return int(signal_id)

    @operation
    def receive_next(
        self, fence: Fence, seq: int, key: str, channel: str, uncancelled: bool
    ) -> ReceiveOutcome | None:
        """receive_next: the reads of a receive (cancel state, oldest signal) and its
        observation as one statement. Nothing is written when no signal is there; when
        one is there and the fence refuses, the cancel request (if any) tells why."""
        if not self.db.one_statement or self.db.has_deferred(fence):
            return None
        iid = fence.instance_id
        fence_sql, fence_params = self.db._fence_sql(fence, uncancelled=uncancelled)
        received = {
            "instance_id": iid,
            "channel": channel,
            "seq": seq,
            "key": key,
            "command": CMD_RECEIVE,
            "event_type": EV_SIGNAL_RECEIVED,
            "created_at": self.db._now_param(),
        }
        params = sql.bind(fence_params, received)
        try:
            found, fenced, consumed, fresh, payload, keys, ids, channels, requested, reason = (
                self.db._fetch(sql.compose(RECEIVE_NEXT, fence=fence_sql), params)[0]
            )
        except IntegrityError as error:
            raise self.db._key_conflict(iid, key) from error
        if found is None:
            return ReceiveOutcome(cancel_reason=str(reason) if uncancelled and requested else None)
        if fenced != 1:
            why = self.db._cancel_reason_under(fence) if uncancelled else None
            if why is None:
                raise self.db._fenced_error(fence)
            return ReceiveOutcome(cancel_reason=why)
        message = SignalMessage(int(found), channel, str(payload or ""))
        if not consumed:
            return ReceiveOutcome(message, ObservationResult(None, Arrivals(), consumed=False))
        signals = [(int(i), str(c)) for i, c in zip(ids or (), channels or (), strict=True)]
        if fresh:
            signals.append((message.id, channel))
        delivered = Arrivals(keys=(*(keys or ()), key), signals=tuple(sorted(signals)))
        row = HistoryRow(key, seq, CMD_RECEIVE, EV_SIGNAL_RECEIVED, message.payload)
        return ReceiveOutcome(message, ObservationResult(row, delivered, consumed=True))
