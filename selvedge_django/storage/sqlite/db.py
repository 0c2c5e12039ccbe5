"""The SQLite database: one writer at a time, BEGIN IMMEDIATE, WAL and its pragmas.

Only what differs from the portable :class:`~selvedge_django.storage.db.Database`:

* a write transaction locks the whole database, so write transactions begin
  ``IMMEDIATE`` (the write lock is taken up front and waited for with the busy
  timeout: worker threads never see "database is locked"), after the writer's
  turns (:func:`.turns.writer_turn`: the renewer first, other processes too); no row needs a
  lock, and a poll looks without locking first (a read in WAL mode blocks
  nobody), so idle workers do not take the write lock several times a second;
* the engine's connections run in WAL mode with a generous busy timeout
  (:func:`.setup.connection_created`), and the system checks warn about set-ups
  that cannot work well (:func:`.setup.database_checks`);
* before SQLite 3.35 there is no ``UPDATE ... RETURNING``: the writes that read
  back what they changed read first instead.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.db import OperationalError, transaction

from ...engine.events import Fence
from .. import sql
from ..db import Database
from ..operation import operation
from ..sql import Params, Sql
from ..wakeups import TOPIC_RUNNABLE
from . import setup
from .turns import busy_timeout, writer_turn

__all__ = ["SQLiteDatabase", "busy_timeout"]

logger = logging.getLogger("selvedge_django.store")

# The rows of a renewal batch still live.
RENEW_SELECT = "SELECT {columns} FROM {table} WHERE {where}"
# Renew the rows found ({ids}: marks).
RENEW_UPDATE = "UPDATE {table} SET {set} WHERE {key} IN ({ids})"
# The creation number of a later row of a multi-row insert ({next_seq}: NEXT_SEQ_SQLITE,
# read once per statement).
NEXT_SEQ_PLUS = "({next_seq} + %s)"


class SQLiteDatabase(Database):
    """A SQLite database file (or, in tests, a database in memory)."""

    NOW_MS = sql.NOW_MS_SQLITE
    NEXT_SEQ = sql.NEXT_SEQ_SQLITE
    single_writer = True

    # Django 5.2 writes a partial index's "runnable is true" as "runnable", 6.1 as
    # "runnable" = 1: both terms, so the statement implies either index's condition.
    RUNNABLE_SQL = "runnable AND runnable = 1"
    # Likewise "held is false": NOT "held" (5.2), "held" = 0 (6.1).
    NOT_HELD_SQL = "NOT {row}.held AND {row}.held = 0"

    def _next_seq_sql(self, offset: int = 0) -> Sql:
        """SQLite reads the next number once per statement: a later row of a multi-row
        insert adds its place to it."""
        if not offset:
            return super()._next_seq_sql()
        text = self._tables(self.NEXT_SEQ)
        return Sql(sql.compose(NEXT_SEQ_PLUS, next_seq=text), [offset])

    def _index_hint(self, index: str) -> str:
        """``INDEXED BY``: with statistics, a claim prefers the due-time range of
        ``sv_task_queued_idx`` and sorts the backlog, where ``sv_task_rank_idx`` gives the
        first few in order."""
        return f" INDEXED BY {index}" if index else ""

    def _status_rows(self, template: str, index: str, params: Mapping[str, object]) -> list[Any]:
        """``INDEXED BY``: without statistics SQLite prefers the status index and sorts
        every running instance, where the status report's partial index is the one. An
        index whose condition the statement does not imply (made by hand, or by another
        Django version) leaves SQLite without a plan: then the planner chooses."""
        if index:
            hinted = sql.compose(template, hint=f" INDEXED BY {index}", runnable=self.RUNNABLE_SQL)
            try:
                return self._fetch(hinted, params)
            except OperationalError as error:
                if "no query solution" not in str(error):
                    raise
                logger.warning("index %s does not fit the status report's read: %s", index, error)
        return super()._status_rows(template, "", params)

    @property
    def _returning(self) -> bool:
        """Whether this SQLite has ``UPDATE ... RETURNING`` (3.35 and later)."""
        return bool(self.connection.features.can_return_columns_from_insert)

    # -- transactions and probes ----------------------------------------------------------

    @contextlib.contextmanager
    def _write_transaction(self) -> Iterator[None]:
        """Begin IMMEDIATE: take the write lock first, waiting with the busy timeout.

        The threads of one process take turns on a lock of the database file first
        (:func:`.turns.writer_turn`), so a writer waiting behind another of its process is
        handed the turn when that one commits, instead of polling SQLite's lock with
        the busy handler's growing sleeps. The renewer's store (``urgent_writes``)
        goes first.
        """
        conn = self.connection
        if conn.in_atomic_block:
            with transaction.atomic(using=self.alias):
                yield
            return
        previous = getattr(conn, "transaction_mode", None)
        conn.ensure_connection()
        conn.transaction_mode = "IMMEDIATE"
        try:
            with (
                writer_turn(conn, self.urgent_writes),
                transaction.atomic(using=self.alias),
            ):
                conn.transaction_mode = previous
                yield
        finally:
            conn.transaction_mode = previous

    @operation
    def writer_turn(self) -> contextlib.AbstractContextManager[Any]:
        return writer_turn(self.connection, self.urgent_writes)

    @contextlib.contextmanager
    def _snapshot_transaction(self) -> Iterator[None]:
        """A deferred transaction: a consistent read that takes no write lock."""
        conn = self.connection
        previous = getattr(conn, "transaction_mode", None)
        conn.ensure_connection()
        conn.transaction_mode = None
        try:
            with transaction.atomic(using=self.alias):
                conn.transaction_mode = previous
                yield
        finally:
            conn.transaction_mode = previous

    @operation
    def worth_locking(self, queryset: Any) -> bool:
        """Whether a poll should take the write lock: only if it will find work.

        A write transaction locks the whole database, so an idle poll first looks
        without locking (a read in WAL mode blocks nobody). That keeps idle workers
        from taking the lock several times a second, and a worker stalled mid-poll
        (paused, swapped out) from holding it.
        """
        if self.connection.in_atomic_block:
            return True
        return bool(queryset.exists())

    def _worth_writing(self, probe: str, params: Mapping[str, Any]) -> bool:
        if self.connection.in_atomic_block:
            return True
        return bool(self._fetch(probe, params))

    def _fence(
        self,
        fence: Fence,
        current_step: str | None = None,
        *,
        release: bool = False,
        uncancelled: bool = False,
        parked: tuple[int, str] | None = None,
    ) -> None:
        if not release or self._returning:
            super()._fence(
                fence, current_step, release=release, uncancelled=uncancelled, parked=parked
            )
            return
        statement, params = self._fence_sql(
            fence, current_step, release=release, uncancelled=uncancelled, parked=parked
        )
        if self._execute(statement, params) != 1:
            raise self._fenced_error(fence)
        self.apply_deferred(fence)
        self.after_commit(TOPIC_RUNNABLE)

    def _insert_returning_id(self, statement: str, params: dict[str, Any], pk: str) -> Any:
        if self._returning:
            return super()._insert_returning_id(statement, params, pk)
        with self.connection.cursor() as cursor:
            cursor.execute(*self._bound(statement, params))
            return cursor.lastrowid if cursor.rowcount else None

    def _insert_new(self, template: str, rows: Sequence[tuple[str, Params]]) -> list[str]:
        if self._returning:
            return super()._insert_new(template, rows)
        # One row at a time: the ids of the rows actually inserted.
        return [  # pragma: no cover
            str(next(iter(values.values())) if isinstance(values, Mapping) else values[0])
            for marks, values in rows
            if self._execute(sql.compose(template, rows=marks), values)
        ]

    # -- renewals ---------------------------------------------------------------------------

    def _renew(
        self,
        table: str,
        columns: str,
        where: str,
        set_sql: str,
        params: dict[str, Any],
    ) -> list[tuple[Any, ...]]:
        # One write transaction (the database's write lock) for the whole batch.
        key = columns.split(",")[0].strip()
        with self.atomic():
            rows = self._fetch(
                sql.compose(RENEW_SELECT, columns=columns, where=where, table=table), params
            )
            if rows:
                ids = sql.marks(len(rows), "renewed")
                statement = sql.compose(RENEW_UPDATE, set=set_sql, key=key, ids=ids, table=table)
                self._execute(
                    statement, {**params, **sql.numbered("renewed", [r[0] for r in rows])}
                )
        return [(*row, 1) for row in rows]

    # -- set-up and checks (setup.py) -------------------------------------------------------

    connection_created = staticmethod(setup.connection_created)
    worker_start_problem = staticmethod(setup.worker_start_problem)
    database_checks = staticmethod(setup.database_checks)
