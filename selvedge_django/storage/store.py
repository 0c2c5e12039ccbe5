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

from typing import Any, ClassVar

from ..engine.codec import Codec
from ..engine.events import Fence, HistoryRow
from ..engine.ports import ClaimedTask, TaskSpec
from ..models import WorkflowInstance
from .execution_timeouts import ExecutionTimeoutStore
from .flow_control import Limits
from .heartbeats import Heartbeats
from .inline import Inline
from .instances import InstanceHead, InstanceStore
from .locks import Locks
from .operation import operation
from .reads import Reads
from .renewals import Renewals
from .resume import ResumeStoreMixin
from .sole_activity import SoleActivity
from .status_reads import EVERY_LEASE_MS, InstanceState, StatusReads
from .task_timeouts import TaskTimeouts
from .tasks import Tasks
from .waits import WaitStore

__all__ = ["DjangoStore", "InstanceHead"]


class DjangoStore(
    InstanceStore,
    ResumeStoreMixin,
    ExecutionTimeoutStore,
    WaitStore,
):
    """Durable operations over the Django ORM for one database alias (portable part).

    Use :func:`selvedge_django.storage.store_for` to get the subclass of the alias's
    database; the portable class alone cannot dispatch or renew.
    """

    #: The class of each part that differs between databases (the dialect's subclass).
    tasks_class: ClassVar[type[Tasks]] = Tasks
    sole_activity_class: ClassVar[type[SoleActivity]] = SoleActivity

    def __init__(self, alias: str, codec: Codec) -> None:
        super().__init__(alias, codec)
        db, options = self.db, self.options
        self.inline = Inline(db)
        self.limits = Limits(db, options)
        self.tasks = self.tasks_class(db, options, limits=self.limits, inline=self.inline)
        self.sole_activity = self.sole_activity_class(db, tasks=self.tasks)
        self.task_timeouts = TaskTimeouts(db)
        self.renewals = Renewals(db)
        self.locks = Locks(db)
        self.heartbeats = Heartbeats(db)
        self.reads = Reads(db)
        self.status = StatusReads(db)
        # The inline results' hooks of the database (storage.inline).
        db.has_deferred = self.inline.has_deferred
        db.apply_deferred = self.tasks._apply_deferred
        db.deferred_rolled_back = self.inline._deferred_rolled_back

    # -- what the engine calls (engine.ports.EngineStore) ----------------------------------

    @operation
    def reserve_activity(
        self,
        fence: Fence,
        row: HistoryRow,
        task: TaskSpec,
        claim_owner: str | None,
        *,
        release: bool = False,
        observe_cancel: bool = False,
    ) -> tuple[HistoryRow, ClaimedTask | None]:
        """See :meth:`Tasks.reserve_activity`."""
        return self.tasks.reserve_activity(
            fence, row, task, claim_owner, release=release, observe_cancel=observe_cancel
        )

    @operation
    def claim_task(self, instance_id: str, key: str, owner: str) -> ClaimedTask | None:
        """See :meth:`Tasks.claim_task`."""
        return self.tasks.claim_task(instance_id, key, owner)

    # -- reads the operations layer calls on the store (until they move to store.reads) --

    @operation
    def get_instance(self, instance_id: str) -> WorkflowInstance:
        """The instance row; WorkflowNotFound when there is none."""
        return self.reads.get_instance(instance_id)

    @operation
    def get_result_row(self, instance_id: str) -> tuple[str, str | None, str | None]:
        """An instance's (status, output, error), in one hand-written read."""
        return self.reads.get_result_row(instance_id)

    @operation
    def get_task_record_row(self, instance_id: str, key: str) -> dict[str, Any]:
        """An instance and its activity task ``key`` in one hand-written read."""
        return self.reads.get_task_record_row(instance_id, key)

    @operation
    def runnable_instances(self, ready_by_ms: int, limit: int) -> list[InstanceState]:
        """Runnable instances ready by ``ready_by_ms``, the longest waiting first."""
        return self.status.runnable_instances(ready_by_ms, limit)

    @operation
    def count_runnable(self, ready_by_ms: int, limit: int) -> int:
        """How many instances are runnable and ready by ``ready_by_ms``, up to ``limit``."""
        return self.status.count_runnable(ready_by_ms, limit)

    @operation
    def leased_instances(
        self, expired_before_ms: int = EVERY_LEASE_MS, limit: int = 100
    ) -> list[InstanceState]:
        """Leased instances whose lease expires before ``expired_before_ms``, earliest first."""
        return self.status.leased_instances(expired_before_ms, limit)

    @operation
    def long_histories(self, threshold: int, limit: int) -> list[InstanceState]:
        """Running instances suspended past command position ``threshold``, longest first."""
        return self.status.long_histories(threshold, limit)

    @operation
    def erring_instances(self, limit: int) -> list[InstanceState]:
        """Running instances held back after storage errors, the most errors first."""
        return self.status.erring_instances(limit)

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
