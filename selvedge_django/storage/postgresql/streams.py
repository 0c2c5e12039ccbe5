"""Streams on PostgreSQL: an activity attempt's write as one statement.

Outside a caller's transaction (``one_statement``), the claim check, the entry
count, the stream's next seq, the entry and the NOTIFY chain as data-modifying
``WITH`` queries: the same checks, locks and all-or-nothing as the portable
transaction, in one round trip instead of five and a COMMIT. Inside a
transaction (a ``transactional=True`` activity) the portable path runs.
"""

from __future__ import annotations

from ... import exceptions as exc
from ... import metrics
from ...engine.ports import TaskClaim
from ...models import ActivityTaskStatus
from .. import sql
from ..operation import operation
from ..streams import Streams
from ..wakeups import stream_topic
from .db import PostgresDatabase
from .sql import STREAM_WRITE_LIVE

__all__ = ["PostgresStreams"]


class PostgresStreams(Streams):
    """Stream entries on PostgreSQL: a live write in one statement."""

    db: PostgresDatabase
    CLAIM_LOCK = " FOR SHARE"

    @operation
    def write_live(self, claim: TaskClaim, key: str, value: str, attempt: int) -> int:
        """See :meth:`Streams.write_live`; one statement outside a transaction."""
        if not self.db.one_statement:
            return super().write_live(claim, key, value, attempt)
        instance_id = claim.instance_id
        topic = stream_topic(instance_id)
        # Readers' wake-up is a hint sent after the commit (is_waiter_hint).
        notify, notify_params = self.db.notifier.from_cte("e", [])
        now = self.db._now_param()
        params = [
            *(claim.task_id, claim.owner, claim.epoch, str(ActivityTaskStatus.RUNNING)),
            *(key, instance_id),
            *(instance_id, key, now, self.options.max_stream_entries),
            *(instance_id, key, value, attempt, claim.key, now),
        ]
        # Its own values by position named (stream_0, ...), as the NOTIFY's are.
        text, named = sql.Sql(STREAM_WRITE_LIVE, params).named("stream")
        statement = sql.compose(text, notify=notify)
        seq, held = self.db._fetch(statement, sql.bind(named, notify_params))[0][:2]
        if seq is None:
            if not held:
                if self._instance_closed(instance_id):
                    raise exc.StreamClosed(instance_id, key)
                raise exc.ActivityCancelled(
                    f"activity attempt of {claim.key!r} no longer holds its claim"
                )
            refused = self._refusal(instance_id, key)
            raise refused if refused is not None else exc.StreamClosed(instance_id, key)
        self.db.after_commit(topic)
        metrics.record(metrics.STREAM_ENTRIES, 1, writer="activity")
        return int(seq)
