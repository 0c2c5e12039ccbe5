"""The PostgreSQL store's signal inbox: a receive as one statement.

The base of :class:`~.postgresql.PostgresStore`: the wake of a workflow blocked in
``receive`` (read the cancel state and the oldest signal, consume it, record the
received row, deliver every arrival) as one statement, where the portable store
reads twice and then observes in a transaction of several statements.
"""

from __future__ import annotations

import dataclasses

from django.db import IntegrityError

from ..engine.events import CMD_RECEIVE, EV_SIGNAL_RECEIVED, Arrivals, Fence, HistoryRow
from ..engine.ports import Observation, ObservationResult, ReceiveOutcome, SignalMessage
from . import sql
from .base import operation
from .postgresql_sql import OBSERVE_RECEIVE, RECEIVE_NEXT
from .store import DjangoStore

__all__ = ["PostgresInbox"]


class PostgresInbox(DjangoStore):
    """Receives in one statement; see the module docstring."""

    @property
    def _one_statement(self) -> bool:
        """Whether a fenced write may run as one statement: outside any transaction."""
        return not self.connection.in_atomic_block

    @operation
    def observe(self, fence: Fence, observation: Observation) -> ObservationResult:
        """observe: a receive that consumes a signal, records its row and delivers every
        arrival (the wake of a workflow waiting on a signal) as one statement."""
        if not (
            self._one_statement
            and observation.consume is not None
            and observation.record is not None
            and observation.deliver_all
            and observation.fill is None
            and observation.retire_timer is None
            and not observation.fill_cancelled
            and not observation.cancel_tasks
            and not observation.cancel_children
            and not self.has_deferred(fence)
        ):
            return super().observe(fence, observation)
        return self._observe_receive(fence, observation, observation.consume, observation.record)

    def _observe_receive(
        self, fence: Fence, observation: Observation, signal_id: int, row: HistoryRow
    ) -> ObservationResult:
        """The one-statement receive. The received row is inserted already delivered at
        its own position, as the portable path's batch marks it; it is the newest row,
        so it ends the batch's keys. Nothing but the fence's own update is written when
        the signal was consumed already."""
        iid, seq = fence.instance_id, observation.seq
        fence_sql, fence_params = self._fence_sql(fence)
        received = dataclasses.replace(row, delivered_seq=seq)
        row_sql, row_params = self._history_insert_sql(iid, received, "c")
        statement = sql.compose(OBSERVE_RECEIVE, fence=fence_sql, received=row_sql)
        params = [*fence_params, signal_id, seq, row.key, seq, signal_id, iid, *row_params]
        params += [seq, iid, seq, iid, signal_id]
        try:
            fenced, consumed, fresh, channel, keys, ids, channels = self._fetch(statement, params)[
                0
            ]
        except IntegrityError as error:
            raise self._key_conflict(iid, row.key) from error
        if fenced != 1:
            raise self._fenced_error(fence)
        if not consumed:
            return ObservationResult(None, Arrivals(), consumed=False)
        signals = [(int(i), str(c)) for i, c in zip(ids or (), channels or (), strict=True)]
        if fresh:
            signals.append((signal_id, str(channel)))
        delivered = Arrivals(keys=(*(keys or ()), row.key), signals=tuple(sorted(signals)))
        return ObservationResult(row, delivered, consumed=True)

    @operation
    def receive_next(
        self, fence: Fence, seq: int, key: str, channel: str, uncancelled: bool
    ) -> ReceiveOutcome | None:
        """receive_next: the reads of a receive (cancel state, oldest signal) and its
        observation as one statement. Nothing is written when no signal is there; when
        one is there and the fence refuses, the cancel request (if any) tells why."""
        if not self._one_statement or self.has_deferred(fence):
            return None
        iid = fence.instance_id
        fence_sql, fence_params = self._fence_sql(fence, uncancelled=uncancelled)
        params = [iid, channel, *fence_params, seq, key, seq, iid]
        params += [iid, key, seq, CMD_RECEIVE, EV_SIGNAL_RECEIVED, seq, self._now_param()]
        params += [seq, iid, seq, iid, iid]
        try:
            found, fenced, consumed, fresh, payload, keys, ids, channels, requested, reason = (
                self._fetch(sql.compose(RECEIVE_NEXT, fence=fence_sql), params)[0]
            )
        except IntegrityError as error:
            raise self._key_conflict(iid, key) from error
        if found is None:
            return ReceiveOutcome(cancel_reason=str(reason) if uncancelled and requested else None)
        if fenced != 1:
            why = self._cancel_reason_under(fence) if uncancelled else None
            if why is None:
                raise self._fenced_error(fence)
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
