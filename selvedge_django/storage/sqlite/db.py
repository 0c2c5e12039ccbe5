"""The SQLite database: one writer at a time, BEGIN IMMEDIATE, WAL and its pragmas.

Only what differs from the portable :class:`~selvedge_django.storage.db.Database`:

* a write transaction locks the whole database, so write transactions begin
  ``IMMEDIATE`` (the write lock is taken up front and waited for with the busy
  timeout: worker threads never see "database is locked"), after the writer's
  turn of this process (:func:`_writer_turn`, the renewer first); no row needs a
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
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.db import DatabaseError, OperationalError, transaction

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: processes meet at SQLite's lock alone
    fcntl = None  # type: ignore[assignment]

from ...engine.events import Fence
from .. import sql
from ..db import Database
from ..operation import operation
from ..sql import Params, Sql
from ..wakeups import TOPIC_RUNNABLE
from . import setup
from .setup import BUSY_TIMEOUT_S, in_memory

__all__ = ["SQLiteDatabase", "busy_timeout"]

logger = logging.getLogger("selvedge_django.store")

# The rows of a renewal batch still live.
RENEW_SELECT = "SELECT {columns} FROM {table} WHERE {where}"
# Renew the rows found ({ids}: marks).
RENEW_UPDATE = "UPDATE {table} SET {set} WHERE {key} IN ({ids})"
# The creation number of a later row of a multi-row insert ({next_seq}: NEXT_SEQ_SQLITE,
# read once per statement).
NEXT_SEQ_PLUS = "({next_seq} + %s)"


# One lock per database file: the turns of this process's write transactions. A
# wait for the turn longer than this (s) shortens SQLite's busy timeout to what is left.
_TURN_WAIT_NOTICED = 0.5
# The file beside the database whose lock (flock) is the turn between processes.
TURN_FILE_SUFFIX = "-selvedge-turn"
# A writer waiting for another process's turn looks again after this (s), doubling up to
# _TURN_POLL_MAX: the holder commits within a millisecond or two, where SQLite's busy
# handler would sleep 1, 2, 5, 10 ... 100 ms between looks.
_TURN_POLL_FIRST = 0.00005
_TURN_POLL_MAX = 0.0005


class _FileTurn:
    """The turn between processes: an exclusive ``flock`` of a file beside the database.

    Taken by the thread that holds this process's turn, so one thread per process
    waits for it. The kernel drops the lock of a process that dies, so a crash never
    leaves it taken. A process opens the file once (again after a fork: a child
    shares its parent's open file, and with it the lock). When the file cannot be
    opened (a read-only directory, no ``fcntl`` on this platform) the processes
    meet at SQLite's lock alone, as without it.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None
        self._pid = 0
        self._failed = False

    def _file(self) -> int | None:
        if fcntl is None or self._failed:
            return None
        if self._fd is None or self._pid != os.getpid():
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as error:
                self._failed = True
                logger.warning(
                    "cannot open %s (%s): processes sharing this SQLite database wait for "
                    "each other's writes with SQLite's busy handler",
                    self._path,
                    error,
                )
                return None
            self._pid = os.getpid()
        return self._fd

    def acquire(self, deadline: float) -> bool:
        """Take the lock, looking again with short sleeps until ``deadline`` (monotonic)."""
        fd = self._file()
        if fd is None:
            return False
        pause = _TURN_POLL_FIRST
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
            except OSError:  # pragma: no cover - a file system without flock
                self._failed = True
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, _TURN_POLL_MAX)

    def release(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            fcntl.flock(self._fd, fcntl.LOCK_UN)


class _WriterTurn:
    """A re-entrant lock whose urgent waiters go before the others.

    The renewals of leases and claims are urgent: a worker busy with its own writes
    must not let its leases and claims lapse while the renewer waits in line behind
    them. An urgent waiter takes the turn as soon as the holder lets it go; the
    others wait while an urgent one does. The thread that takes the turn then takes
    the turn between processes (:class:`_FileTurn`), within what is left of the
    same timeout, and lets it go with the turn.
    """

    def __init__(self, file_turn: _FileTurn | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._urgent = 0  # urgent waiters
        self._file_turn = file_turn
        self._file_held = False  # read and written by the owner only

    def acquire(self, timeout: float, urgent: bool = False) -> bool:
        deadline = time.monotonic() + timeout
        if not self._acquire(timeout, urgent):
            return False
        if self._depth == 1 and self._file_turn is not None:
            self._file_held = self._file_turn.acquire(deadline)
        return True

    def _acquire(self, timeout: float, urgent: bool) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            if urgent:
                self._urgent += 1
            try:
                free = self._cond.wait_for(
                    lambda: self._owner is None and (urgent or not self._urgent), timeout
                )
            finally:
                if urgent:
                    self._urgent -= 1
                    if not self._urgent:
                        self._cond.notify_all()  # the others may go now
            if not free:
                return False
            self._owner, self._depth = me, 1
            return True

    def release(self) -> None:
        if self._depth == 1 and self._file_held:
            self._file_held = False
            assert self._file_turn is not None
            self._file_turn.release()
        with self._cond:
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()


_writer_locks: dict[str, _WriterTurn] = {}
_writer_locks_guard = threading.Lock()


@contextlib.contextmanager
def _writer_turn(conn: Any, urgent: bool = False) -> Iterator[None]:
    """Wait for this process's turn to write to ``conn``'s database file.

    SQLite lets one writer in at a time and makes the others poll with sleeps that
    grow to 100 ms, so under contention the lock is often free while every waiter
    sleeps. Threads of one process queue on a Python lock instead and take the
    database lock as the previous writer commits. Re-entrant (a callback run at a
    commit may write again). An ``urgent`` writer (the renewer) is handed the turn
    before every other waiter of the process. The wait for the turn counts against
    the busy timeout: after a long one, SQLite waits only what is left of it (and
    then fails with "database is locked" as before); a writer whose turn does not
    come within the whole timeout goes on without it. The engine's writers in other
    processes take turns with this one's through a lock of a file beside the
    database (:class:`_FileTurn`, looked at again every half millisecond at most);
    other writers (the project's own code, ``db_worker``) meet them at SQLite's lock.
    """
    name = str(conn.settings_dict.get("NAME") or "")
    if in_memory(name):
        yield
        return
    with _writer_locks_guard:
        lock = _writer_locks.get(name)
        if lock is None:
            file_turn = None if name.startswith("file:") else _FileTurn(name + TURN_FILE_SUFFIX)
            lock = _writer_locks[name] = _WriterTurn(file_turn)
    timeout = busy_timeout(conn)
    began = time.monotonic()
    taken = lock.acquire(timeout, urgent)
    waited = time.monotonic() - began
    shortened = waited > _TURN_WAIT_NOTICED
    try:
        if shortened:
            left_ms = max(1, round((timeout - waited) * 1000))
            with conn.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {left_ms}")  # an int, never user text
        yield
    finally:
        try:
            if shortened:
                with contextlib.suppress(DatabaseError), conn.cursor() as cursor:
                    # A broken connection is dropped; a new one gets the timeout back.
                    cursor.execute(f"PRAGMA busy_timeout = {round(timeout * 1000)}")
        finally:
            if taken:
                lock.release()


def busy_timeout(conn: Any) -> float:
    """Seconds a writer of the engine's connections waits for SQLite's write lock."""
    options = conn.settings_dict.get("OPTIONS") or {}
    return float(options.get("timeout", BUSY_TIMEOUT_S))


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
        (:func:`_writer_turn`), so a writer waiting behind another of its process is
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
                _writer_turn(conn, self.urgent_writes),
                transaction.atomic(using=self.alias),
            ):
                conn.transaction_mode = previous
                yield
        finally:
            conn.transaction_mode = previous

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
