"""The supervisor: starts every loop of one worker and owns its shutdown."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..conf import get_settings
from ..engine.events import Fence
from ..engine.ports import ExecutionSnapshot
from ..storage import worker_start_problem
from ..storage.postgresql.listener import acquire_listener, release_listener
from . import handoff
from .activities import ActivityPoller
from .base import Loop
from .cache import WorkflowCache
from .dispatcher import Dispatcher
from .heartbeat import Heartbeat
from .leader import Leader
from .pool import ThreadPool
from .renewer import Renewer
from .runtime import HungAttempt, WorkerRuntime
from .timers import TimerPoller

__all__ = ["Worker"]

logger = logging.getLogger("selvedge_django.worker")


class Worker:
    """Run the dispatcher, activity workers and renewals in threads of this process.

    ``Worker(**overrides)`` takes the ``SELVEDGE`` keys in lower case and
    overrides the settings for this worker only. Use it as a context manager, or
    call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, **overrides: Any) -> None:
        # A configured WORKER_ID names this worker unless overridden; otherwise
        # with_overrides() generates an id of its own for each worker.
        self.settings = get_settings().with_overrides(**overrides)
        self.runtime = WorkerRuntime(self.settings)
        self.store = self.runtime.store
        bus = self.store.bus
        self._stop = threading.Event()  # the loops that find work
        self._stop_renewals = threading.Event()  # the renewer, last of all at shutdown
        self.resumptions = ThreadPool("resume", self.settings.max_concurrent_resumptions)
        self.activities = ThreadPool("activity", self.settings.max_concurrent_activities)
        self.workflow_cache: WorkflowCache | None = None
        if self.settings.workflow_cache.enabled:
            self.workflow_cache = WorkflowCache(self.resumptions, self.settings.workflow_cache)
            self.runtime.cache = self.workflow_cache
        self.dispatcher = Dispatcher(self.runtime, bus, self.resumptions)
        self.activity_poller = ActivityPoller(self.runtime, bus, self.activities)
        self.resumptions.on_done = self.dispatcher.slot_freed
        self.activities.on_done = self.activity_poller.slot_freed
        self.timer_poller = TimerPoller(self.runtime, bus)
        self.leader = Leader(self.runtime, bus)
        self.renewer = Renewer(self.runtime, bus)
        self.heartbeat = Heartbeat(self.runtime, bus)
        self.loops: list[Loop] = [
            self.dispatcher,
            self.activity_poller,
            self.timer_poller,
            self.leader,
            self.renewer,
            self.heartbeat,
        ]
        self._threads: list[threading.Thread] = []
        self._started = False
        self.listener: Any = None

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    @property
    def started(self) -> bool:
        return self._started

    def workflow_cache_stats(self) -> dict[str, int]:
        """The workflow cache's counters (all 0 without a cache): ``hits`` (leases that
        went on with a parked execution, no replay), ``misses``, ``parked``, ``let_go``,
        ``declined``, and the current ``entries``, ``bytes`` and ``threads``."""
        if self.workflow_cache is None:
            return dict.fromkeys(
                ("hits", "misses", "parked", "let_go", "declined", "entries", "bytes", "threads"),
                0,
            )
        return self.workflow_cache.stats()

    def hung_attempts(self) -> list[HungAttempt]:
        """The activity attempts of this worker that still run after they had to stop.

        An attempt past its start-to-close deadline, whose claim was lost or whose
        heartbeat was missed, that has not returned ``HUNG_AFTER`` (1) second later:
        Python cannot stop its thread, so it holds an activity thread (or, inline, an
        execution thread) until its code returns, and its result, if it ever comes,
        is discarded. Each is logged once as a warning when it is first seen.
        """
        return self.runtime.attempts.hung_attempts()

    def work_loops(self) -> list[Loop]:
        """The loops that find work (the renewer only maintains what is held)."""
        return [self.dispatcher, self.activity_poller, self.timer_poller]

    def start(self) -> Worker:
        """Start every loop in its own thread; return self."""
        if self._started:
            raise RuntimeError("worker already started")
        problem = worker_start_problem(self.store.alias)
        if problem is not None:
            raise ImproperlyConfigured(problem)
        self.leader.schedules.sync()  # SELVEDGE["SCHEDULES"]; invalid ones refuse the start
        self._started = True
        if self.workflow_cache is not None:
            self.workflow_cache.open()
        self.resumptions.start()
        self.activities.start()
        if self.store.db.notify_enabled:
            self.listener = acquire_listener(self.store.db.listen_alias, self.store.bus)
        for loop in self.loops:
            # The renewer and the heartbeat keep going until in-flight work is done.
            stop = self._stop_renewals if loop in (self.renewer, self.heartbeat) else self._stop
            thread = threading.Thread(
                target=loop.run, args=(stop,), name=f"selvedge-{loop.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        if self.settings.run_local_starts:
            handoff.register(self, self.store.identity)
        logger.info("worker %s started", self.worker_id, extra={"worker_id": self.worker_id})
        return self

    def accepts_local_starts(self) -> bool:
        """Whether a start in this process may be handed to this worker now."""
        return (
            self._started
            and not self.runtime.stopping.is_set()
            and self.resumptions.free_slots() > 0
        )

    def run_local_start(self, fence: Fence, snapshot: ExecutionSnapshot, leased_at: float) -> None:
        """Run an instance whose start (committed) leased it to this worker.

        ``leased_at`` is the monotonic time before the start's insert, where the
        lease belief begins. Without a free slot, or when the project's transaction
        stayed open so long that the belief ends before the renewer could renew the
        lease, the lease is released and the instance left runnable for any dispatcher.
        """
        lease = self.settings.lease
        trusted = time.monotonic() - leased_at < lease.renew_by
        if trusted and not self.runtime.stopping.is_set() and self.resumptions.free_slots() > 0:
            self.runtime.hold(fence, leased_at)
            handoff.started_here(fence.instance_id)
            self.resumptions.submit(self._run_local, fence, leased_at, snapshot)
            return
        # If even that fails, the lease expires by itself and a dispatcher takes it then.
        self.runtime.release_quietly(fence, runnable=True)

    def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, let in-flight work finish, then release what is still held.

        At once: nothing new is leased or claimed, and every attempt in flight is told
        to stop (``activity_cancelled()`` is true, ``heartbeat()`` raises
        ActivityCancelled); an attempt that stops so is released for another worker
        (its attempt number is used, its retry budget is not), and one that returns a
        result all the same has it recorded. Leases and claims are renewed all along.
        After ``timeout`` (default ``SHUTDOWN_TIMEOUT``) the claims of attempts still
        running are released the same way and the leases of executions still running
        are given up; only then do renewals stop.
        """
        if not self._started:
            return
        timeout = self.settings.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        handoff.unregister(self, self.store.identity)
        self.runtime.stopping.set()
        if self.workflow_cache is not None:
            self.workflow_cache.clear()  # parked executions unwind; their leases are free
        self._stop.set()
        for loop in self.loops:
            loop.waker.wake()
        self.runtime.attempts.cancel_attempts("shutdown")
        idle = self.activities.wait_idle(max(0.0, deadline - time.monotonic()))
        idle = self.resumptions.wait_idle(max(0.0, deadline - time.monotonic())) and idle
        if not idle:
            released = self.runtime.attempts.release_attempts()
            if released:
                logger.warning(
                    "worker %s released %d claims of attempts still running at shutdown",
                    self.worker_id,
                    released,
                    extra={"worker_id": self.worker_id},
                )
        for fence in self.runtime.held_fences():
            self.runtime.release_quietly(fence, runnable=True)
            self.runtime.drop(fence)
        self._stop_renewals.set()
        self.renewer.waker.wake()
        self.heartbeat.waker.wake()
        self.leader.resign()
        for thread in self._threads:
            thread.join(5.0)
        self.heartbeat.forget()
        self.resumptions.shutdown(1.0)
        self.activities.shutdown(1.0)
        if self.listener is not None:
            release_listener(self.listener)  # the last reference stops its thread
            self.listener = None
        self._started = False
        logger.info("worker %s stopped", self.worker_id, extra={"worker_id": self.worker_id})

    def _run_local(self, fence: Fence, leased_at: float, snapshot: ExecutionSnapshot) -> None:
        try:
            self.runtime.execute(fence, leased_at, snapshot)
        finally:
            handoff.finished(fence.instance_id)

    def wait(self, stop: threading.Event) -> None:
        """Block until ``stop`` is set (used by ``runselvedge worker``)."""
        stop.wait()

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
