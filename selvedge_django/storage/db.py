"""The database under the store: clock, write transactions, fences, history rows, wake-ups.

Every part of the store (:mod:`.instances`, :mod:`.tasks`, :mod:`.waits`, ...)
writes through one :class:`Database`. What differs between databases is declared
here as a hook, with the portable answer, and overridden by exactly one of
:class:`~selvedge_django.storage.postgresql.db.PostgresDatabase` and
:class:`~selvedge_django.storage.sqlite.db.SQLiteDatabase` (the way DBOS keeps its
system database and its SQLite subclass).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, F, Value, When
from django.db.models.expressions import Combinable
from django.utils import timezone

from .. import exceptions as exc
from .. import metrics
from ..engine.codec import Codec
from ..engine.events import Fence, HistoryRow
from ..models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    QueueClaim,
    Schedule,
    SignalMessage,
    TimerSubscription,
    WorkflowAttribute,
    WorkflowInstance,
    WorkflowStatus,
    WorkflowStream,
    WorkflowStreamEntry,
)
from . import sql
from .clock import DbNowMs, clock_offset_ms
from .inserts import InsertPlans
from .operation import operation
from .sql import Params, Sql
from .wakeups import TOPIC_RUNNABLE, Bus, bus_for, is_waiter_hint

__all__ = ["Database", "Sql"]

logger = logging.getLogger("selvedge_django.store")


class Database:
    """One database alias as the store's parts use it: transactions, fences, clock, wake-ups.

    :func:`selvedge_django.storage.store_for` builds the subclass of the alias's
    database; this class alone has the portable answer of every hook.
    """

    #: The database clock in milliseconds, as SQL with one parameter (the offset).
    NOW_MS: ClassVar[str] = ""
    #: Whether a write transaction locks the whole database (SQLite), not rows.
    single_writer: ClassVar[bool] = False
    #: Whether this database can send NOTIFY to other processes.
    can_notify: ClassVar[bool] = False
    #: Appended to the due-timer read: how concurrent pollers keep apart (row locks).
    DUE_TIMERS_LOCK: ClassVar[str] = ""
    #: The row locks of a claim's candidates (PostgreSQL: FOR UPDATE SKIP LOCKED).
    CLAIM_LOCK: ClassVar[str] = ""
    #: "Not held" of a task row ({row}), spelled as sv_task_rank_idx's condition.
    NOT_HELD_SQL: ClassVar[str] = "NOT {row}.held"
    #: The next creation number of an instance (sql.NEXT_SEQ_POSTGRESQL, NEXT_SEQ_SQLITE):
    #: dispatch takes equal ranks in the order of these numbers.
    NEXT_SEQ: ClassVar[str] = ""

    # A list of keys or ids (a delivery batch, the tasks or children a cancellation
    # reaches) binds at most this many values per statement (PostgreSQL takes 65,535
    # parameters with server-side binding, SQLite 32,766 by default).
    DELIVERY_CHUNK = 5000

    def __init__(self, alias: str, codec: Codec) -> None:
        self.alias = alias
        self.codec = codec
        settings_dict = connections[alias].settings_dict
        self.vendor = connections[alias].vendor
        self.identity = f"{alias}:{self.vendor}:{settings_dict.get('NAME')}"
        self.bus: Bus = bus_for(self.identity)
        self.notify_enabled = self.can_notify
        self.urgent_writes = False  # the renewer's: first in SQLite's writer turn
        # The alias whose connection LISTENs for the wake-ups of this store's bus.
        self.listen_alias = alias
        # Called with the id of each instance this store closed, once the close
        # committed and before its wake-up goes out (the worker's start handoff sets
        # it: storage never calls up into the worker).
        self.on_closed: Callable[[str], None] | None = None
        # The inline results' hooks (storage.inline): whether one is held for a fence (a
        # write that has one cannot take a one-statement path), record those held right
        # after its fence check, drop them when the outermost transaction rolls back.
        self.has_deferred: Callable[[Fence], bool] = lambda fence: False
        self.apply_deferred: Callable[[Fence], None] = lambda fence: None
        self.deferred_rolled_back: Callable[[], None] = lambda: None
        self._tx = threading.local()
        # Inline results waiting for their execution's next write (storage.inline).
        self._inline = threading.local()
        self._table_names: dict[str, str] | None = None
        # The column plans of _insert_parts, by model, key set and prefix.
        self._inserts = InsertPlans()

    # -- the database ---------------------------------------------------------------------

    @classmethod
    def connection_created(cls, connection: Any) -> None:
        """Set up a new connection of this database (``connection_created``); nothing here."""

    @classmethod
    def database_checks(cls, alias: str, connection: Any) -> list[Any]:
        """This database's own system check messages for the engine's ``alias``."""
        return []

    # -- plumbing ---------------------------------------------------------------------

    @property
    def connection(self) -> Any:
        return connections[self.alias]

    @operation
    def now_expr(self, plus_seconds: float = 0.0) -> Combinable:
        """The database clock (plus ``plus_seconds``) as an ORM expression."""
        expr = DbNowMs(clock_offset_ms())
        if plus_seconds:
            return expr + Value(round(plus_seconds * 1000))
        return expr

    @operation
    def now_ms(self) -> int:
        """The database clock in Unix milliseconds (one read)."""
        rows = self._fetch(sql.SELECT_NOW, {})
        return int(rows[0][0])

    @operation
    def now_sql(self, plus_seconds: float = 0.0) -> Sql:
        """The database clock in ms (plus ``plus_seconds``) as a SQL value bound by position
        (an _insert row names its values after the column: :meth:`Sql.named`)."""
        now, offset = sql.positional(self.NOW_MS), clock_offset_ms()
        if plus_seconds:
            return Sql(sql.compose(sql.PLUS_MS, value=now), [offset, round(plus_seconds * 1000)])
        return Sql(now, [offset])

    @operation
    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A write transaction (the dialect decides how it begins); wake-ups wait for it.

        NOTIFYs asked for inside it (:meth:`after_commit`) go out in one statement at
        the end of the outermost store transaction, so they are delivered exactly
        when it commits and dropped on rollback.
        """
        tx = self._tx
        depth = getattr(tx, "depth", 0)
        if depth == 0:
            tx.pending = set()
        tx.depth = depth + 1
        try:
            with self._write_transaction():
                if depth == 0:
                    tx.began_at = time.monotonic()
                yield
                if depth == 0 and tx.pending:
                    self._notify(tx.pending)
        except BaseException:
            if depth == 0:
                self.deferred_rolled_back()
            raise
        finally:
            tx.depth = depth
            if depth == 0:
                tx.pending = set()

    def _write_transaction(self) -> contextlib.AbstractContextManager[Any]:
        """The transaction :meth:`atomic` opens (SQLite begins it IMMEDIATE)."""
        return transaction.atomic(using=self.alias)

    @operation
    def write_began_at(self) -> float:
        """When (``time.monotonic()``) this thread's last outermost :meth:`atomic` began:
        after its wait for the database (SQLite's writer turn and lock), before its first
        statement. 0.0 before any."""
        return float(getattr(self._tx, "began_at", 0.0))

    @operation
    def writer_turn(self) -> contextlib.AbstractContextManager[Any]:
        """Keep this process's turn to write across the write transactions inside.

        On SQLite a thread waits for the turn once (:func:`.sqlite.turns.writer_turn`)
        and its write transactions inside take it again without waiting, so no other
        writer of the process comes between them. Opens no transaction; nothing on
        PostgreSQL, whose writers wait for rows, not for the database.
        """
        return contextlib.nullcontext()

    @operation
    @contextlib.contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """One consistent read of several statements (the dialect sets its isolation)."""
        if self.connection.in_atomic_block:
            yield
            return
        with self._snapshot_transaction():
            yield

    def _snapshot_transaction(self) -> contextlib.AbstractContextManager[Any]:
        return transaction.atomic(using=self.alias)

    @operation
    def worth_locking(self, queryset: Any) -> bool:
        """Whether a poll should take its locks; True unless the dialect probes first."""
        return True

    def _worth_writing(self, probe: str, params: Mapping[str, Any]) -> bool:
        """:meth:`worth_locking` for a hand-written probe (a statement returning a row)."""
        return True

    @operation
    def allow_idle_transaction(self, seconds: float | None) -> None:
        """Let the current transaction stay idle for ``seconds`` (None: any time).

        Only PostgreSQL ends sessions idle in a transaction; elsewhere nothing to do.
        """

    @operation
    def after_commit(self, *topics: str) -> None:
        """Wake local loops once the current transaction commits; NOTIFY other processes.

        The NOTIFY (on databases that have it) is issued inside the transaction, at
        the end of the outermost store transaction; outside one, at once. Hints to
        waiters go out after the commit instead (:func:`~.wakeups.is_waiter_hint`).
        """

        self.publish_on_commit(*topics)
        if not (self.notify_enabled and topics):
            return
        hints = [topic for topic in topics if is_waiter_hint(topic)]
        if hints:  # after the commit, on its own (see is_waiter_hint)
            transaction.on_commit(lambda: self._notify(hints), using=self.alias, robust=True)
        work = [topic for topic in topics if not is_waiter_hint(topic)]
        if work and getattr(self._tx, "depth", 0) > 0:
            self._tx.pending.update(work)
        elif work:
            self._notify(work)

    @operation
    def publish_on_commit(self, *topics: str) -> None:
        """:meth:`_publish_now` once the current transaction commits (no NOTIFY: for a
        statement that sent its own)."""
        transaction.on_commit(lambda: self._publish_now(*topics), using=self.alias)

    def _notify(self, topics: Sequence[str] | set[str]) -> None:
        """Send ``topics`` to other processes in the current transaction (PostgreSQL)."""

    def _publish_now(self, *topics: str) -> None:
        """Wake local loops after a one-statement write (already committed)."""
        for topic in topics:
            self.bus.publish(topic)

    def _closed(self, instance_id: str) -> None:
        """Tell :attr:`on_closed` that the close of ``instance_id`` committed."""
        if self.on_closed is not None:
            self.on_closed(instance_id)

    def _closed_on_commit(self, instance_id: str) -> None:
        """:meth:`_closed` once the current transaction commits (before its wake-ups)."""
        if self.on_closed is not None:
            callback = self.on_closed
            transaction.on_commit(lambda: callback(instance_id), using=self.alias)

    def _execute(self, statement: str, params: Params) -> int:
        """Run one hand-written statement; return the rows it touched.

        The hottest statements (fences, history rows, activity arrivals) skip the
        ORM's query building, which costs ten times the statement itself on a
        local database. ``{instance}``, ``{history}``, ``{task}``, ``{signal}``,
        ``{timer}`` and ``{schedule}`` name the tables, ``{now}`` is the database
        clock (:meth:`_bound` binds its ``clock_offset``); ``params`` bind by name.
        """
        with self._cursor() as cursor:
            cursor.execute(*self._bound(statement, params))
            return int(cursor.rowcount)

    def _fetch(self, statement: str, params: Params) -> list[tuple[Any, ...]]:
        """Run one hand-written statement that returns rows (named as in _execute)."""
        with self._cursor() as cursor:
            cursor.execute(*self._bound(statement, params))
            return list(cursor.fetchall())

    def _bound(self, statement: str, params: Params) -> tuple[str, Params]:
        """The statement with its tables and clock filled, and the values it binds."""
        if not isinstance(params, Mapping):  # a statement not yet bound by name
            return self._tables(statement, named=False), params
        text = self._tables(statement)
        if sql.CLOCK_OFFSET in text:
            params = {**params, "clock_offset": clock_offset_ms()}
        return text, params

    def _cursor(self) -> Any:
        """The cursor of the engine's hand-written statements (:meth:`_execute`,
        :meth:`_fetch`, the inserts): the connection's own here; PostgreSQL's binds on
        the server and prepares them (``PREPARED_STATEMENTS``)."""
        return self.connection.cursor()

    def _pipeline(self) -> contextlib.AbstractContextManager[None] | None:
        """A block whose statements go out without waiting for each one's result (the
        first error raised by a later statement or at the block's end), or None where
        the connection has no such mode: here none."""
        return None

    def _tables(self, statement: str, *, named: bool = True) -> str:
        names = self._table_names
        if names is None:
            quote = self.connection.ops.quote_name
            names = self._table_names = {
                "instance": quote(WorkflowInstance._meta.db_table),
                "history": quote(HistoryEvent._meta.db_table),
                "task": quote(ActivityTask._meta.db_table),
                "signal": quote(SignalMessage._meta.db_table),
                "timer": quote(TimerSubscription._meta.db_table),
                "schedule": quote(Schedule._meta.db_table),
                "archive": quote(ArchivedHistoryEvent._meta.db_table),
                "attribute": quote(WorkflowAttribute._meta.db_table),
                "queue_claim": quote(QueueClaim._meta.db_table),
                "stream": quote(WorkflowStream._meta.db_table),
                "stream_entry": quote(WorkflowStreamEntry._meta.db_table),
                "now": self.NOW_MS,
            }
        if not named:
            return statement.format_map({**names, "now": sql.positional(self.NOW_MS)})
        return statement.format_map(names)

    def _insert(
        self,
        model: Any,
        values: dict[str, Any],
        *,
        returning_id: bool = False,
        where: Sql | None = None,
        on_conflict: str = "",
    ) -> Any:
        """Insert one row without the ORM's query building; return its id if asked.

        Columns not in ``values`` take the model field's default (``auto_now`` and
        ``auto_now_add`` fields the current time); :class:`Sql` values are inlined.
        With ``where`` the row is inserted only if that condition holds (evaluated
        by the same statement); the id is then None when nothing was inserted.
        ``on_conflict`` (an ``ON CONFLICT ... DO NOTHING`` clause) likewise leaves the
        id None when a unique index refused the row.
        """
        conn = self.connection
        columns, marks, params = self._insert_parts(model, values, skip_pk=returning_id)
        table = conn.ops.quote_name(model._meta.db_table)
        if where is None:
            statement = sql.compose(sql.INSERT_ROW, table=table, columns=columns, values=marks)
        else:
            condition, where_params = where.named("where")
            statement = sql.compose(
                sql.INSERT_ROW_IF, table=table, columns=columns, values=marks, condition=condition
            )
            params = sql.bind(params, where_params)
        statement += on_conflict
        if not returning_id:
            self._execute(statement, params)
            return None
        return self._insert_returning_id(statement, params, model._meta.pk.column)

    def _insert_returning_id(self, statement: str, params: dict[str, Any], pk: str) -> Any:
        """Run an INSERT and return the new row's id (None when it inserted nothing)."""
        returning = sql.compose(sql.RETURNING, columns=self.connection.ops.quote_name(pk))
        rows = self._fetch(statement + returning, params)
        return rows[0][0] if rows else None

    def _insert_new(self, template: str, rows: Sequence[tuple[str, Params]]) -> list[str]:
        """Insert ``rows`` (their value lists and parameters, named apart) with ``template``
        (an INSERT with ``{rows}`` that skips existing ids) in one statement; return the
        new ids."""
        statement = sql.compose(template, rows=", ".join(marks for marks, _ in rows))
        parts = [values for _, values in rows]
        params: Params
        named = [part for part in parts if isinstance(part, Mapping)]
        if len(named) == len(parts):
            params = sql.bind(*named)
        else:  # rows bound by position (bulk starts)
            params = [value for part in parts for value in part]
        return [str(r[0]) for r in self._fetch(statement + sql.RETURNING_INSTANCE_ID, params)]

    def _insert_parts(
        self, model: Any, values: dict[str, Any], *, skip_pk: bool, name: str = "row"
    ) -> tuple[str, str, dict[str, Any]]:
        """The column list, the value expressions and their parameters of one row, each
        value named after its column (``%(row_status)s``; ``name`` sets the prefix, so
        that rows combined into one statement keep theirs apart); see :mod:`.inserts`."""
        return self._inserts.parts(self.connection, model, values, skip_pk=skip_pk, name=name)

    def _next_seq_sql(self, offset: int = 0) -> Sql:
        """The next creation number of an instance as a SQL value. ``offset`` is the row's
        place in a multi-row insert: a PostgreSQL sequence gives each row its own (SQLite
        reads its number once per statement and adds the offset)."""
        return Sql(self._tables(self.NEXT_SEQ))

    @classmethod
    def _chunks(cls, values: list[Any], *, values_each: int = 1) -> list[list[Any]]:
        """A list in statement-sized parts (``values_each`` bound values per item); no
        part at all when the list is empty."""
        size = max(1, cls.DELIVERY_CHUNK // values_each)
        return [values[i : i + size] for i in range(0, len(values), size)]

    # -- fences --------------------------------------------------------------------------

    def _fence_sql(
        self,
        fence: Fence,
        current_step: str | None = None,
        *,
        release: bool = False,
        uncancelled: bool = False,
        parked: tuple[int, str] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """The fence check: an UPDATE that must touch exactly the writer's instance row.

        ``release`` also gives the lease up in the same update (the last write of an
        execution that suspends after it); ``runnable`` is left as it is. ``parked``
        (seq, key), with ``release``: the command the execution waits at, recorded as
        a release records it, so the next lease reads its value with the row.
        ``uncancelled`` also requires that no cancel request is recorded (a write that
        must not happen after one, such as an inline claim). Its values are named
        ``fence_*``, apart from the parts a statement chains it with.
        """
        params: dict[str, Any] = {
            "fence_at": self._now_param(),
            "fence_instance_id": fence.instance_id,
            "fence_owner": fence.owner,
            "fence_epoch": fence.epoch,
            "fence_running": str(WorkflowStatus.RUNNING),
        }
        if current_step is not None:
            params["fence_step"] = current_step[:255]
        if uncancelled:
            params["fence_cancelled"] = False
        released = sql.FENCE_SET_RELEASE if release else ""
        if release and parked is not None:
            released += sql.FENCE_SET_PARKED
            params.update(fence_parked_seq=parked[0], fence_parked_key=parked[1])
        statement = sql.compose(
            sql.FENCE_UPDATE,
            step=sql.FENCE_SET_STEP if current_step is not None else "",
            release=released,
            uncancelled=sql.FENCE_UNCANCELLED if uncancelled else "",
        )
        return statement, params

    def _fence(
        self,
        fence: Fence,
        current_step: str | None = None,
        *,
        release: bool = False,
        uncancelled: bool = False,
        parked: tuple[int, str] | None = None,
    ) -> None:
        """The fence check: the first statement of every fenced transaction.

        ``current_step`` (the command being issued) is recorded in the same update,
        so operators see where an instance is at no extra cost. With ``release`` the
        update also releases the lease (and records ``parked``, see :meth:`_fence_sql`),
        and dispatchers are woken after commit when input arrived during the execution
        (the instance is still runnable).
        """
        statement, params = self._fence_sql(
            fence, current_step, release=release, uncancelled=uncancelled, parked=parked
        )
        if not release:
            if self._execute(statement, params) != 1:
                raise self._fenced_error(fence)
            self.apply_deferred(fence)
            return
        rows = self._fetch(statement + sql.RETURNING_RUNNABLE, params)
        if not rows:
            raise self._fenced_error(fence)
        self.apply_deferred(fence)
        if rows[0][0]:
            self.after_commit(TOPIC_RUNNABLE)

    def _cancel_reason_under(self, fence: Fence) -> str | None:
        """The reason of a cancel request on an instance ``fence`` still holds, else None.

        Tells a fence check that also required no cancel request (``uncancelled``) and
        matched nothing apart from a lost lease.
        """
        rows = self._fetch(sql.CANCEL_REASON_UNDER_FENCE, self._fence_params(fence))
        if not rows or not rows[0][0]:
            return None
        return str(rows[0][1])

    @staticmethod
    def _fence_params(fence: Fence) -> dict[str, Any]:
        """What a fenced statement names: the instance, the lease, the status it must have."""
        lease = {"instance_id": fence.instance_id, "owner": fence.owner, "epoch": fence.epoch}
        return {**lease, "running": str(WorkflowStatus.RUNNING)}

    @staticmethod
    def _fenced_error(fence: Fence) -> exc.Fenced:
        metrics.record(metrics.FENCED_WRITES, 1, lease_kind="workflow")
        return exc.Fenced(
            f"execution of {fence.instance_id!r} (epoch {fence.epoch}) no longer holds the lease"
        )

    @staticmethod
    def _key_conflict(instance_id: str, key: str) -> exc.HistoryKeyConflict:
        return exc.HistoryKeyConflict(f"history key {key!r} of {instance_id!r} is already recorded")

    def _now_param(self, now: Any = None) -> Any:
        """``timezone.now()`` (or ``now``) as the database driver takes it."""
        return self.connection.ops.adapt_datetimefield_value(timezone.now() if now is None else now)

    # -- history rows ----------------------------------------------------------------------

    def _history_insert_sql(
        self, instance_id: str, row: HistoryRow, source: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """INSERT of one history row; ``source`` (a CTE) makes it conditional on that row.
        Its values are named ``row_*``."""
        values = {
            "row_instance_id": instance_id,
            "row_key": row.key,
            "row_seq": row.seq,
            "row_command": row.command,
            "row_event_type": row.event_type,
            "row_data": row.data,
            "row_reservation": row.reservation,
            "row_delivered_seq": row.delivered_seq,
            "row_created_at": self._now_param(),
        }
        if source:
            return sql.compose(sql.HISTORY_INSERT_FROM, source=source), values
        return sql.HISTORY_INSERT, values

    def _insert_row(self, instance_id: str, row: HistoryRow) -> HistoryRow:
        """Insert a history row inside the caller's fenced transaction.

        Under the fence no other writer can add a key this execution has not seen,
        so a conflict is a bug: it aborts the whole transaction (no savepoint).
        """
        statement, params = self._history_insert_sql(instance_id, row)
        try:
            self._execute(statement, params)
        except IntegrityError as error:
            raise self._key_conflict(instance_id, row.key) from error
        return row

    @operation
    def get_row(self, instance_id: str, key: str) -> HistoryRow | None:
        """One history row of an instance, or None."""
        found = (
            HistoryEvent.objects.using(self.alias)
            .filter(instance_id=instance_id, key=key)
            .values_list(
                "key", "seq", "command", "event_type", "data", "reservation", "delivered_seq"
            )
            .first()
        )
        return HistoryRow(*found) if found is not None else None

    # -- becoming runnable ---------------------------------------------------------------

    @staticmethod
    def wake_params(instance_id: str | None = None) -> dict[str, Any]:
        """The values of sql.WAKE_SET (and of WAKE_INSTANCE and WAKE_RUNNING with the
        instance's id), the SET terms of an UPDATE that marks an instance runnable.

        ``ready_ms`` (the order of dispatch: oldest first) becomes the database
        clock's now only if the instance was not runnable yet: one already waiting
        keeps its place in line, and one held back after an execution error
        (``ready_ms`` in the future) keeps its backoff, whatever arrives meanwhile.
        SET expressions read the row as it was before the update.
        """
        params: dict[str, Any] = {"wake_runnable": True}
        if instance_id is not None:
            params.update(wake_instance_id=instance_id, wake_running=str(WorkflowStatus.RUNNING))
        return params

    @operation
    def wake_fields(self) -> dict[str, Any]:
        """:meth:`wake_sql` for ``QuerySet.update()``."""
        return {
            "ready_ms": Case(When(runnable=True, then=F("ready_ms")), default=self.now_expr()),
            "runnable": True,
        }

    def _wake_sql(
        self, instance_id: str, condition: str = "", params: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The statement of :meth:`_wake` (``condition`` is a further ``AND ...``, which
        ``params`` binds)."""
        return (
            sql.compose(sql.WAKE_RUNNING, condition=condition),
            sql.bind(self.wake_params(instance_id), params or {}),
        )

    def _wake(
        self, instance_id: str, condition: str = "", params: Mapping[str, Any] | None = None
    ) -> int:
        """Mark a running instance runnable; dispatchers are woken after commit if it was.

        The one wake-up of every arrival that needs no lease (an activity outcome, a
        signal, a child's close reaching its parent). ``condition`` (with ``params``)
        narrows the update, e.g. to a parent that still waits for the outcome.
        Returns the rows touched (0 or 1).
        """
        woken = self._execute(*self._wake_sql(instance_id, condition, params))
        if woken:
            self.after_commit(TOPIC_RUNNABLE)
        return woken

    def _lock_instance(self, instance_id: str, *, skip_locked: bool = False) -> bool:
        """Lock an instance row first, inside a transaction that writes what it owns.

        The one lock order of every write path: the instance row, then its tasks,
        timers and history rows (and an ancestor's row before a descendant's). The
        fenced paths get the lock from their fence update; an arrival (an activity
        outcome, a timeout recorded by the leader) takes it here. A database whose
        write transaction holds the whole database (SQLite) needs no row lock: True.

        With ``skip_locked`` a row another transaction holds is not waited for: the
        result is False and the caller leaves that instance for its next round (the
        leader's sweeps, which must not stall behind a client's open transaction).
        """
        return True

    def _lock_task(self, task_id: int) -> bool:
        """Lock a task row unless another transaction holds it (True without row locks)."""
        return True

    def _lock_limits(self, queues: Sequence[str], keys: Sequence[str]) -> None:
        """Serialise claims per rate-limited queue and per concurrency key until commit
        (queues first, each in sorted order); nothing where one writer already does."""

    # -- reads meant for an index, and renewals ---------------------------------------------

    def _index_hint(self, index: str) -> str:
        """SQL after a table name that makes the database use ``index`` (none here)."""
        return ""

    #: "runnable is true" as the statements spell it.
    RUNNABLE_SQL: ClassVar[str] = "runnable"

    def _status_rows(self, template: str, index: str, params: Mapping[str, object]) -> list[Any]:
        """Run a status statement meant for ``index`` (the planner picks it here)."""
        return self._fetch(sql.compose(template, hint="", runnable=self.RUNNABLE_SQL), params)

    def _renew(
        self,
        table: str,
        columns: str,
        where: str,
        set_sql: str,
        params: dict[str, Any],
    ) -> list[tuple[Any, ...]]:
        """Renew the rows of ``table`` matching ``where``; return (*columns, renewed) per
        matching row, renewed false for a row another transaction holds (PostgreSQL).
        ``params`` binds ``where`` and ``set_sql`` by name."""
        raise NotImplementedError
