"""A fixed pool of threads, each owning its Django connection, with free-slot counting."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from .base import drop_broken_connections

__all__ = ["ThreadPool"]

logger = logging.getLogger("selvedge_django.worker")

_STOP = object()


class ThreadPool:
    """Run submitted callables on ``size`` threads; ``free_slots()`` bounds claiming."""

    def __init__(self, name: str, size: int, on_done: Callable[[], None] | None = None) -> None:
        self.name = name
        self.size = size
        self.on_done = on_done
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        # Inline pools run submitted work at once in the submitting thread
        # (selvedge_django.testing.run_until_idle uses them).
        self.inline = False

    def start(self) -> None:
        for index in range(self.size):
            thread = threading.Thread(
                target=self._work, name=f"selvedge-{self.name}-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def free_slots(self) -> int:
        with self._lock:
            return self.size - self._pending

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.inline:
            fn(*args)
            return
        with self._lock:
            self._pending += 1
        self._queue.put((fn, args))

    def _work(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                fn, args = item
                try:
                    fn(*args)
                except BaseException:
                    logger.exception("%s task failed", self.name)
                finally:
                    drop_broken_connections()
                    with self._lock:
                        self._pending -= 1
                        if self._pending == 0:
                            self._idle.notify_all()
                    if self.on_done is not None:
                        self.on_done()
        finally:
            connections.close_all()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no task is pending or running; return whether that happened."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def shutdown(self, timeout: float | None) -> None:
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            thread.join(timeout)
