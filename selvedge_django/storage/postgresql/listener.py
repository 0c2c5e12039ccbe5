"""PostgreSQL LISTEN: wake-ups from other processes into the local bus.

One listener per process, database, bus and channel holds its own connection
(outside Django's pool, in autocommit mode), listens on its channel and
republishes each payload's topic (such as ``runnable`` or ``closed:<id>``) on the
in-process bus, skipping those this process sent itself (its bus already had
them). A lost connection is retried with backoff; meanwhile the pollers keep
working, and nothing is lost because notifications are only hints.

Two channels (:func:`~..wakeups.notify_channel`): workers listen on
``selvedge_wake``, the wake-ups of work, and the client API's waits
(``wait_workflow``, ``read_stream``) on ``selvedge_hint``, the closes and stream
entries they wait for. So a worker is not woken by every close of every other
worker, and a process that only waits is not woken by every new piece of work.
Listeners are reference-counted: a worker takes a reference with
:func:`acquire_listener` when it starts and gives it back with
:func:`release_listener` when it stops (the thread stops with the last
reference); the client API's waits take one process-long reference with
:func:`ensure_listener`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import connections

from ..wakeups import (
    HINT_CHANNEL,
    NOTIFY_CHANNEL,
    TOPIC_QUEUES,
    TOPIC_RUNNABLE,
    TOPIC_TASK,
    TOPIC_TIMER,
    Bus,
    notify_topic,
)

__all__ = [
    "Listener",
    "acquire_listener",
    "ensure_listener",
    "release_listener",
    "stop_listeners",
    "wait_until_connected",
]

logger = logging.getLogger("selvedge_django.notify")


class Listener:
    """A daemon thread relaying the NOTIFY payloads of one channel to a bus."""

    def __init__(
        self,
        alias: str,
        bus: Bus,
        reconnect_delay: float = 1.0,
        channel: str = NOTIFY_CHANNEL,
    ) -> None:
        self.alias = alias
        self.bus = bus
        self.channel = channel
        self.reconnect_delay = reconnect_delay
        self.connected = threading.Event()
        self.reconnects = 0
        self.backend_pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None

    def start(self) -> Listener:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"selvedge-listen-{self.alias}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def _connect(self) -> Any:
        import psycopg

        params = connections[self.alias].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("server_side_binding", None)
        params.pop("prepare_threshold", None)
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"LISTEN {self.channel}")
        return conn

    def _run(self) -> None:
        delay = self.reconnect_delay
        first = True
        while not self._stop.is_set():
            try:
                self._conn = self._connect()
            except Exception as error:
                logger.warning("LISTEN connection failed (%s); retrying in %.1fs", error, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 60.0)
                continue
            if not first:
                self.reconnects += 1
            first = False
            delay = self.reconnect_delay
            self.backend_pid = self._conn.info.backend_pid
            self.connected.set()
            # Whatever was missed while disconnected is found by the pollers; waking
            # everything once makes them look now. (Waiters poll on their own.)
            if self.channel == NOTIFY_CHANNEL:
                for topic in (TOPIC_RUNNABLE, TOPIC_TASK, TOPIC_TIMER, TOPIC_QUEUES):
                    self.bus.publish(topic)
            try:
                while not self._stop.is_set():
                    for note in self._conn.notifies(timeout=1.0):
                        wake = notify_topic(note.payload)
                        if wake is not None:
                            self.bus.publish(wake)
            except Exception as error:
                if not self._stop.is_set():
                    logger.warning("LISTEN connection lost (%s); reconnecting", error)
            finally:
                self.connected.clear()
                try:
                    self._conn.close()
                except Exception:
                    pass
                self._conn = None
            if not self._stop.is_set():
                self._stop.wait(min(delay, 0.5))
        self.connected.clear()


# key -> (listener, references); a key is (alias, database name, bus).
_listeners: dict[str, tuple[Listener, int]] = {}
# The keys that hold the client API's process-long reference.
_process_long: set[str] = set()
_lock = threading.Lock()


def _key(alias: str, bus: Bus, channel: str) -> str:
    return f"{alias}:{connections[alias].settings_dict.get('NAME')}:{id(bus)}:{channel}"


def _take(key: str, alias: str, bus: Bus, channel: str) -> Listener:
    """One more reference to the listener of ``key`` (under ``_lock``), started."""
    listener, references = _listeners.get(key) or (Listener(alias, bus, channel=channel), 0)
    _listeners[key] = (listener, references + 1)
    listener.start()
    return listener


def acquire_listener(alias: str, bus: Bus) -> Listener:
    """Take a reference to the listener on ``alias`` for ``bus``, starting it if needed.

    ``alias`` is ``SELVEDGE["LISTEN_DATABASE"]`` when set: a direct connection for the
    listener when the engine's own alias goes through a transaction-pooling proxy.
    Give the reference back with :func:`release_listener`. It listens to the wake-ups
    of work (``selvedge_wake``).
    """
    key = _key(alias, bus, NOTIFY_CHANNEL)
    with _lock:
        return _take(key, alias, bus, NOTIFY_CHANNEL)


def release_listener(listener: Listener) -> None:
    """Give back a reference from :func:`acquire_listener`; the last one stops the thread."""
    key = _key(listener.alias, listener.bus, listener.channel)
    with _lock:
        held = _listeners.get(key)
        if held is None or held[0] is not listener:
            return  # stopped by stop_listeners() meanwhile
        if held[1] > 1:
            _listeners[key] = (listener, held[1] - 1)
            return
        del _listeners[key]
    listener.stop()


def ensure_listener(alias: str, bus: Bus) -> Listener:
    """The listener on ``alias`` for ``bus``, holding one reference for the rest of the process.

    For the client API's waits: the first call takes the reference, later ones only
    make sure the thread runs. It listens to the hints to waiters (``selvedge_hint``).
    """
    key = _key(alias, bus, HINT_CHANNEL)
    with _lock:
        held = _listeners.get(key)
        if held is not None and key in _process_long:
            held[0].start()
            return held[0]
        _process_long.add(key)
        return _take(key, alias, bus, HINT_CHANNEL)


def stop_listeners() -> None:
    """Stop every listener of this process, whoever holds it (tests, command exit)."""
    with _lock:
        listeners = [listener for listener, _ in _listeners.values()]
        _listeners.clear()
        _process_long.clear()
    for listener in listeners:
        listener.stop()


def wait_until_connected(listener: Listener, timeout: float) -> bool:
    """Whether ``listener`` is connected within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if listener.connected.wait(0.05):
            return True
    return False
