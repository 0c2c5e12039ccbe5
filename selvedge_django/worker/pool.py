"""A fixed pool of threads, each owning its Django connection, with free-slot counting.

Work goes to the thread that became idle most recently (a stack of idle threads,
not a shared queue): under light load the same one or two threads do all the
work, so their connections and caches stay warm and the other threads never open
a connection at all.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from django.db import connections

from .base import drop_broken_connections

__all__ = ["ThreadPool"]

logger = logging.getLogger("selvedge_django.worker")

_STOP = object()


class _Slot:
    """One thread's mailbox: the task handed to it while it was idle."""

    __slots__ = ("ready", "task")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.task: Any = None


class ThreadPool:
    """Run submitted callables on ``size`` threads; ``free_slots()`` bounds claiming."""

    def __init__(self, name: str, size: int, on_done: Callable[[], None] | None = None) -> None:
        self.name = name
        self.size = size
        self.on_done = on_done
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._idle_slots: list[_Slot] = []  # most recently idle last
        self._backlog: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._stopping = False
        self._threads: list[threading.Thread] = []
        # Inline pools run submitted work at once in the submitting thread
        # (selvedge_django.testing.run_until_idle uses them).
        self.inline = False

    def start(self) -> None:
        self._stopping = False
        for index in range(self.size):
            slot = _Slot()
            thread = threading.Thread(
                target=self._work, args=(slot,), name=f"selvedge-{self.name}-{index}", daemon=True
            )
            with self._lock:
                self._idle_slots.insert(0, slot)
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
            if self._idle_slots:
                slot = self._idle_slots.pop()
                slot.task = (fn, args)
                slot.ready.set()
            else:
                self._backlog.append((fn, args))

    def _work(self, slot: _Slot) -> None:
        try:
            while True:
                slot.ready.wait()
                slot.ready.clear()
                task, slot.task = slot.task, None
                while task is not None:
                    if task is _STOP:
                        return
                    self._run(*task)
                    with self._lock:
                        if self._backlog:
                            task = self._backlog.popleft()
                        elif self._stopping:
                            return
                        else:
                            task = None
                            self._idle_slots.append(slot)
        finally:
            connections.close_all()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
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

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no task is pending or running; return whether that happened."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def shutdown(self, timeout: float | None) -> None:
        """Stop every thread once the backlog is done; wait up to ``timeout`` for each."""
        with self._lock:
            self._stopping = True
            idle, self._idle_slots = self._idle_slots, []
        for slot in idle:
            slot.task = _STOP
            slot.ready.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
