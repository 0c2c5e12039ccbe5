"""Background activity workers: claim due tasks of registered activities and run them."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from ..registry import registered_activity_names
from ..storage.wakeups import Bus
from .base import Loop
from .pool import ThreadPool

if TYPE_CHECKING:
    from .runtime import WorkerRuntime

__all__ = ["ActivityPoller"]


class ActivityPoller(Loop):
    """Claim up to the free activity slots; wake early for the next retry's due time.

    The due time of the next queued task that is not due yet (a retry's backoff) is
    read after a round that claimed nothing, and kept: a round that claims tasks reads
    it only once the kept time has passed. Every task queued since (a reservation, a
    retry, a release) wakes this loop, and the round after the wake-up claims nothing
    when the task is not due yet, so the time is read again then. When that round
    claims other tasks instead, the new task's time is learnt at the next round that
    claims nothing, at most ``ACTIVITY_POLL_INTERVAL`` after the last work: a retry
    due sooner than that may start up to that much later. Without the kept time a
    busy worker would read it after every claim, one more transaction per
    background step.
    """

    name = "activities"
    topics = ("task",)

    def __init__(self, runtime: WorkerRuntime, bus: Bus, pool: ThreadPool) -> None:
        settings = runtime.settings
        super().__init__(bus, settings.activity_poll_interval, settings.max_poll_interval)
        self.runtime = runtime
        self.pool = pool
        # The last claim filled every free slot: more tasks may be waiting.
        self.saturated = False
        # The monotonic time the next queued task is due, as last read (None: nothing
        # queued then), and whether that reading still stands.
        self._next_due: float | None = None
        self._due_known = False

    def run_once(self) -> int:
        runtime = self.runtime
        if runtime.stopping.is_set() or runtime.settings.activity_queues == ():
            return 0
        free = self.pool.free_slots()
        if free <= 0:
            return 0
        claimed_at = time.monotonic()  # where the claims' belief starts
        tasks = runtime.store.tasks.claim_tasks(
            runtime.worker_id, free, registered_activity_names()
        )
        self.saturated = len(tasks) >= free
        if not tasks:
            self._due_known = False  # woken for a task not due yet, or polled: read again
        for task in tasks:
            self.pool.submit(
                functools.partial(runtime.attempts.run_claimed, claimed_at=claimed_at), task
            )
        return len(tasks)

    def more_waiting(self, done: int) -> bool:
        return self.saturated

    def slot_freed(self) -> None:
        """An attempt finished: poll again at once only if tasks were left waiting."""
        if self.saturated:
            self.waker.wake()

    def next_delay(self, idle_delay: float) -> float:
        if self.runtime.settings.activity_queues == ():
            return idle_delay  # serves no queue: nothing to wait for
        now = time.monotonic()
        if not self._due_known or (self._next_due is not None and self._next_due <= now):
            try:
                due_ms = self.runtime.store.tasks.next_task_due_ms(registered_activity_names())
            except Exception:
                self._due_known = False
                return idle_delay
            self._due_known = True
            self._next_due = None if due_ms is None else now + due_ms / 1000
            if due_ms is not None and due_ms <= 0:
                # Due tasks this claim did not take: another worker's, or held back by a
                # concurrency key or a queue's rate limit. Look again at the base interval
                # (a slot that frees elsewhere sends no wake-up), never in a busy loop.
                return min(idle_delay, self.interval)
        if self._next_due is None:
            return idle_delay
        return min(idle_delay, self._next_due - now + 0.005)
