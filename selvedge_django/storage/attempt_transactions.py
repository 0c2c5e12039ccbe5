"""The one transaction of a transactional attempt (``store.attempt_transactions``).

An activity declared ``transactional=True`` runs its body inside a transaction of the
engine's database, and its outcome is recorded in that same transaction: the body's
writes and the result commit together or not at all. On PostgreSQL that is one
transaction, with the session's idle-in-transaction timeout lifted for the body; on
SQLite the transaction holds the whole database's write lock, so the claim must be live
when it is taken and is extended under it
(:class:`~selvedge_django.storage.sqlite.store.SQLiteAttemptTransactions`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from ..engine.ports import TaskClaim
from .db import Database
from .operation import operation
from .tasks import Tasks

__all__ = ["AttemptTransactions"]


def _nothing() -> None:
    """Nothing to do before a transactional attempt records its result."""


class AttemptTransactions:
    """Transactional attempts' transactions on the store's database."""

    def __init__(self, db: Database, *, tasks: Tasks) -> None:
        self.db = db
        self.tasks = tasks

    @operation
    @contextlib.contextmanager
    def transactional_attempt(
        self, claim: TaskClaim, ttl: float, timeout: float | None
    ) -> Iterator[Callable[[], object]]:
        """The one transaction of a transactional attempt: its body's writes and its result.

        Yields what the attempt calls just before it records its result (here nothing;
        SQLite extends the claim). ``claim`` is the attempt's, ``ttl`` its claim TTL and
        ``timeout`` its start-to-close timeout. Raises
        :class:`~selvedge_django.exceptions.LeaseLost` before the body when the database
        finds the claim already lapsed (only SQLite looks).
        """
        with self.db.atomic():
            # A body may wait on other things inside its transaction: a role's
            # idle_in_transaction_session_timeout would end the session every time.
            self.db.allow_idle_transaction(timeout)
            yield _nothing
