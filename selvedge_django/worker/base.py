"""The shape every worker loop shares: ``run_once() -> int`` and ``run(stop)``.

A loop polls with adaptive backoff: after work it polls again at once; when
idle it waits ``interval``, doubling up to ``max_interval``, with jitter so that
many workers do not poll in step. A wake-up on one of its bus topics cuts the
wait short. Each loop thread owns its Django connection and closes it on exit.
"""

from __future__ import annotations

import logging
import random
import threading

from django.db import close_old_connections, connections

from ..storage.wakeups import Bus, Waker

__all__ = ["Loop", "drop_broken_connections"]

logger = logging.getLogger("selvedge_django.worker")


def drop_broken_connections() -> None:
    """Close this thread's connections that failed and no longer work, so the next use
    reconnects (Django only reconnects a connection that was closed, such as after the
    database restarted). Healthy connections stay open whatever CONN_MAX_AGE says."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or not conn.errors_occurred or conn.in_atomic_block:
            continue
        if conn.is_usable():
            conn.errors_occurred = False
        else:
            conn.close()


class Loop:
    """A polling loop with adaptive backoff and bus wake-ups."""

    name = "loop"
    topics: tuple[str, ...] = ()

    def __init__(self, bus: Bus, interval: float, max_interval: float) -> None:
        self.bus = bus
        self.interval = interval
        self.max_interval = max(max_interval, interval)
        self.waker = Waker()
        self.errors = 0

    def run_once(self) -> int:
        """Do one round of work; return how much was done."""
        raise NotImplementedError

    def next_delay(self, idle_delay: float) -> float:
        """The wait before the next poll when idle (loops may shorten it)."""
        return idle_delay

    def more_waiting(self, done: int) -> bool:
        """Whether work may still be waiting after a round that did ``done``.

        Loops that ask for a bounded batch say no when the batch came back short,
        so that they wait for a wake-up instead of polling an empty table again.
        """
        return done > 0

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        for topic in self.topics:
            self.bus.subscribe(topic, self.waker)
        delay = self.interval
        try:
            while not stop.is_set():
                try:
                    done = self.run_once()
                    self.errors = 0
                    # Loops that handle their own errors (the renewer) reconnect here.
                    drop_broken_connections()
                except Exception:
                    self.errors += 1
                    logger.exception("%s loop failed (%d in a row)", self.name, self.errors)
                    close_old_connections()
                    for conn in connections.all(initialized_only=True):
                        conn.close_if_unusable_or_obsolete()
                    done = 0
                if done > 0:
                    delay = self.interval
                    if self.more_waiting(done):
                        continue
                wait = self.next_delay(delay) * random.uniform(0.8, 1.0)
                self.waker.wait(max(0.0, min(wait, self.max_interval)))
                delay = min(delay * 2, self.max_interval)
        finally:
            for topic in self.topics:
                self.bus.unsubscribe(topic, self.waker)
            connections.close_all()
