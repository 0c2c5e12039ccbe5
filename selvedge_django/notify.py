"""In-process wake-ups between the threads of one process.

Every wake-up is a hint sent after commit and may be lost: pollers alone are
enough for correctness. Loops wait on a :class:`Waker`; the bus sets the wakers
subscribed to a topic. Topics: ``runnable`` (an instance can be dispatched),
``task`` (an activity task can be claimed), ``timer`` (a timer was armed) and
``closed:<instance id>`` (for ``wait_workflow``).
"""

from __future__ import annotations

import threading
from collections import defaultdict

__all__ = ["Bus", "Waker", "bus_for"]


class Waker:
    """A resettable event: ``wait()`` returns early when someone calls ``wake()``."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def wake(self) -> None:
        self._event.set()

    def wait(self, timeout: float | None) -> bool:
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken


class Bus:
    """Topic -> wakers, for one database."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[str, set[Waker]] = defaultdict(set)

    def subscribe(self, topic: str, waker: Waker) -> None:
        with self._lock:
            self._subscribers[topic].add(waker)

    def unsubscribe(self, topic: str, waker: Waker) -> None:
        with self._lock:
            subscribers = self._subscribers.get(topic)
            if subscribers is not None:
                subscribers.discard(waker)
                if not subscribers:
                    del self._subscribers[topic]

    def subscribed(self, topic: str) -> int:
        """How many wakers wait on ``topic``."""
        with self._lock:
            return len(self._subscribers.get(topic, ()))

    def publish(self, topic: str) -> None:
        with self._lock:
            wakers = list(self._subscribers.get(topic, ()))
        for waker in wakers:
            waker.wake()


_buses: dict[str, Bus] = {}
_buses_lock = threading.Lock()


def bus_for(database_identity: str) -> Bus:
    """Return the process-wide bus of one database (by alias and name)."""
    with _buses_lock:
        bus = _buses.get(database_identity)
        if bus is None:
            bus = _buses[database_identity] = Bus()
        return bus
