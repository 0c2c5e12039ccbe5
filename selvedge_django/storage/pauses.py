"""Pausing: an instance held by an operator's lease, and activity queues no claim takes from.

A paused instance stays ``running``. Its lease belongs to :data:`PAUSED_OWNER`
under a new epoch and never expires: dispatch takes only unowned or expired
leases, so it walks past nothing (the instance is in neither of its index
ranges), and an execution that was running is fenced out at its next write (its
step rolls back and runs again after the unpause). Its queued and running tasks
and its timers are marked ``held`` in the same transaction: claims and the timer
poller skip held rows, and an attempt already running still records its outcome
(a claim is its own token). Arrivals need no lease, so signals, cancel requests,
activity results and child outcomes are recorded and make the instance runnable;
they take effect when the unpause gives the lease back to dispatch. Terminate and
the execution timeout close a paused instance like any other.

A paused queue is a row of :class:`~selvedge_django.models.ActivityQueue`. Claims
leave its tasks queued (``sql.CLAIM_NOT_QUEUES``, like a full rate-limited queue);
each process keeps the set of paused queues for at most the activity poll
interval, and forgets it at once when a pause or unpause is published on
:data:`~.wakeups.TOPIC_QUEUES` (in this process at commit, in others through
NOTIFY on PostgreSQL).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.db.models import F
from django.utils import timezone

from .. import exceptions as exc
from ..models import (
    PAUSED_OWNER,
    ActivityQueue,
    ActivityTask,
    ActivityTaskStatus,
    TimerSubscription,
    WorkflowInstance,
    WorkflowStatus,
)
from .db import Database
from .operation import operation
from .options import StoreOptions
from .wakeups import TOPIC_QUEUES, TOPIC_RUNNABLE, TOPIC_TASK, TOPIC_TIMER, Waker

__all__ = ["PAUSED_OWNER", "PausedQueues", "Pauses"]


class PausedQueues(Waker):
    """One database's paused queues as this process last read them (shared by its
    stores), forgotten when :data:`~.wakeups.TOPIC_QUEUES` is published."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._read: tuple[float, frozenset[str]] | None = None
        # Bumped by each wake: a read that began before it is not kept.
        self._generation = 0

    def wake(self) -> None:
        with self._lock:
            self._read = None
            self._generation += 1

    def get(self, max_age: float) -> tuple[frozenset[str] | None, int]:
        """(the set read at most ``max_age`` seconds ago or None, the generation)."""
        with self._lock:
            if self._read is None or time.monotonic() - self._read[0] > max_age:
                return None, self._generation
            return self._read[1], self._generation

    def put(self, queues: frozenset[str], read_at: float, generation: int) -> None:
        """Keep a set read at ``read_at``, unless a wake came since ``generation``."""
        with self._lock:
            if generation == self._generation:
                self._read = (read_at, queues)


_paused_queues: dict[str, PausedQueues] = {}
_paused_queues_lock = threading.Lock()


def paused_queues_of(db: Database) -> PausedQueues:
    """The process-wide cache of ``db``'s paused queues, subscribed to its bus once."""
    with _paused_queues_lock:
        cache = _paused_queues.get(db.identity)
        if cache is None:
            cache = _paused_queues[db.identity] = PausedQueues()
            db.bus.subscribe(TOPIC_QUEUES, cache)
        return cache


class Pauses:
    """Pause and unpause instances and activity queues (``store.pauses``)."""

    def __init__(self, db: Database, options: StoreOptions) -> None:
        self.db = db
        self.options = options
        self._cache = paused_queues_of(db)

    # -- instances ----------------------------------------------------------------------

    def _locked_state(self, instance_id: str) -> tuple[str, str]:
        """(status, lease owner) of an instance, its row locked; WorkflowNotFound."""
        row = (
            WorkflowInstance.objects.using(self.db.alias)
            .filter(instance_id=instance_id)
            .select_for_update(no_key=True)
            .values_list("status", "lease_owner")
            .first()
        )
        if row is None:
            raise exc.WorkflowNotFound(instance_id)
        return str(row[0]), str(row[1])

    @operation
    def pause(self, instance_id: str, reason: str) -> None:
        """Pause a running instance, in one transaction: the operator's lease under a new
        epoch (a running execution is fenced out, and the instance is left runnable so
        that its step runs again after the unpause), then its unfinished tasks and its
        timers held. Lock order: the instance row, then its task rows, then its timers.

        Raises :class:`WorkflowNotFound`, or :class:`InvalidWorkflowState` when it is
        closed or already paused (nothing written).
        """
        instances = WorkflowInstance.objects.using(self.db.alias)
        with self.db.atomic():
            status, owner = self._locked_state(instance_id)
            if status != WorkflowStatus.RUNNING:
                raise exc.InvalidWorkflowState(
                    instance_id, status, f"{instance_id!r} is {status}: only a running one pauses"
                )
            if owner == PAUSED_OWNER:
                raise exc.InvalidWorkflowState(
                    instance_id, status, f"{instance_id!r} is paused already"
                )
            now = timezone.now()
            fields: dict[str, Any] = {
                "lease_owner": PAUSED_OWNER,
                "lease_epoch": F("lease_epoch") + 1,
                "lease_expires_ms": None,
                "sticky_owner": "",
                "sticky_until_ms": 0,
                "paused_reason": reason,
                "paused_at": now,
                "updated_at": now,
            }
            if owner:
                # A lease was held (live or lapsed): what its execution did since the
                # last commit is redone after the unpause.
                fields.update(self.db.wake_fields())
            instances.filter(instance_id=instance_id, status=WorkflowStatus.RUNNING).update(
                **fields
            )
            self._hold(instance_id, held=True)

    @operation
    def unpause(self, instance_id: str) -> None:
        """Give a paused instance back to dispatch, in one transaction: the lease unowned
        (its epoch stays; the next lease takes a new one), its tasks and timers
        released; wakes dispatch, claims and the timer poller after commit. A runnable
        instance keeps its place in line (``ready_ms``).

        Raises :class:`WorkflowNotFound`, or :class:`InvalidWorkflowState` when it is
        closed or not paused (nothing written).
        """
        instances = WorkflowInstance.objects.using(self.db.alias)
        with self.db.atomic():
            status, owner = self._locked_state(instance_id)
            if status != WorkflowStatus.RUNNING:
                raise exc.InvalidWorkflowState(
                    instance_id, status, f"{instance_id!r} is {status}: only a paused one unpauses"
                )
            if owner != PAUSED_OWNER:
                raise exc.InvalidWorkflowState(
                    instance_id, status, f"{instance_id!r} is not paused"
                )
            instances.filter(
                instance_id=instance_id, status=WorkflowStatus.RUNNING, lease_owner=PAUSED_OWNER
            ).update(
                lease_owner="",
                lease_expires_ms=None,
                paused_reason="",
                paused_at=None,
                updated_at=timezone.now(),
            )
            self._hold(instance_id, held=False)
            self.db.after_commit(TOPIC_RUNNABLE, TOPIC_TASK, TOPIC_TIMER)

    def _hold(self, instance_id: str, *, held: bool) -> None:
        """Mark an instance's unfinished tasks and its timers held (or not)."""
        ActivityTask.objects.using(self.db.alias).filter(
            instance_id=instance_id,
            status__in=(ActivityTaskStatus.QUEUED, ActivityTaskStatus.RUNNING),
            held=not held,
        ).update(held=held)
        TimerSubscription.objects.using(self.db.alias).filter(
            instance_id=instance_id, held=not held
        ).update(held=held)

    # -- queues -------------------------------------------------------------------------

    @operation
    def set_queue_paused(self, name: str, paused: bool) -> bool:
        """Pause or unpause an activity queue; return whether that changed anything.

        Publishes :data:`~.wakeups.TOPIC_QUEUES` after commit (every process forgets
        its paused queues), and on an unpause :data:`~.wakeups.TOPIC_TASK` too.
        """
        queues = ActivityQueue.objects.using(self.db.alias)
        with self.db.atomic():
            before = queues.filter(name=name).select_for_update().values_list("paused").first()
            if (False if before is None else bool(before[0])) == paused:
                return False
            # An upsert: two first pauses of one queue at once both succeed.
            queues.bulk_create(
                [ActivityQueue(name=name, paused=paused, updated_at=timezone.now())],
                update_conflicts=True,
                unique_fields=["name"],
                update_fields=["paused", "updated_at"],
            )
            self.db.after_commit(TOPIC_QUEUES, *(() if paused else (TOPIC_TASK,)))
        return True

    @operation
    def paused_queue_names(self) -> frozenset[str]:
        """The paused activity queues, as this process read them at most the activity
        poll interval ago (at once after a pause or unpause it heard of)."""
        cached, generation = self._cache.get(self.options.paused_queues_max_age)
        if cached is not None:
            return cached
        read_at = time.monotonic()
        names = frozenset(
            ActivityQueue.objects.using(self.db.alias)
            .filter(paused=True)
            .values_list("name", flat=True)
        )
        self._cache.put(names, read_at, generation)
        return names

    @operation
    def queue_rows(self) -> dict[str, bool]:
        """Every queue an operator ever paused: name -> paused now (read now)."""
        return dict(ActivityQueue.objects.using(self.db.alias).values_list("name", "paused"))
