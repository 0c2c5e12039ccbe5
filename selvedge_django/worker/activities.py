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
    """Claim up to the free activity slots; wake early for the next retry's due time."""

    name = "activities"
    topics = ("task",)

    def __init__(self, runtime: WorkerRuntime, bus: Bus, pool: ThreadPool) -> None:
        settings = runtime.settings
        super().__init__(bus, settings.activity_poll_interval, settings.max_poll_interval)
        self.runtime = runtime
        self.pool = pool
        # The last claim filled every free slot: more tasks may be waiting.
        self.saturated = False

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
        try:
            due_ms = self.runtime.store.tasks.next_task_due_ms(registered_activity_names())
        except Exception:
            return idle_delay
        if due_ms is None:
            return idle_delay
        if due_ms <= 0:
            # Due tasks this claim did not take: another worker's, or held back by a
            # concurrency key or a queue's rate limit. Look again at the base interval
            # (a slot that frees elsewhere sends no wake-up), never in a busy loop.
            return min(idle_delay, self.interval)
        return min(idle_delay, due_ms / 1000 + 0.005)
