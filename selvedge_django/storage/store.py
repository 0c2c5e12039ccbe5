"""The portable store: every durable operation, one transaction each, on one database alias.

:class:`DjangoStore` puts the store's parts together (each a module of this
package, built on :class:`~.base.StoreBase`); what differs between databases is
in exactly one subclass each, :class:`~.postgresql.PostgresStore` and
:class:`~.sqlite.SQLiteStore`, and :func:`selvedge_django.storage.store_for`
picks it. Fenced writes start with a conditional update of the instance row
that must touch exactly one row (the writer still holds the lease epoch); claims
are fenced the same way by (owner, claim epoch) on the task row. Lease and claim
expiry use the database clock (``DbNowMs``). Wake-ups go out through the
in-process bus and, on PostgreSQL, NOTIFY, always after commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..engine.codec import Codec
from ..engine.ports import TaskClaim
from .base import operation
from .execution_timeouts import ExecutionTimeoutStore
from .heartbeats import HeartbeatStore
from .inline import InlineResultStore
from .instances import InstanceHead, InstanceStore
from .locks import LockStore
from .operator_reads import OperatorReads
from .reads import ReadStore
from .renewals import RenewalStore
from .resume import ResumeStoreMixin
from .sole_activity import SoleActivityStore
from .status_reads import StatusReads, StatusReadStore
from .task_timeouts import TaskTimeoutStore
from .waits import WaitStore

__all__ = ["DjangoStore", "InstanceHead"]


def _nothing() -> None:
    """Nothing to do before a transactional attempt records its result."""


class DjangoStore(
    InstanceStore,
    ResumeStoreMixin,
    ExecutionTimeoutStore,
    WaitStore,
    TaskTimeoutStore,
    RenewalStore,
    LockStore,
    HeartbeatStore,
    StatusReadStore,
    ReadStore,
    InlineResultStore,
    SoleActivityStore,
):
    """Durable operations over the Django ORM for one database alias (portable part).

    Use :func:`selvedge_django.storage.store_for` to get the subclass of the alias's
    database; the portable class alone cannot dispatch or renew.
    """

    def __init__(self, alias: str, codec: Codec) -> None:
        super().__init__(alias, codec)
        # The operations layer's reads (members, not parts of this class): instances,
        # histories, pages and batches; and the status report's workers, queues, timers.
        self.operator_reads = OperatorReads(alias)
        self.status_reads = StatusReads(alias)

    @operation
    def signal_with_start(
        self,
        instance_id: str,
        workflow_name: str,
        input_value: Any,
        channel: str,
        payload: str,
        *,
        service_name: str = "",
        code_version: str | None = None,
        execution_timeout_ms: int | None = None,
        max_pending: int | None = None,
        idempotency_key: str | None = None,
        trace_context: str | None = None,
    ) -> bool:
        """Start the instance unless its id exists, then append the signal: one transaction.

        Returns whether this call created the instance. The id's owner must be
        ``workflow_name`` (else :class:`WorkflowAlreadyStarted`); a closed instance
        refuses the signal (:class:`InstanceClosed`) and nothing is written. Racing
        callers queue on the primary key (the start) and then on the instance row (the
        signal), so they make one instance and deliver every signal once.
        ``trace_context`` (the caller's, JSON text) goes on both rows.
        """
        with self.atomic():
            started = self.create_instance(
                instance_id,
                workflow_name,
                input_value,
                service_name=service_name,
                code_version=code_version,
                execution_timeout_ms=execution_timeout_ms,
                if_exists="return",
                trace_context=trace_context,
            )
            self.append_signal(
                instance_id,
                channel,
                payload,
                max_pending=max_pending,
                idempotency_key=idempotency_key,
                trace_context=trace_context,
            )
        return bool(started.created)

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
        with self.atomic():
            # A body may wait on other things inside its transaction: a role's
            # idle_in_transaction_session_timeout would end the session every time.
            self.allow_idle_transaction(timeout)
            yield _nothing
