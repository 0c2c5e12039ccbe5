"""The PostgreSQL database: row locks, NOTIFY, snapshots and the idle-transaction timeout.

Only what differs from the portable :class:`~selvedge_django.storage.db.Database`:
a consistent read runs at ``REPEATABLE READ``; arrivals lock the instance row first
(``FOR NO KEY UPDATE``), the lock order of every write path; flow control takes one
advisory lock per queue and key; wake-ups reach other processes through ``NOTIFY``
(:mod:`.notify`), sent in the writing transaction, or after it for a waiter's
hint; a bulk enqueue sends its batches in psycopg's pipeline mode (:meth:`_pipeline`).
The connection set-up guards server-side prepared statements behind a pooler,
and the system checks warn when autovacuum is off (both in :mod:`.setup`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from django.db import transaction

from .. import sql
from ..db import Database
from ..operation import operation
from ..wakeups import TOPIC_RUNNABLE
from . import setup
from .cursor import engine_cursor_class
from .notify import Notifier
from .sql import (
    DUE_TIMERS_LOCK,
    IDLE_TIMEOUT_SETTING,
    KEY_LOCK_CLASS,
    LOCK_INSTANCE,
    LOCK_LIMITS,
    LOCK_TASK,
    QUEUE_LOCK_CLASS,
    RENEW_BATCH,
    SET_IDLE_TIMEOUT,
    SNAPSHOT_ISOLATION,
    WAKE_NOTIFYING,
)

__all__ = ["PostgresDatabase"]

logger = logging.getLogger("selvedge_django.store")

# An engine statement is prepared from its fifth run on a connection (psycopg's own
# default): statements run once or twice (the variable-length lists of a rare
# cancellation) are never prepared, and the hot ones pay one PREPARE per connection.
PREPARE_THRESHOLD = 5


@contextlib.contextmanager
def _translated(conn: Any, block: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    """``block`` with the driver's errors raised at its end turned into Django's."""
    with conn.wrap_database_errors, block:
        yield


@functools.cache
def _binding() -> tuple[type[Any], Callable[[Any], Any], Callable[[Any, Any], None]] | None:
    """Django's psycopg cursor class that binds on the server (converting each
    statement's placeholders once: :mod:`.cursor`), the time zone of a connection's
    ``timestamptz`` loader and Django's loader registration (None with psycopg2,
    which never prepares)."""
    from django.db.backends.postgresql import base
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return None
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from psycopg.pq import Format

    def timezone(raw: Any) -> Any:
        return raw.adapters.get_loader(base.TIMESTAMPTZ_OID, Format.TEXT).timezone

    return engine_cursor_class(base.ServerBindingCursor), timezone, register_tzloader


class PostgresDatabase(Database):
    """A PostgreSQL database alias."""

    NOW_MS = sql.NOW_MS_POSTGRESQL
    NEXT_SEQ = sql.NEXT_SEQ_POSTGRESQL
    can_notify = True
    DUE_TIMERS_LOCK = DUE_TIMERS_LOCK
    CLAIM_LOCK = " FOR UPDATE SKIP LOCKED"

    @functools.cached_property
    def notifier(self) -> Notifier:
        """The NOTIFY statements (sent, or carried by a one-statement write)."""
        return Notifier(self)

    @property
    def one_statement(self) -> bool:
        """Whether a fenced write may run as one statement: outside any transaction."""
        return not self.connection.in_atomic_block

    def _pipeline(self) -> contextlib.AbstractContextManager[None] | None:
        """psycopg's pipeline mode (psycopg 3 with libpq 14 or later; None otherwise).

        Each statement is sent without waiting for its result, so the client prepares
        the next while the server runs this one. The server's first error comes back
        from a later statement of the block or from its end (as Django's exception,
        like any other); the statements after the failed one are skipped, so the
        block belongs inside a transaction that the error rolls back.
        """
        conn = self.connection
        conn.ensure_connection()
        if _binding() is None or getattr(conn.connection, "pipeline", None) is None:
            return None
        from psycopg import Pipeline

        if not Pipeline.is_supported():
            return None
        return _translated(conn, conn.connection.pipeline())

    def _cursor(self) -> Any:
        """A cursor that binds on the server, so psycopg prepares the engine's statements.

        Django's own cursor binds on the client unless the project's ``OPTIONS`` say
        ``server_side_binding``, and a statement bound on the client is never
        prepared. So with ``PREPARED_STATEMENTS`` (the default) the engine's
        statements get a server-binding psycopg cursor on the same connection (in
        the caller's transaction, through Django's cursor wrapper and its
        ``execute_wrappers``), and the connection prepares a statement from its
        ``PREPARE_THRESHOLD``-th run on; the project's statements on that connection
        still bind on the client and are never prepared. A project that sets
        ``server_side_binding`` or ``prepare_threshold`` itself keeps its choice.
        """
        conn = self.connection
        options = conn.settings_dict.get("OPTIONS") or {}
        binding = _binding()
        if binding is None or options.get("server_side_binding") or not self._prepares():
            return conn.cursor()
        cursor_class, loader_timezone, register_tzloader = binding
        conn.close_if_health_check_failed()
        conn.ensure_connection()
        with conn.wrap_database_errors:
            raw = conn.connection
            if raw.prepare_threshold is None and "prepare_threshold" not in options:
                raw.prepare_threshold = PREPARE_THRESHOLD
            cursor = cursor_class(raw)
            if conn.timezone != loader_timezone(raw):  # as Django's create_cursor does
                register_tzloader(conn.timezone, cursor)
        return conn._prepare_cursor(cursor)

    def _prepares(self) -> bool:
        """Whether ``SELVEDGE["PREPARED_STATEMENTS"]`` is on (read per statement, so
        that ``override_settings`` takes effect at once)."""
        from ...conf import get_settings

        return get_settings().prepared_statements

    # -- plumbing ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _snapshot_transaction(self) -> Iterator[None]:
        with transaction.atomic(using=self.alias):
            with self.connection.cursor() as cursor:
                cursor.execute(SNAPSHOT_ISOLATION)
            yield

    @operation
    def allow_idle_transaction(self, seconds: float | None) -> None:
        """Let the current transaction stay idle for ``seconds`` (None: any time).

        A transactional attempt's body runs inside its transaction and may wait on other
        things (the network, a sleep) between statements. With an
        ``idle_in_transaction_session_timeout`` on the role or database, the server would
        end the session each time the body waited longer, and the attempt could never
        succeed. So the attempt's transaction (``SET LOCAL``, through ``set_config``)
        raises that timeout to its start-to-close timeout plus a second, or turns it off
        without one. Nothing is sent while the setting is off (the default): it is read
        once per connection.
        """
        conn = self.connection
        conn.ensure_connection()
        raw = conn.connection
        known = getattr(conn, "_selvedge_idle_timeout", None)
        if known is None or known[0] is not raw:
            name = "idle_in_transaction_session_timeout"
            rows = self._fetch(IDLE_TIMEOUT_SETTING, {"name": name})
            known = (raw, int(rows[0][0]) if rows else 0)
            conn._selvedge_idle_timeout = known
        if known[1] == 0:
            return
        wanted = 0 if seconds is None else max(known[1], round(seconds * 1000) + 1000)
        self._execute(SET_IDLE_TIMEOUT, {"ms": str(wanted)})

    def _notify(self, topics: Sequence[str] | set[str]) -> None:
        self.notifier.send(topics)

    def _wake(
        self, instance_id: str, condition: str = "", params: Mapping[str, Any] | None = None
    ) -> int:
        """See :meth:`Database._wake`; the NOTIFY rides in the update's own statement, so
        a signal or an activity outcome takes one round trip less (it is still sent only
        if the transaction commits)."""
        if not self.notify_enabled:
            return super()._wake(instance_id, condition, params)
        update, values = self._wake_sql(instance_id, condition, params)
        notify, notify_params = self.notifier.from_cte("w", [TOPIC_RUNNABLE])
        statement = sql.compose(WAKE_NOTIFYING, update=update, notify=notify)
        woken = int(self._fetch(statement, sql.bind(values, notify_params))[0][0])
        if woken:  # local loops only: the NOTIFY is in the statement
            transaction.on_commit(lambda: self.bus.publish(TOPIC_RUNNABLE), using=self.alias)
        return woken

    def _lock_instance(self, instance_id: str, *, skip_locked: bool = False) -> bool:
        """``FOR NO KEY UPDATE`` is the lock a fence update takes: it queues behind fenced
        writers without blocking the foreign-key checks of rows that reference the
        instance (see :meth:`Database._lock_instance`)."""
        statement = sql.compose(LOCK_INSTANCE, skip=" SKIP LOCKED" if skip_locked else "")
        locked = self._fetch(statement, {"instance_id": instance_id})
        return bool(locked) or not skip_locked

    def _lock_task(self, task_id: int) -> bool:
        return bool(self._fetch(LOCK_TASK, {"task_id": task_id}))

    def _lock_limits(self, queues: Sequence[str], keys: Sequence[str]) -> None:
        """One advisory lock per queue and key until commit, so the counts that follow
        see every claim committed before (a hash collision only serialises more)."""
        classes = [QUEUE_LOCK_CLASS] * len(queues) + [KEY_LOCK_CLASS] * len(keys)
        self._fetch(LOCK_LIMITS, {"classes": classes, "names": [*queues, *keys]})

    # -- renewals ---------------------------------------------------------------------------

    def _renew(
        self,
        table: str,
        columns: str,
        where: str,
        set_sql: str,
        params: dict[str, Any],
    ) -> list[tuple[Any, ...]]:
        key = columns.split(",")[0].strip()
        statement = sql.compose(RENEW_BATCH, where=where, set=set_sql, columns=columns, key=key)
        return self._fetch(sql.compose(statement, table=table), params)

    # -- set-up and checks (setup.py) -------------------------------------------------------

    connection_created = staticmethod(setup.connection_created)
    server_checks = staticmethod(setup.server_checks)
