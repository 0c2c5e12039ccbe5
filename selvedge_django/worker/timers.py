"""The timer poller: fires due timers in bounded batches, on the configured clock."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from ..notify import Bus
from .base import Loop

if TYPE_CHECKING:
    from ..runtime import WorkerRuntime

__all__ = ["TimerPoller"]


class TimerPoller(Loop):
    """Fire timers whose expiry passed; wake early for the next expiry."""

    name = "timers"
    topics = ("timer",)

    def __init__(self, runtime: WorkerRuntime, bus: Bus) -> None:
        settings = runtime.settings
        super().__init__(bus, settings.timer_check_interval, settings.max_poll_interval)
        self.runtime = runtime
        # The next expiry read by the last idle round, for next_delay (no second read).
        self._next_due: tuple[datetime | None] | None = None

    def run_once(self) -> int:
        runtime = self.runtime
        self._next_due = None
        if runtime.stopping.is_set():
            return 0
        # A read first: most wake-ups announce a timer armed for later, and firing
        # takes a write transaction (on SQLite, the database's write lock).
        due = runtime.store.next_timer_due()
        now = runtime.clock()
        if due is None or due > now:
            self._next_due = (due,)
            return 0
        woke: list[tuple[str, str, str]] = []
        done = runtime.store.fire_due_timers(now, runtime.settings.max_timers_per_batch, woke)
        for instance_id, key, workflow_name in woke:
            runtime.fire(
                "on_timer_fired", instance_id=instance_id, key=key, workflow_name=workflow_name
            )
        return done

    def more_waiting(self, done: int) -> bool:
        return done >= self.runtime.settings.max_timers_per_batch

    def next_delay(self, idle_delay: float) -> float:
        if self._next_due is not None:
            (due,) = self._next_due
        else:
            try:
                due = self.runtime.store.next_timer_due()
            except Exception:
                return idle_delay
        if due is None:
            return idle_delay
        wait = (due - self.runtime.clock()).total_seconds()
        return max(0.0, min(idle_delay, wait + 0.005))
