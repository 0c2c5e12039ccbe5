"""Waits on PostgreSQL: a receive as one statement.

:class:`PostgresWaits`, the waits part of :class:`~.store.PostgresStore`: the
wake of a workflow blocked in ``receive`` (read the cancel state and the oldest
signal, consume it, record the received row, deliver every arrival) as one
statement, where the portable store reads twice and then observes in a
transaction of several statements. Where the statement is not offered (inside a
transaction, or with an inline result pending) the portable path runs whole.
"""

from __future__ import annotations

from django.db import IntegrityError

from ...engine.events import CMD_RECEIVE, EV_SIGNAL_RECEIVED, Arrivals, Fence, HistoryRow
from ...engine.ports import ObservationResult, ReceiveOutcome, SignalMessage
from .. import sql
from ..operation import operation
from ..waits import Waits
from .db import PostgresDatabase
from .sql import RECEIVE_NEXT

__all__ = ["PostgresWaits"]


class PostgresWaits(Waits):
    """Receives in one statement; see the module docstring."""

    db: PostgresDatabase

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
