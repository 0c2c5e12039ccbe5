"""NOTIFY on PostgreSQL: the statements that tell other processes' loops to look.

Every wake-up is a hint (pollers find the work anyway); :mod:`..wakeups` names the
topics. Two shapes: a statement of its own (:meth:`Notifier.send`, at the end of a
store transaction, or after a commit for a waiter's hint), and a scalar subquery that
a one-statement write carries (:meth:`Notifier.from_cte`), sent only if the CTE it
follows wrote a row. Both skip the NOTIFY while PostgreSQL's notification queue is
half full (``NOTIFY_QUEUE_CEILING``), so that a full queue cannot fail a commit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from .. import sql
from ..db import Database
from ..wakeups import NOTIFY_QUEUE_CEILING, notify_channel, notify_payload
from .sql import NOTIFY_ALL, NOTIFY_CALL, NOTIFY_FROM

__all__ = ["Notifier"]

logger = logging.getLogger("selvedge_django.store")


class Notifier:
    """The NOTIFY statements of one PostgreSQL database (its ``notifier``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def send(self, topics: Sequence[str] | set[str]) -> None:
        """Send ``topics`` in one statement (in the current transaction, if any).

        A failure inside a transaction is raised (the transaction is broken anyway);
        outside one it is logged at debug level and dropped, as a lost hint."""
        calls, params = self.calls("notify", sorted(topics))
        statement = sql.compose(NOTIFY_ALL, calls=calls)
        params["notify_ceiling"] = NOTIFY_QUEUE_CEILING
        try:
            with self.db._cursor() as cursor:
                cursor.execute(statement, params)
        except DatabaseError:  # a hint only: pollers will find the work
            logger.debug("NOTIFY failed", exc_info=True)
            if self.db.connection.in_atomic_block:
                raise

    def from_cte(self, source: str, topics: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """A scalar subquery sending ``topics`` once if the CTE ``source`` has a row; its
        values are named after ``source`` (``c_notify_0_channel``, ``c_ceiling``), so that
        one statement can send from several CTEs. ``"0"`` when there is nothing to send."""
        if not (self.db.notify_enabled and topics):
            return "0", {}
        calls, params = self.calls(f"{source}_notify", topics)
        params[f"{source}_ceiling"] = NOTIFY_QUEUE_CEILING
        return sql.compose(NOTIFY_FROM, calls=calls, source=source), params

    @staticmethod
    def calls(name: str, topics: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """NOTIFY_CALL once per topic (``name_0``, ...) and the values they bind."""
        calls, params = [], {}
        for i, topic in enumerate(topics):
            calls.append(sql.compose(NOTIFY_CALL, name=f"{name}_{i}"))
            params[f"{name}_{i}_channel"] = notify_channel(topic)
            params[f"{name}_{i}_payload"] = notify_payload(topic)
        return ", ".join(calls), params
