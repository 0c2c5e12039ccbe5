"""The dispatcher: leases runnable and expired instances and runs their executions."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .. import metrics
from ..registry import registered_workflow_names
from ..storage import InstanceHead
from ..storage.wakeups import Bus
from .base import Loop
from .pool import ThreadPool

if TYPE_CHECKING:
    from .runtime import WorkerRuntime

__all__ = ["Dispatcher"]


class Dispatcher(Loop):
    """Lease up to the free resumption slots and hand each lease to the pool."""

    name = "dispatcher"
    topics = ("runnable",)

    def __init__(self, runtime: WorkerRuntime, bus: Bus, pool: ThreadPool) -> None:
        settings = runtime.settings
        super().__init__(bus, settings.workflow_resumption_interval, settings.max_poll_interval)
        self.runtime = runtime
        self.pool = pool
        # The last lease filled every free slot: more instances may be waiting.
        self.saturated = False

    def run_once(self) -> int:
        if self.runtime.stopping.is_set():
            return 0
        settings = self.runtime.settings
        free = min(self.pool.free_slots(), settings.max_workflows_per_batch)
        if free <= 0:
            return 0
        started = time.monotonic()
        leased = self.runtime.store.instances.lease_batch(
            self.runtime.worker_id,
            settings.lease.ttl,
            free,
            registered_workflow_names(),
            passed_over=self.runtime.undecodable.passed_over(),
        )
        self.saturated = len(leased) >= free
        cache = self.runtime.cache
        for fence, head in leased:
            _count_dispatch(head)
            # Trusted from the lease's statement on: on SQLite that may be long after
            # `started`, behind other writers.
            leased_at = started if head.leased_at is None else head.leased_at
            # Held (and renewed) from now on, even if a start handed over in this process
            # took the slot meanwhile and the execution waits for a thread.
            self.runtime.hold(fence, leased_at)
            if cache is not None and cache.resume(fence, head):
                continue  # the parked execution goes on under the new lease, no replay
            self.pool.submit(self.runtime.execute, fence, leased_at, None, head)
        return len(leased)

    def more_waiting(self, done: int) -> bool:
        return self.saturated

    def next_delay(self, idle_delay: float) -> float:
        """Poll again by the time an instance held back after a storage error is due."""
        due = self.runtime.next_deferred_in()
        return idle_delay if due is None else min(idle_delay, due)

    def slot_freed(self) -> None:
        """A resumption finished: poll again at once only if instances were left waiting."""
        if self.saturated:
            self.waker.wake()


def _count_dispatch(head: InstanceHead) -> None:
    """The metrics of one lease: a takeover of an expired lease, or the dispatch lag."""
    if head.taken_over:
        metrics.record(metrics.LEASE_TAKEOVERS, 1, lease_kind="workflow")
    elif head.dispatch_lag_ms is not None:
        metrics.record(
            metrics.DISPATCH_LAG, head.dispatch_lag_ms / 1000, workflow_name=head.workflow_name
        )
