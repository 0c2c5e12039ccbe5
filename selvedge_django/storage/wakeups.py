"""Wake-ups: the in-process bus, and the topics and payloads of PostgreSQL NOTIFY.

Every wake-up is a hint sent after commit and may be lost: pollers alone are
enough for correctness. Loops wait on a :class:`Waker`; the bus sets the wakers
subscribed to a topic. Topics: ``runnable`` (an instance can be dispatched),
``task`` (an activity task can be claimed), ``timer`` (a timer was armed),
``queues`` (an activity queue was paused or unpaused), ``closed:<instance id>``
(for ``wait_workflow``) and ``stream:<instance id>`` (a stream entry was written,
or a stream closed, for ``read_stream``). Other processes hear them
through NOTIFY (sent by the PostgreSQL store, relayed to the bus by
:mod:`selvedge_django.storage.postgresql.listener`): the wake-ups of work on
:data:`NOTIFY_CHANNEL`, which workers listen on, and the hints to waiters on
:data:`HINT_CHANNEL`, which only processes that wait listen on
(:func:`notify_channel`).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import defaultdict

__all__ = [
    "HINT_CHANNEL",
    "NOTIFY_CHANNEL",
    "NOTIFY_QUEUE_CEILING",
    "TOPIC_QUEUES",
    "TOPIC_RUNNABLE",
    "TOPIC_TASK",
    "TOPIC_TIMER",
    "Bus",
    "Waker",
    "bus_for",
    "closed_topic",
    "is_waiter_hint",
    "notify_channel",
    "notify_origin",
    "notify_payload",
    "notify_topic",
    "stream_topic",
]

# The wake-ups of work (every topic but the waiters' hints): workers listen here.
NOTIFY_CHANNEL = "selvedge_wake"
# The hints to waiters (closed:, stream:): only processes that wait listen here, so a
# worker's listener is not woken by every close of every other worker.
HINT_CHANNEL = "selvedge_hint"

# NOTIFY is a hint (pollers find the work anyway), and a transaction that notifies
# fails at COMMIT once PostgreSQL's notification queue is full (a listener that never
# reads pins it). So every NOTIFY is skipped, in the same statement, while the queue
# is this full: then nothing short of the other half filling between that statement
# and the commit can make a write fail because of it. (PostgreSQL itself warns at
# half full, naming the stalled listener's process.)
NOTIFY_QUEUE_CEILING = 0.5

# An instance can be dispatched.
TOPIC_RUNNABLE = "runnable"
# An activity task can be claimed.
TOPIC_TASK = "task"
# A timer was armed.
TOPIC_TIMER = "timer"
# An activity queue was paused or unpaused (storage.pauses forgets what it read).
TOPIC_QUEUES = "queues"


def closed_topic(instance_id: str) -> str:
    """The topic an instance's close is published on (``wait_workflow`` waits on it)."""
    return f"closed:{instance_id}"


def stream_topic(instance_id: str) -> str:
    """The topic a write to (or the close of) any of an instance's streams is published on."""
    return f"stream:{instance_id}"


def is_waiter_hint(topic: str) -> bool:
    """Whether ``topic`` only tells waiters (``wait_workflow``, ``read_stream``) to look.

    Those go out after the commit, in a statement of their own, not inside the write:
    PostgreSQL takes one database-wide lock when a transaction that notifies commits
    and keeps it until the commit's WAL is flushed, so notifying commits cannot share
    a flush and every close of every worker would queue behind the one before. A
    statement that only notifies writes no WAL and holds that lock for microseconds.
    Losing one (a crash between the two) costs a waiter its fallback poll. Wake-ups
    of work (``runnable``, ``task``) stay in the transaction that creates the work.
    """
    return topic.startswith(("closed:", "stream:"))


def notify_channel(topic: str) -> str:
    """The NOTIFY channel ``topic`` is sent on (:data:`HINT_CHANNEL` for a waiter's hint)."""
    return HINT_CHANNEL if is_waiter_hint(topic) else NOTIFY_CHANNEL


_origin: tuple[int, str] | None = None


def notify_origin() -> str:
    """This process's mark on its NOTIFY payloads (renewed in a forked child).

    A payload is ``@<origin> <topic>``. The process's own listener skips payloads
    with its own mark: the in-process bus already delivered them at commit, and a
    second wake-up would only make a loop poll again for nothing.
    """
    global _origin
    pid = os.getpid()
    if _origin is None or _origin[0] != pid:
        _origin = (pid, f"{pid}.{uuid.uuid4().hex[:8]}")
    return _origin[1]


def notify_payload(topic: str) -> str:
    """The NOTIFY payload of ``topic`` sent from this process."""
    return f"@{notify_origin()} {topic}"


def notify_topic(payload: str) -> str | None:
    """The bus topic of a NOTIFY payload; None for this process's own."""
    if not payload.startswith("@"):
        return payload  # sent by hand (psql, tests): the payload is the topic
    origin, _, topic = payload[1:].partition(" ")
    return None if origin == notify_origin() else topic


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
