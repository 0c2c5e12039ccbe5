"""The timer poller: fires due timers in bounded batches, on the database clock."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..storage.wakeups import Bus
from .base import Loop

if TYPE_CHECKING:
    from .runtime import WorkerRuntime

__all__ = ["TimerPoller"]


class TimerPoller(Loop):
    """Fire timers due on the database clock; wake early for the next one.

    ``CLOCK`` gives workflow time (``ctx.now()`` and the expiry a timer records);
    firing follows the database clock, like leases and claims: a timer armed for
    ``d`` seconds fires ``d`` seconds after its arming, measured there, so a
    frozen or skewed ``CLOCK`` neither stops nor hastens it.
    """

    name = "timers"
    topics = ("timer",)

    def __init__(self, runtime: WorkerRuntime, bus: Bus) -> None:
        settings = runtime.settings
        super().__init__(bus, settings.timer_check_interval, settings.max_poll_interval)
        self.runtime = runtime
        # What the last idle round read, for next_delay (no second read): the
        # milliseconds until the next fire (None: none armed) and when they were read.
        self._next_due: tuple[int | None, float] | None = None

    def run_once(self) -> int:
        runtime = self.runtime
        self._next_due = None
        if runtime.stopping.is_set():
            return 0
        # A read first: most wake-ups announce a timer armed for later, and firing
        # takes a write transaction (on SQLite, the database's write lock).
        due_ms = runtime.store.waits.next_timer_due_ms()
        if due_ms is None or due_ms > 0:
            self._next_due = (due_ms, time.monotonic())
            return 0
        woke: list[tuple[str, str, str]] = []
        done = runtime.store.waits.fire_due_timers(runtime.settings.max_timers_per_batch, woke)
        for instance_id, key, workflow_name in woke:
            runtime.fire(
                "on_timer_fired", instance_id=instance_id, key=key, workflow_name=workflow_name
            )
        return done

    def more_waiting(self, done: int) -> bool:
        return done >= self.runtime.settings.max_timers_per_batch

    def next_delay(self, idle_delay: float) -> float:
        if self._next_due is not None:
            due_ms, read_at = self._next_due
        else:
            try:
                due_ms, read_at = self.runtime.store.waits.next_timer_due_ms(), time.monotonic()
            except Exception:
                return idle_delay
        if due_ms is None:
            return idle_delay
        wait = due_ms / 1000 - (time.monotonic() - read_at)
        return max(0.0, min(idle_delay, wait + 0.005))
