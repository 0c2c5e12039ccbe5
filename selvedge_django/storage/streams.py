"""Streams: the entries a workflow and its activities append, and their readers' reads.

``store.streams``. A stream is a row of :class:`~selvedge_django.models.WorkflowStream`
(its last ``seq`` and whether it is closed) and its entries. Every append first
takes the stream row (an upsert adding one to ``last_seq``, refused on a closed
stream), then inserts the entry, in one transaction: so a stream's entries commit
in ``seq`` order, and a reader that saw ``seq`` n never later finds an entry below
it. A stream counts as closed once its row says so or its instance is closed.

A workflow's write is a command: its history row (the ``seq`` it got, or why it
was refused) commits with the entry under the execution's fence, so a replay finds
the row and writes nothing. An activity's write is live: its own short
transaction, fenced by the attempt's claim (owner and epoch on the task row) and
tagged with the attempt. Readers are woken after commit on the instance's stream
topic (the in-process bus, NOTIFY on PostgreSQL); polling alone is enough.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, ClassVar

from .. import exceptions as exc
from .. import metrics
from ..engine.events import (
    EV_STREAM_CLOSED,
    EV_STREAM_REJECTED,
    EV_STREAM_WRITTEN,
    Fence,
    HistoryRow,
)
from ..engine.ports import TaskClaim
from ..models import (
    ActivityTaskStatus,
    WorkflowInstance,
    WorkflowStatus,
    WorkflowStream,
    WorkflowStreamEntry,
)
from . import sql
from .clock import aware_utc
from .db import Database
from .operation import operation
from .options import StoreOptions
from .wakeups import stream_topic

__all__ = ["StoredEntry", "StreamRead", "Streams"]

# A reader's read, one statement (so one snapshot): a first row with seq 0 carries the
# instance's status (NULL: no such instance) and whether stream %s is closed (NULL: no
# stream row yet), then up to %s entries after seq %s in seq order (sv_stream_entry_seq_uniq).
STREAM_READ = (
    "SELECT seq, value, attempt, activity_id, written_at, status, closed FROM ("
    "SELECT 0 AS seq, NULL AS value, NULL AS attempt, NULL AS activity_id,"
    " NULL AS written_at, (SELECT status FROM {instance} WHERE instance_id = %s) AS status,"
    " (SELECT closed FROM {stream} WHERE instance_id = %s AND key = %s) AS closed"
    " UNION ALL SELECT * FROM (SELECT seq, value, attempt, activity_id, written_at, NULL,"
    " CAST(NULL AS BOOLEAN)"
    " FROM {stream_entry} WHERE instance_id = %s AND key = %s AND seq > %s"
    " ORDER BY seq LIMIT %s) batch) found ORDER BY seq"
)


@dataclass(frozen=True)
class StoredEntry:
    """One stream entry as stored: its value is the codec's JSON text."""

    key: str
    seq: int
    value: str
    attempt: int | None
    activity_id: str | None
    written_at: datetime


@dataclass(frozen=True)
class StreamRead:
    """What one read of a stream found: entries after a seq, and whether it had ended.

    ``closed`` and the entries are read in one statement (one snapshot), so a closed
    stream's read holds every entry it will ever have after ``after`` (up to the
    read's limit).
    """

    entries: list[StoredEntry]
    closed: bool


class Streams:
    """Stream entries: fenced workflow writes, claim-fenced activity writes, reads."""

    #: The lock an activity's write takes on its task row, held to commit, which a close
    #: cancelling the task waits for (PostgreSQL: FOR SHARE; SQLite has one writer).
    CLAIM_LOCK: ClassVar[str] = ""

    def __init__(self, db: Database, options: StoreOptions) -> None:
        self.db = db
        self.options = options

    # -- writes -------------------------------------------------------------------------

    @operation
    def write_command(self, fence: Fence, row: HistoryRow, key: str, value: str) -> HistoryRow:
        """Append ``value`` to stream ``key`` and record the command's ``row``, fenced.

        The row records the entry's ``seq`` (``StreamWritten``) or, on a closed stream
        or an instance at ``MAX_STREAM_ENTRIES``, the refusal (``StreamRejected``), so a
        replay raises the same error without a write. Returns the stored row.
        """
        instance_id = fence.instance_id
        with self.db.atomic():
            self.db._fence(fence)
            refused = self._refusal(instance_id, key)
            seq = None if refused is not None else self._append(instance_id, key, value)
            if seq is None:
                if refused is None:
                    refused = exc.StreamClosed(instance_id, key)
                data = {"error": type(refused).__name__, "message": str(refused)}
                stored = replace(row, event_type=EV_STREAM_REJECTED, data=json.dumps(data))
            else:
                stored = replace(row, event_type=EV_STREAM_WRITTEN, data=json.dumps({"seq": seq}))
                self.db.after_commit(stream_topic(instance_id))
            self.db._insert_row(instance_id, stored)
        if seq is not None:
            metrics.record(metrics.STREAM_ENTRIES, 1, writer="workflow")
        return stored

    @operation
    def close_command(self, fence: Fence, row: HistoryRow, key: str) -> HistoryRow:
        """Close stream ``key`` and record the command's ``row``, fenced; wake its readers."""
        with self.db.atomic():
            self.db._fence(fence)
            self.db._execute(sql.STREAM_CLOSE, [fence.instance_id, key, True, self.db._now_param()])
            stored = replace(row, event_type=EV_STREAM_CLOSED, data="null")
            self.db._insert_row(fence.instance_id, stored)
            self.db.after_commit(stream_topic(fence.instance_id))
        return stored

    @operation
    def write_live(self, claim: TaskClaim, key: str, value: str, attempt: int) -> int:
        """Append an activity attempt's ``value`` to stream ``key``; return its ``seq``.

        One transaction, which commits only while the attempt holds its claim
        (:class:`ActivityCancelled` otherwise) on a running instance
        (:class:`StreamClosed` when it closed), the stream is open
        (:class:`StreamClosed`) and the instance is under ``MAX_STREAM_ENTRIES``
        (:class:`StreamLimitExceeded`); a refused write writes nothing.
        """
        instance_id = claim.instance_id
        held = sql.compose(sql.STREAM_CLAIM_HELD, lock=self.CLAIM_LOCK)
        with self.db.atomic():
            params = [claim.task_id, claim.owner, claim.epoch, str(ActivityTaskStatus.RUNNING)]
            if not self.db._fetch(held, params):
                if self._instance_closed(instance_id):
                    raise exc.StreamClosed(instance_id, key)
                raise exc.ActivityCancelled(
                    f"activity attempt of {claim.key!r} no longer holds its claim"
                )
            refused = self._refusal(instance_id, key)
            if refused is not None:
                raise refused
            seq = self._append(instance_id, key, value, attempt, claim.key)
            if seq is None:
                raise exc.StreamClosed(instance_id, key)
            self.db.after_commit(stream_topic(instance_id))
        metrics.record(metrics.STREAM_ENTRIES, 1, writer="activity")
        return seq

    def _refusal(self, instance_id: str, key: str) -> exc.SelvedgeError | None:
        """Why an append to ``key`` is refused now (closed, or the instance is full)."""
        count, closed = self.db._fetch(sql.STREAM_STATE, [key, instance_id])[0]
        if closed:
            return exc.StreamClosed(instance_id, key)
        if int(count) >= self.options.max_stream_entries:
            return exc.StreamLimitExceeded(instance_id, self.options.max_stream_entries)
        return None

    def _append(
        self,
        instance_id: str,
        key: str,
        value: str,
        attempt: int | None = None,
        activity_id: str | None = None,
    ) -> int | None:
        """Take the stream's next seq and insert the entry; None on a closed stream."""
        now = self.db._now_param()
        rows = self.db._fetch(sql.STREAM_NEXT_SEQ, [instance_id, key, False, now])
        if not rows:
            return None
        seq = int(rows[0][0])
        self.db._execute(
            sql.STREAM_ENTRY_INSERT, [instance_id, key, seq, value, attempt, activity_id, now]
        )
        return seq

    def _instance_closed(self, instance_id: str) -> bool:
        status = (
            WorkflowInstance.objects.using(self.db.alias)
            .filter(instance_id=instance_id)
            .values_list("status", flat=True)
            .first()
        )
        return status != WorkflowStatus.RUNNING

    # -- reads --------------------------------------------------------------------------

    @operation
    def read(self, instance_id: str, key: str, after: int, limit: int) -> StreamRead:
        """Up to ``limit`` entries of stream ``key`` after ``after``, in seq order.

        Raises :class:`WorkflowNotFound` for an unknown instance. One statement: the
        instance's status, whether the stream is closed (see :class:`StreamRead`) and
        the entries, without the ORM's query building (a reader runs it at every
        wake-up).
        """
        params = [instance_id, instance_id, key, instance_id, key, after, limit]
        rows = self.db._fetch(STREAM_READ, params)
        status, closed = rows[0][5:]
        if status is None:
            raise exc.WorkflowNotFound(instance_id)
        entries = [
            StoredEntry(key, int(seq), value, attempt, activity_id, aware_utc(written_at))
            for seq, value, attempt, activity_id, written_at, _, _ in rows[1:]
        ]
        return StreamRead(entries, status != WorkflowStatus.RUNNING or bool(closed))

    @operation
    def entries(self, instance_id: str, limit: int) -> list[StoredEntry]:
        """Up to ``limit`` entries of every stream of an instance, by key then seq."""
        rows = (
            WorkflowStreamEntry.objects.using(self.db.alias)
            .filter(instance_id=instance_id)
            .order_by("key", "seq")
            .values_list("key", "seq", "value", "attempt", "activity_id", "written_at")[:limit]
        )
        return [StoredEntry(*row) for row in rows]

    @operation
    def latest(self, instance_id: str, limit: int) -> list[StoredEntry]:
        """The ``limit`` entries written last to any stream of an instance, newest first."""
        rows = (
            WorkflowStreamEntry.objects.using(self.db.alias)
            .filter(instance_id=instance_id)
            .order_by("-id")
            .values_list("key", "seq", "value", "attempt", "activity_id", "written_at")[:limit]
        )
        return [StoredEntry(*row) for row in rows]

    @operation
    def summary(self, instance_id: str) -> list[dict[str, Any]]:
        """Each stream of an instance: its key, entry count and whether it is closed."""
        rows = (
            WorkflowStream.objects.using(self.db.alias)
            .filter(instance_id=instance_id)
            .order_by("key")
            .values("key", "last_seq", "closed")
        )
        return [dict(row) for row in rows]
