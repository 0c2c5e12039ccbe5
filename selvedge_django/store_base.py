"""Store plumbing: the database clock, write transactions, fences and wake-ups."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Case, F, Func, IntegerField, Value, When
from django.db.models.expressions import Combinable
from django.utils import timezone

from . import exceptions as exc
from .engine.codec import Codec
from .engine.events import Fence, HistoryRow
from .models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
    WorkflowStatus,
)
from .notify import Bus, bus_for

__all__ = ["DbNowMs", "StoreBase", "clock_offset_ms", "set_clock_offset_ms"]

logger = logging.getLogger("selvedge_django.store")

NOTIFY_CHANNEL = "selvedge_wake"

# NOTIFY is a hint (pollers find the work anyway), and a transaction that notifies
# fails at COMMIT once PostgreSQL's notification queue is full (a listener that never
# reads pins it). So every NOTIFY is skipped, in the same statement, while the queue
# is this full: then nothing short of the other half filling between that statement
# and the commit can make a write fail because of it. (PostgreSQL itself warns at
# half full, naming the stalled listener's process.)
NOTIFY_QUEUE_CEILING = 0.5

_origin: tuple[int, str] | None = None


def notify_origin() -> str:
    """This process's mark on its NOTIFY payloads (renewed in a forked child).

    A payload is ``@<origin> <topic>``. The process's own listener skips payloads
    with its own mark: the in-process bus already delivered them at commit, and a
    second wake-up would only make a loop poll again for nothing.
    """
    global _origin
    pid = os.getpid()
    if _origin is None or _origin[0] != pid:
        _origin = (pid, f"{pid}.{uuid.uuid4().hex[:8]}")
    return _origin[1]


def notify_topic(payload: str) -> str | None:
    """The bus topic of a NOTIFY payload; None for this process's own."""
    if not payload.startswith("@"):
        return payload  # sent by hand (psql, tests): the payload is the topic
    origin, _, topic = payload[1:].partition(" ")
    return None if origin == notify_origin() else topic


# Added to the database clock by every store in this process. Only
# selvedge_django.testing changes it, to move lease, claim and task deadlines
# forward without waiting.
_clock_offset_ms = 0


def set_clock_offset_ms(offset_ms: int) -> None:
    """Shift the database clock seen by this process's stores (tests only)."""
    global _clock_offset_ms
    _clock_offset_ms = int(offset_ms)


def clock_offset_ms() -> int:
    return _clock_offset_ms


class DbNowMs(Func):
    """The database clock in Unix milliseconds (plus a test offset)."""

    output_field = IntegerField()

    def __init__(self, offset_ms: int = 0) -> None:
        super().__init__()
        self.offset_ms = int(offset_ms)

    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:
        vendor = connection.vendor
        if vendor == "postgresql":
            # statement_timestamp() is stable within a statement, so comparisons with it
            # can drive index scans (clock_timestamp() is volatile and cannot).
            sql = "(CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT) + %s)"
        elif vendor == "sqlite":
            sql = "(CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + %s)"
        else:  # pragma: no cover - rejected at start by the system checks
            raise exc.SelvedgeError(f"unsupported database vendor {vendor!r}")
        return sql, [self.offset_ms]


class Sql:
    """A SQL expression with its parameters, for :meth:`StoreBase._insert` values."""

    __slots__ = ("params", "sql")

    def __init__(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.sql = sql
        self.params = list(params)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


class StoreBase:
    """Connection plumbing shared by the store's parts: transactions, fences, clock."""

    def __init__(self, alias: str, codec: Codec) -> None:
        self.alias = alias
        self.codec = codec
        settings_dict = connections[alias].settings_dict
        self.vendor = connections[alias].vendor
        self.identity = f"{alias}:{self.vendor}:{settings_dict.get('NAME')}"
        self.bus: Bus = bus_for(self.identity)
        self.lease_ttl = 30.0
        self.activity_names: Callable[[], Sequence[str] | None] = lambda: None
        self.activity_queues: tuple[str, ...] | None = None
        self.notify_enabled = self.vendor == "postgresql"
        # The alias whose connection LISTENs for the wake-ups of this store's bus.
        self.listen_alias = alias
        self._tx = threading.local()

    # -- plumbing ---------------------------------------------------------------------

    @property
    def connection(self) -> Any:
        return connections[self.alias]

    def now_expr(self, plus_seconds: float = 0.0) -> Combinable:
        expr = DbNowMs(_clock_offset_ms)
        if plus_seconds:
            return expr + Value(round(plus_seconds * 1000))
        return expr

    def now_ms(self) -> int:
        with self.connection.cursor() as cursor:
            sql, params = DbNowMs(_clock_offset_ms).as_sql(None, self.connection)
            cursor.execute("SELECT " + sql, params)
            row = cursor.fetchone()
        return int(row[0])

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A write transaction; on SQLite it begins IMMEDIATE to take the write lock first."""
        conn = self.connection
        tx = self._tx
        depth = getattr(tx, "depth", 0)
        if depth == 0:
            tx.pending = set()
        tx.depth = depth + 1
        try:
            if self.vendor == "sqlite" and not conn.in_atomic_block:
                previous = getattr(conn, "transaction_mode", None)
                conn.ensure_connection()
                conn.transaction_mode = "IMMEDIATE"
                try:
                    with transaction.atomic(using=self.alias):
                        conn.transaction_mode = previous
                        yield
                finally:
                    conn.transaction_mode = previous
            else:
                with transaction.atomic(using=self.alias):
                    yield
                    if depth == 0 and tx.pending:
                        self._pg_notify(tx.pending)
        finally:
            tx.depth = depth
            if depth == 0:
                tx.pending = set()

    def worth_locking(self, queryset: Any) -> bool:
        """Whether a poll should take the write lock: on SQLite, only if it will find work.

        A SQLite write transaction locks the whole database, so an idle poll first
        looks without locking (a read in WAL mode blocks nobody). That keeps idle
        workers from taking the lock several times a second, and a worker stalled
        mid-poll (paused, swapped out) from holding it. On PostgreSQL the locking
        read skips locked rows and blocks nobody: no probe.
        """
        if self.vendor != "sqlite" or self.connection.in_atomic_block:
            return True
        return bool(queryset.exists())

    @contextlib.contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """One consistent read: REPEATABLE READ on PostgreSQL, a deferred read on SQLite."""
        conn = self.connection
        if conn.in_atomic_block:
            yield
            return
        if self.vendor == "postgresql":
            with transaction.atomic(using=self.alias):
                with conn.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield
        else:
            previous = getattr(conn, "transaction_mode", None)
            conn.ensure_connection()
            conn.transaction_mode = None
            try:
                with transaction.atomic(using=self.alias):
                    conn.transaction_mode = previous
                    yield
            finally:
                conn.transaction_mode = previous

    def after_commit(self, *topics: str) -> None:
        """Wake local loops once the current transaction commits; NOTIFY other processes.

        On PostgreSQL the NOTIFY is issued inside the transaction (one statement for
        all topics, at the end of the outermost store transaction), so it is
        delivered exactly when the transaction commits and dropped on rollback;
        it is skipped while the notification queue is half full
        (``NOTIFY_QUEUE_CEILING``), so that a full queue cannot fail the commit.
        """

        def send() -> None:
            for topic in topics:
                self.bus.publish(topic)

        transaction.on_commit(send, using=self.alias)
        if not (self.notify_enabled and topics):
            return
        if getattr(self._tx, "depth", 0) > 0:
            self._tx.pending.update(topics)
        else:
            self._pg_notify(topics)

    def _pg_notify(self, topics: Sequence[str] | set[str]) -> None:
        ordered = sorted(topics)
        sql = (
            "SELECT "
            + ", ".join(["pg_notify(%s, %s)"] * len(ordered))
            + " WHERE pg_notification_queue_usage() < %s"
        )
        params: list[Any] = []
        origin = notify_origin()
        for topic in ordered:
            params += [NOTIFY_CHANNEL, f"@{origin} {topic}"]
        params.append(NOTIFY_QUEUE_CEILING)
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(sql, params)
        except DatabaseError:  # a hint only: pollers will find the work
            logger.debug("NOTIFY failed", exc_info=True)
            if self.connection.in_atomic_block:
                raise

    def _execute(self, sql: str, params: Sequence[Any]) -> int:
        """Run one hand-written statement; return the rows it touched.

        The hottest statements (fences, history rows, activity arrivals) skip the
        ORM's query building, which costs ten times the statement itself on a
        local database. ``{instance}``, ``{history}``, ``{task}``, ``{signal}`` and
        ``{timer}`` name the tables.
        """
        with self.connection.cursor() as cursor:
            cursor.execute(self._tables(sql), params)
            return int(cursor.rowcount)

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run one hand-written statement that returns rows (tables named as in _execute)."""
        with self.connection.cursor() as cursor:
            cursor.execute(self._tables(sql), params)
            return list(cursor.fetchall())

    def _tables(self, sql: str) -> str:
        quote = self.connection.ops.quote_name
        return sql.format(
            instance=quote(WorkflowInstance._meta.db_table),
            history=quote(HistoryEvent._meta.db_table),
            task=quote(ActivityTask._meta.db_table),
            signal=quote(SignalMessage._meta.db_table),
            timer=quote(TimerSubscription._meta.db_table),
            archive=quote(ArchivedHistoryEvent._meta.db_table),
        )

    def now_sql(self, plus_seconds: float = 0.0) -> Sql:
        """The database clock in milliseconds (plus ``plus_seconds``) as a SQL value."""
        sql, params = DbNowMs(_clock_offset_ms).as_sql(None, self.connection)
        if plus_seconds:
            return Sql(f"({sql} + %s)", [*params, round(plus_seconds * 1000)])
        return Sql(sql, params)

    def _insert(
        self,
        model: Any,
        values: dict[str, Any],
        *,
        returning_id: bool = False,
        where: Sql | None = None,
    ) -> Any:
        """Insert one row without the ORM's query building; return its id if asked.

        Columns not in ``values`` take the model field's default (``auto_now`` and
        ``auto_now_add`` fields the current time); :class:`Sql` values are inlined.
        With ``where`` the row is inserted only if that condition holds (evaluated
        by the same statement); the id is then None when nothing was inserted.
        """
        conn = self.connection
        columns, marks, params = self._insert_parts(model, values, skip_pk=returning_id)
        table = conn.ops.quote_name(model._meta.db_table)
        if where is None:
            sql = f"INSERT INTO {table} ({columns}) VALUES ({marks})"
        else:
            sql = f"INSERT INTO {table} ({columns}) SELECT {marks} WHERE {where.sql}"
            params = [*params, *where.params]
        returning = returning_id and conn.features.can_return_columns_from_insert
        if returning:
            sql += " RETURNING " + conn.ops.quote_name(model._meta.pk.column)
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            if returning:
                row = cursor.fetchone()
                return None if row is None else row[0]
            if returning_id:
                return cursor.lastrowid if cursor.rowcount else None
        return None

    def _insert_parts(
        self, model: Any, values: dict[str, Any], *, skip_pk: bool
    ) -> tuple[str, str, list[Any]]:
        """The column list, the value expressions and their parameters of one row."""
        conn = self.connection
        columns: list[str] = []
        marks: list[str] = []
        params: list[Any] = []
        for f in model._meta.concrete_fields:
            if f.primary_key and skip_pk and f.name not in values:
                continue
            if f.attname in values:
                value = values[f.attname]
            elif f.name in values:
                value = values[f.name]
            elif getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                value = timezone.now()
            else:
                value = f.get_default()
            columns.append(conn.ops.quote_name(f.column))
            if isinstance(value, Sql):
                marks.append(value.sql)
                params += value.params
            else:
                marks.append("%s")
                params.append(f.get_db_prep_save(value, conn))
        return ", ".join(columns), ", ".join(marks), params

    # -- one-statement writes (PostgreSQL) ---------------------------------------------

    def allow_idle_transaction(self, seconds: float | None) -> None:
        """Let the current transaction stay idle for ``seconds`` (None: any time), PostgreSQL.

        A transactional attempt's body runs inside its transaction and may wait on other
        things (the network, a sleep) between statements. With an
        ``idle_in_transaction_session_timeout`` on the role or database, the server would
        end the session each time the body waited longer, and the attempt could never
        succeed. So the attempt's transaction (``SET LOCAL``, through ``set_config``)
        raises that timeout to its start-to-close timeout plus a second, or turns it off
        without one. Nothing is sent while the setting is off (the default): it is read
        once per connection.
        """
        if self.vendor != "postgresql":
            return
        conn = self.connection
        conn.ensure_connection()
        raw = conn.connection
        known = getattr(conn, "_selvedge_idle_timeout", None)
        if known is None or known[0] is not raw:
            rows = self._fetch(
                "SELECT setting FROM pg_settings WHERE name = %s",
                ["idle_in_transaction_session_timeout"],
            )
            known = (raw, int(rows[0][0]) if rows else 0)
            conn._selvedge_idle_timeout = known
        if known[1] == 0:
            return
        wanted = 0 if seconds is None else max(known[1], round(seconds * 1000) + 1000)
        self._execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, true)", [str(wanted)]
        )

    @property
    def single_writer(self) -> bool:
        """Whether a write transaction locks the whole database (SQLite), not rows."""
        return self.vendor == "sqlite"

    @property
    def one_statement(self) -> bool:
        """Whether a fenced write may run as one statement instead of a transaction.

        On PostgreSQL, outside any transaction, the statements of a durable step
        chain as data-modifying ``WITH`` queries into one statement, which is a
        transaction by itself: the same all-or-nothing and the same fence, in one
        round trip instead of a BEGIN, each statement and a COMMIT.
        """
        return self.vendor == "postgresql" and not self.connection.in_atomic_block

    def _notify_from(self, source: str, topics: Sequence[str]) -> tuple[str, list[Any]]:
        """A scalar subquery sending ``topics`` once if the CTE ``source`` has a row."""
        if not (self.notify_enabled and topics):
            return "0", []
        origin = notify_origin()
        calls = ", ".join(["pg_notify(%s, %s)"] * len(topics))
        params: list[Any] = []
        for topic in topics:
            params += [NOTIFY_CHANNEL, f"@{origin} {topic}"]
        params.append(NOTIFY_QUEUE_CEILING)
        return (
            f"(SELECT count(*) FROM (SELECT {calls} FROM {source}"
            " WHERE pg_notification_queue_usage() < %s LIMIT 1) n)",
            params,
        )

    def _publish_now(self, *topics: str) -> None:
        """Wake local loops after a one-statement write (already committed)."""
        for topic in topics:
            self.bus.publish(topic)

    def _fence_sql(
        self,
        fence: Fence,
        current_step: str | None = None,
        *,
        release: bool = False,
        uncancelled: bool = False,
    ) -> tuple[str, list[Any]]:
        """The fence check: an UPDATE that must touch exactly the writer's instance row.

        ``release`` also gives the lease up in the same update (the last write of an
        execution that suspends after it); ``runnable`` is left as it is.
        ``uncancelled`` also requires that no cancel request is recorded (a write that
        must not happen after one, such as an inline claim).
        """
        sets, params = "updated_at = %s", [self._now_param()]
        if current_step is not None:
            sets += ", current_step = %s"
            params.append(current_step[:255])
        if release:
            # An execution that suspends normally ends a run of storage errors.
            sets += (
                ", lease_owner = '', lease_expires_ms = NULL,"
                " execution_errors = 0, execution_error = ''"
            )
        where = " AND cancel_requested = %s" if uncancelled else ""
        return (
            "UPDATE {instance} SET " + sets + " WHERE instance_id = %s AND lease_owner = %s"
            " AND lease_epoch = %s AND status = %s" + where,
            [
                *params,
                fence.instance_id,
                fence.owner,
                fence.epoch,
                str(WorkflowStatus.RUNNING),
                *([False] if uncancelled else []),
            ],
        )

    def _cancel_reason_under(self, fence: Fence) -> str | None:
        """The reason of a cancel request on an instance ``fence`` still holds, else None.

        Tells a fence check that also required no cancel request (``uncancelled``) and
        matched nothing apart from a lost lease.
        """
        rows = self._fetch(
            "SELECT cancel_requested, cancel_reason FROM {instance} WHERE instance_id = %s"
            " AND lease_owner = %s AND lease_epoch = %s AND status = %s",
            [fence.instance_id, fence.owner, fence.epoch, str(WorkflowStatus.RUNNING)],
        )
        if not rows or not rows[0][0]:
            return None
        return str(rows[0][1])

    def _history_insert_sql(
        self, instance_id: str, row: HistoryRow, source: str | None = None
    ) -> tuple[str, list[Any]]:
        """INSERT of one history row; ``source`` (a CTE) makes it conditional on that row."""
        values = [
            instance_id,
            row.key,
            row.seq,
            row.command,
            row.event_type,
            row.data,
            row.reservation,
            row.delivered_seq,
            self._now_param(),
        ]
        marks = "%s, %s, %s, %s, %s, %s, %s, %s, %s, NULL"
        body = f"SELECT {marks} FROM {source}" if source else f"VALUES ({marks})"
        return (
            "INSERT INTO {history} (instance_id, key, seq, command, event_type, data,"
            f" reservation, delivered_seq, created_at, arrived_at) {body}",
            values,
        )

    @staticmethod
    def _fenced_error(fence: Fence) -> exc.Fenced:
        return exc.Fenced(
            f"execution of {fence.instance_id!r} (epoch {fence.epoch}) no longer holds the lease"
        )

    @staticmethod
    def _key_conflict(instance_id: str, key: str) -> exc.HistoryKeyConflict:
        return exc.HistoryKeyConflict(f"history key {key!r} of {instance_id!r} is already recorded")

    def _now_param(self, now: Any = None) -> Any:
        """``timezone.now()`` (or ``now``) as the database driver takes it."""
        return self.connection.ops.adapt_datetimefield_value(timezone.now() if now is None else now)

    def _fence(
        self,
        fence: Fence,
        current_step: str | None = None,
        *,
        release: bool = False,
        uncancelled: bool = False,
    ) -> None:
        """The fence check: the first statement of every fenced transaction.

        ``current_step`` (the command being issued) is recorded in the same update,
        so operators see where an instance is at no extra cost. With ``release`` the
        update also releases the lease, and dispatchers are woken after commit when
        input arrived during the execution (the instance is still runnable).
        """
        sql, params = self._fence_sql(fence, current_step, release=release, uncancelled=uncancelled)
        if not release:
            if self._execute(sql, params) != 1:
                raise self._fenced_error(fence)
            return
        if self.connection.features.can_return_columns_from_insert:
            rows = self._fetch(sql + " RETURNING runnable", params)
            if not rows:
                raise self._fenced_error(fence)
            if rows[0][0]:
                self.after_commit("runnable")
            return
        if self._execute(sql, params) != 1:
            raise self._fenced_error(fence)
        self.after_commit("runnable")

    # -- becoming runnable ---------------------------------------------------------------

    def wake_sql(self) -> Sql:
        """The SET terms of an UPDATE that marks an instance runnable.

        ``ready_ms`` (the order of dispatch: oldest first) becomes the database
        clock's now only if the instance was not runnable yet: one already waiting
        keeps its place in line, and one held back after an execution error
        (``ready_ms`` in the future) keeps its backoff, whatever arrives meanwhile.
        SET expressions read the row as it was before the update.
        """
        now = self.now_sql()
        return Sql(
            f"ready_ms = CASE WHEN runnable THEN ready_ms ELSE {now.sql} END, runnable = %s",
            [*now.params, True],
        )

    def wake_fields(self) -> dict[str, Any]:
        """:meth:`wake_sql` for ``QuerySet.update()``."""
        return {
            "ready_ms": Case(When(runnable=True, then=F("ready_ms")), default=self.now_expr()),
            "runnable": True,
        }

    def _lock_instance(self, instance_id: str, *, skip_locked: bool = False) -> bool:
        """Lock an instance row first, inside a transaction that writes what it owns.

        The one lock order of every write path: the instance row, then its tasks,
        timers and history rows (and an ancestor's row before a descendant's). The
        fenced paths get the lock from their fence update; an arrival (an activity
        outcome, a timeout recorded by the leader) takes it here. PostgreSQL only:
        a SQLite write transaction already holds the whole database. ``FOR NO KEY
        UPDATE`` is the lock a fence update takes: it queues behind fenced writers
        without blocking the foreign-key checks of rows that reference the instance.

        With ``skip_locked`` a row another transaction holds is not waited for: the
        result is False and the caller leaves that instance for its next round (the
        leader's sweeps, which must not stall behind a client's open transaction).
        """
        if self.vendor != "postgresql":
            return True
        skip = " SKIP LOCKED" if skip_locked else ""
        locked = self._fetch(
            f"SELECT 1 FROM {{instance}} WHERE instance_id = %s FOR NO KEY UPDATE{skip}",
            [instance_id],
        )
        return bool(locked) or not skip_locked

    def _insert_row(self, instance_id: str, row: HistoryRow) -> HistoryRow:
        """Insert a history row inside the caller's fenced transaction.

        Under the fence no other writer can add a key this execution has not seen,
        so a conflict is a bug: it aborts the whole transaction (no savepoint).
        """
        sql, params = self._history_insert_sql(instance_id, row)
        try:
            self._execute(sql, params)
        except IntegrityError as error:
            raise self._key_conflict(instance_id, row.key) from error
        return row

    def get_row(self, instance_id: str, key: str) -> HistoryRow | None:
        found = (
            HistoryEvent.objects.using(self.alias)
            .filter(instance_id=instance_id, key=key)
            .values_list(
                "key", "seq", "command", "event_type", "data", "reservation", "delivered_seq"
            )
            .first()
        )
        return HistoryRow(*found) if found is not None else None
