"""A fixed pool of threads, each owning its Django connection, with free-slot counting.

Work goes to the thread that became idle most recently (a stack of idle threads,
not a shared queue): under light load the same one or two threads do all the
work, so their connections and caches stay warm and the other threads never open
a connection at all.

A task that left the pool to wait (a kept execution, :meth:`ThreadPool.detach`)
comes back to it when it ends: its thread, its connection warm and its
statements prepared, joins the idle stack instead of exiting. Threads beyond the
pool's size exit once idle :data:`SURPLUS_IDLE` seconds, so a burst of kept
executions leaves no idle connections behind.
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
# Handed to an idle thread that leaves a pool over its size (see ThreadPool._retire).
_RETIRE = object()

# Seconds a thread beyond the pool's size stays idle before it exits (closing its
# connections): as long as a kept execution's idle connection stays open
# (cache.CONNECTION_IDLE), so that one waiting at a time never opens a new one.
SURPLUS_IDLE = 1.0


class _Slot:
    """One thread's mailbox: the task handed to it while it was idle."""

    __slots__ = ("ready", "task")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.task: Any = None


_thread = threading.local()


class ThreadPool:
    """Run submitted callables on ``size`` threads; ``free_slots()`` bounds claiming.

    A task may leave the pool while it waits (:meth:`detach`: a suspended execution
    kept in the worker's workflow cache): its slot is freed and, when fewer than
    ``size`` threads of the pool's own are left, a new thread takes its place. While
    a detached task runs again it holds a slot (:meth:`attach`, counted by
    ``free_slots()``); when it ends its thread rejoins the pool (no new thread, no
    new connection for the next task that waits), and a thread beyond ``size`` exits
    once idle :data:`SURPLUS_IDLE` seconds. A new thread is started only when the
    pool's own threads number ``size``, so the threads of a pool number at most
    ``size`` plus the detached ones, which their caller bounds (the cache's entries).
    """

    def __init__(self, name: str, size: int, on_done: Callable[[], None] | None = None) -> None:
        self.name = name
        self.size = size
        self.on_done = on_done
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._detached_ended = threading.Condition(self._lock)
        self._ended: list[threading.Thread] = []  # detached threads done, to join
        self._idle_slots: list[_Slot] = []  # most recently idle last
        self._backlog: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._spawned = 0
        self._own = 0  # threads alive and not detached (idle, or running a task)
        self.detached = 0
        # Inline pools run submitted work at once in the submitting thread
        # (selvedge_django.testing.run_until_idle uses them), logging a SystemExit as a
        # pool thread does.
        self.inline = False

    def start(self) -> None:
        self._stopping = False
        with self._lock:
            self._spawned = 0
            self._own = 0
            self.detached = 0  # threads whose task left the pool and has not ended
            for _ in range(self.size):
                self._spawn(first=True)

    def _spawn(self, *, first: bool = False) -> None:
        """Start one thread of the pool (the lock held)."""
        slot = _Slot()
        self._spawned += 1
        self._own += 1
        thread = threading.Thread(
            target=self._work,
            args=(slot,),
            name=f"selvedge-{self.name}-{self._spawned - 1}",
            daemon=True,
        )
        if first:
            self._idle_slots.insert(0, slot)
        else:
            self._threads = [t for t in self._threads if t.is_alive()]
            # A replacement: the backlog first, as a thread that finished a task does.
            if self._backlog:
                slot.task = self._backlog.popleft()
                slot.ready.set()
            else:
                self._idle_slots.insert(0, slot)
        thread.start()
        self._threads.append(thread)

    def in_pool_thread(self) -> bool:
        """Whether the calling thread runs a task of this pool (not inline)."""
        return getattr(_thread, "pool", None) is self

    def detach(self, limit: int, timeout: float = 0.0) -> bool:
        """Free the calling task's slot while it waits outside the pool.

        The first time a task detaches, only while fewer than ``limit`` detached
        threads are alive (waiting up to ``timeout`` for one to end), its thread
        leaves the pool's own, and a new one takes its place if fewer than ``size``
        remain. Returns False (nothing done) when that bound is
        reached, the pool is stopping or inline, or the caller is not one of its tasks.
        """
        if self.inline or not self.in_pool_thread():
            return False
        with self._lock:
            if self._stopping:
                return False
            if not getattr(_thread, "detached", False):
                if not self._detached_ended.wait_for(lambda: self.detached < limit, timeout):
                    return False
                self._join_ended()
                if self._stopping:
                    return False
                _thread.detached = True
                self.detached += 1
                self._own -= 1
                if self._own < self.size:
                    self._spawn()
            self._pending -= 1
            _thread.holding = False
            if self._pending == 0:
                self._idle.notify_all()
        if self.on_done is not None:
            self.on_done()
        return True

    def attach(self) -> None:
        """A detached task runs again (on its own thread): it holds a slot until it
        waits again or ends."""
        with self._lock:
            self._pending += 1

    def attached(self) -> None:
        """Called on the detached task's thread once :meth:`attach` gave it a slot."""
        _thread.holding = True

    def free_slots(self) -> int:
        with self._lock:
            return self.size - self._pending

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.inline:
            try:
                fn(*args)
            except SystemExit:
                # What a pool thread does with it (_run): an activity's SystemExit, its
                # failure already recorded, is logged and the loop goes on. Other errors
                # still reach the caller of the inline loop (a test), and so does a
                # KeyboardInterrupt (the developer's Ctrl-C in that thread).
                logger.exception("%s task failed", self.name)
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
        _thread.pool = self
        retired = False
        try:
            while True:
                # Only a thread of a pool over its size waits with a deadline (read
                # unlocked: a thread that rejoins, making it so, waits with one itself).
                surplus = self._own > self.size
                if not slot.ready.wait(SURPLUS_IDLE if surplus else None) and self._retire(slot):
                    retired = True
                    return
                if not slot.ready.is_set():
                    continue
                slot.ready.clear()
                task, slot.task = slot.task, None
                while task is not None:
                    if task is _STOP:
                        return
                    if task is _RETIRE:
                        retired = True  # no longer counted (_retire)
                        return
                    self._run(*task)
                    with self._lock:
                        if getattr(_thread, "detached", False):
                            self._rejoin()
                        if self._backlog:
                            task = self._backlog.popleft()
                        elif self._stopping:
                            return
                        else:
                            task = None
                            self._idle_slots.append(slot)
        finally:
            connections.close_all()
            with self._lock:
                if getattr(_thread, "detached", False):
                    # Counted as ended only now, its connections closed: a thread that
                    # detaches next joins this one first (_join_ended), so the threads
                    # alive never exceed the pool's size plus the detach limit.
                    self.detached -= 1
                    self._ended.append(threading.current_thread())
                    self._detached_ended.notify_all()
                elif not retired:
                    self._own -= 1

    def _rejoin(self) -> None:
        """The calling thread's detached task ended: the thread is the pool's own again
        (the lock held). A thread that detaches next needs no new thread then."""
        _thread.detached = False
        self.detached -= 1
        self._own += 1
        self._detached_ended.notify_all()

    def _retire(self, slot: _Slot) -> bool:
        """One idle thread leaves a pool over its size, which the idle thread of ``slot``
        found after waiting ``SURPLUS_IDLE``: the least recently idle one (its connection
        the coldest, if it has one). Returns whether that is the caller itself; another
        is handed :data:`_RETIRE`. Either is off the idle stack and no longer counted."""
        with self._lock:
            if self._own <= self.size or slot.ready.is_set() or slot not in self._idle_slots:
                return False
            oldest = self._idle_slots.pop(0)
            self._own -= 1
            if oldest is slot:
                return True
            oldest.task = _RETIRE
            oldest.ready.set()
            return False

    def _join_ended(self) -> None:
        """Join the detached threads that have ended (the lock held; they take it no more)."""
        ended, self._ended = self._ended, []
        for thread in ended:
            thread.join()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except BaseException:
            logger.exception("%s task failed", self.name)
        finally:
            drop_broken_connections()
            detached = getattr(_thread, "detached", False)
            holding = not detached or getattr(_thread, "holding", False)
            with self._lock:
                if holding:
                    self._pending -= 1
                if self._pending == 0:
                    self._idle.notify_all()
            if holding and self.on_done is not None:
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
