"""The store: one database alias, and one part per aggregate, held as members.

:class:`Store` builds its :class:`~.db.Database` (connection, transactions,
fences, wake-ups, clock: one subclass per database) and the parts on it, each
given its collaborators: ``store.instances`` (leases, snapshots, commands, the
close), ``.starts``, ``.children``, ``.cancels``, ``.releases``, ``.waits``
(timers, signals, observations), ``.tasks`` (activity tasks) with ``.limits``
(flow control), ``.inline`` (inline results) and ``.sole_activity``, ``.attributes``
(search attributes),
``.recovery`` (resume, fork, continue-as-new), the leader's sweeps
(``.task_timeouts``, ``.execution_timeouts``), ``.renewals``, ``.locks``,
``.heartbeats``, ``.schedules`` (schedule rows and the runs the leader starts),
``.reads``, ``.status`` and ``.streams`` (stream entries). What the engine calls
(:class:`~selvedge_django.engine.ports.EngineStore`) is served by one-line
delegations here; everything else is called on its part.

What differs between databases is the Database subclass and, for a few parts, a
subclass of just that part; :class:`~.postgresql.PostgresStore` and
:class:`~.sqlite.SQLiteStore` name them, and
:func:`selvedge_django.storage.store_for` picks the store of the alias's database.
Fenced writes start with a conditional update of the instance row that must touch
exactly one row (the writer still holds the lease epoch); claims are fenced the
same way by (owner, claim epoch) on the task row. Lease and claim expiry use the
database clock (``DbNowMs``). Wake-ups go out through the in-process bus and, on
PostgreSQL, NOTIFY, always after commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

from ..engine.attributes import AttributeValue
from ..engine.codec import Codec
from ..engine.events import Arrivals, Fence, HistoryRow
from ..engine.ports import (
    ChildSpec,
    ClaimedTask,
    CloseRequest,
    Observation,
    ObservationResult,
    ReceiveOutcome,
    SignalMessage,
    TaskSpec,
)
from ..models import WorkflowInstance
from .attempt_transactions import AttemptTransactions
from .attributes import Attributes
from .bulk_starts import BulkStarts
from .cancels import Cancels
from .children import Children
from .db import Database
from .execution_timeouts import ExecutionTimeouts
from .flow_control import Limits
from .heartbeats import Heartbeats
from .inline import Inline
from .instances import InstanceHead, Instances
from .locks import Locks
from .operation import operation
from .operator_reads import OperatorReads
from .options import StoreOptions
from .pauses import Pauses
from .reads import Reads
from .releases import Releases
from .renewals import Renewals
from .resume import Recovery
from .rotation import KeyRotation
from .schedules import Schedules
from .sole_activity import SoleActivity
from .starts import Starts
from .status_reads import EVERY_LEASE_MS, InstanceState, StatusReads
from .streams import Streams
from .task_timeouts import TaskTimeouts
from .tasks import Tasks
from .waits import Waits
from .wakeups import Bus

__all__ = ["DjangoStore", "InstanceHead", "Store"]


class Store:
    """Durable operations over the Django ORM for one database alias, part by part.

    Use :func:`selvedge_django.storage.store_for` to get the store of the alias's
    database; the portable class alone cannot dispatch or renew.
    """

    #: The database class, and the class of each part that differs between databases.
    database: ClassVar[type[Database]] = Database
    instances_class: ClassVar[type[Instances]] = Instances
    starts_class: ClassVar[type[Starts]] = Starts
    bulk_starts_class: ClassVar[type[BulkStarts]] = BulkStarts
    releases_class: ClassVar[type[Releases]] = Releases
    waits_class: ClassVar[type[Waits]] = Waits
    tasks_class: ClassVar[type[Tasks]] = Tasks
    sole_activity_class: ClassVar[type[SoleActivity]] = SoleActivity
    attempt_transactions_class: ClassVar[type[AttemptTransactions]] = AttemptTransactions
    streams_class: ClassVar[type[Streams]] = Streams
    #: Whether a write transaction locks the whole database (SQLite), not rows.
    single_writer: ClassVar[bool] = False

    def __init__(self, alias: str, codec: Codec) -> None:
        self.db = db = self.database(alias, codec)
        self.options = options = StoreOptions()
        self.inline = Inline(db)
        self.pauses = Pauses(db, options)
        self.limits = Limits(db, options, pauses=self.pauses)
        self.tasks = self.tasks_class(db, options, limits=self.limits, inline=self.inline)
        self.sole_activity = self.sole_activity_class(db, tasks=self.tasks)
        self.children = Children(db, options)
        self.attributes = Attributes(db)
        self.starts = self.starts_class(db, options, attributes=self.attributes)
        self.bulk_starts = self.bulk_starts_class(db)
        self.cancels = Cancels(db)
        self.releases = self.releases_class(db)
        self.instances = self.instances_class(db, options, children=self.children, tasks=self.tasks)
        self.waits = self.waits_class(db, children=self.children)
        self.recovery = Recovery(
            db, options, starts=self.starts, children=self.children, attributes=self.attributes
        )
        self.task_timeouts = TaskTimeouts(db)
        self.execution_timeouts = ExecutionTimeouts(db, instances=self.instances)
        self.renewals = Renewals(db)
        self.locks = Locks(db)
        self.schedules = Schedules(db, options)
        self.heartbeats = Heartbeats(db)
        self.reads = Reads(db)
        self.status = StatusReads(db)
        # runselvedge rotate-keys: stored envelopes re-encrypted under the first key.
        self.rotation = KeyRotation(db, codec)
        self.streams = self.streams_class(db, options)
        # The operations layer's reads: instances, histories, pages and batches.
        self.operator_reads = OperatorReads(alias)
        self.attempt_transactions = self.attempt_transactions_class(db, tasks=self.tasks)
        # The inline results' hooks of the database (storage.inline).
        db.has_deferred = self.inline.has_deferred
        db.apply_deferred = self.tasks._apply_deferred
        db.deferred_rolled_back = self.inline._deferred_rolled_back

    # -- the database -----------------------------------------------------------------

    @property
    def alias(self) -> str:
        return self.db.alias

    @property
    def codec(self) -> Codec:
        return self.db.codec

    @property
    def identity(self) -> str:
        return self.db.identity

    @property
    def bus(self) -> Bus:
        return self.db.bus

    @operation
    def atomic(self) -> contextlib.AbstractContextManager[None]:
        """See :meth:`~.db.Database.atomic`."""
        return self.db.atomic()

    @operation
    def read_snapshot(self) -> contextlib.AbstractContextManager[None]:
        """See :meth:`~.db.Database.read_snapshot`."""
        return self.db.read_snapshot()

    @operation
    def after_commit(self, *topics: str) -> None:
        """See :meth:`~.db.Database.after_commit`."""
        self.db.after_commit(*topics)

    # -- what the engine calls (engine.ports.EngineStore) ----------------------------------

    @operation
    def record_command(self, fence: Fence, row: HistoryRow) -> HistoryRow:
        """See :meth:`~.instances.Instances.record_command`."""
        return self.instances.record_command(fence, row)

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
        """See :meth:`~.tasks.Tasks.reserve_activity`."""
        return self.tasks.reserve_activity(
            fence, row, task, claim_owner, release=release, observe_cancel=observe_cancel
        )

    @operation
    def claim_task(self, instance_id: str, key: str, owner: str) -> ClaimedTask | None:
        """See :meth:`~.tasks.Tasks.claim_task`."""
        return self.tasks.claim_task(instance_id, key, owner)

    @operation
    def get_row(self, instance_id: str, key: str) -> HistoryRow | None:
        """See :meth:`~.db.Database.get_row`."""
        return self.db.get_row(instance_id, key)

    @operation
    def close(self, fence: Fence, request: CloseRequest) -> str:
        """See :meth:`~.instances.Instances.close`."""
        return self.instances.close(fence, request)

    @operation
    def release_lease(
        self,
        fence: Fence,
        runnable: bool = False,
        parked: tuple[int, str] | None = None,
        sticky: float | None = None,
    ) -> None:
        """See :meth:`~.releases.Releases.release_lease`."""
        return self.releases.release_lease(fence, runnable, parked, sticky)

    @operation
    def now_ms(self) -> int:
        """See :meth:`~.db.Database.now_ms`."""
        return self.db.now_ms()

    @operation
    def reserve_timer(
        self, fence: Fence, row: HistoryRow, expires_at: datetime, delay: float
    ) -> HistoryRow:
        """See :meth:`~.waits.Waits.reserve_timer`."""
        return self.waits.reserve_timer(fence, row, expires_at, delay)

    @operation
    def observe(self, fence: Fence, observation: Observation) -> ObservationResult:
        """See :meth:`~.waits.Waits.observe`."""
        return self.waits.observe(fence, observation)

    @operation
    def next_signal(self, instance_id: str, channel: str) -> SignalMessage | None:
        """See :meth:`~.waits.Waits.next_signal`."""
        return self.waits.next_signal(instance_id, channel)

    @operation
    def receive_next(
        self, fence: Fence, seq: int, key: str, channel: str, uncancelled: bool
    ) -> ReceiveOutcome | None:
        """See :meth:`~.waits.Waits.receive_next`."""
        return self.waits.receive_next(fence, seq, key, channel, uncancelled)

    @operation
    def signal_payload(self, signal_id: int) -> str | None:
        """See :meth:`~.waits.Waits.signal_payload`."""
        return self.waits.signal_payload(signal_id)

    @operation
    def arrivals(self, instance_id: str) -> Arrivals:
        """See :meth:`~.waits.Waits.arrivals`."""
        return self.waits.arrivals(instance_id)

    @operation
    def cancel_state(self, instance_id: str) -> tuple[bool, str]:
        """See :meth:`~.cancels.Cancels.cancel_state`."""
        return self.cancels.cancel_state(instance_id)

    @operation
    def timer_fired(self, instance_id: str, key: str) -> bool:
        """See :meth:`~.waits.Waits.timer_fired`."""
        return self.waits.timer_fired(instance_id, key)

    @operation
    def start_child(self, fence: Fence, row: HistoryRow, child: ChildSpec) -> HistoryRow:
        """See :meth:`~.children.Children.start_child`."""
        return self.children.start_child(fence, row, child)

    @operation
    def set_progress(self, fence: Fence, progress: str) -> None:
        """See :meth:`~.instances.Instances.set_progress`."""
        return self.instances.set_progress(fence, progress)

    @operation
    def set_attributes(
        self, fence: Fence, row: HistoryRow, attributes: Mapping[str, AttributeValue | None]
    ) -> HistoryRow:
        """See :meth:`~.attributes.Attributes.set_attributes`."""
        return self.attributes.set_attributes(fence, row, attributes)

    @operation
    def write_stream(self, fence: Fence, row: HistoryRow, key: str, value: str) -> HistoryRow:
        """See :meth:`~.streams.Streams.write_command`."""
        return self.streams.write_command(fence, row, key, value)

    @operation
    def close_stream(self, fence: Fence, row: HistoryRow, key: str) -> HistoryRow:
        """See :meth:`~.streams.Streams.close_command`."""
        return self.streams.close_command(fence, row, key)

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
        with self.db.atomic():
            started = self.starts.create_instance(
                instance_id,
                workflow_name,
                input_value,
                service_name=service_name,
                code_version=code_version,
                execution_timeout_ms=execution_timeout_ms,
                if_exists="return",
                trace_context=trace_context,
            )
            self.waits.append_signal(
                instance_id,
                channel,
                payload,
                max_pending=max_pending,
                idempotency_key=idempotency_key,
                trace_context=trace_context,
            )
        return bool(started.created)


#: The name of :class:`Store` before it held its parts as members (one release).
DjangoStore = Store
