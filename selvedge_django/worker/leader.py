"""Leader duties: one elected worker records activity timeouts the others cannot.

The leader holds the system lock ``selvedge:leader`` (a row with an owner, an
epoch and an expiry on the database clock), renews it every
``LEADER_HEARTBEAT_INTERVAL`` and loses it ``LEADER_LEASE_DURATION`` after its
last renewal, when another worker takes over. While leading, it requeues lapsed
claims (a lapse counts as a failure), fails tasks whose lapse used up the retry
budget, fails tasks that waited longer than their schedule-to-start timeout,
terminates runs past their execution timeout (``start_workflow(...,
execution_timeout=...)``), deletes the heartbeat rows of workers lost more than
a day ago, starts the runs of due schedules
(:class:`~selvedge_django.worker.scheduler.ScheduleDuty`), and, with
``SELVEDGE["METRICS"]`` on, answers the metrics' gauges for the whole fleet.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

from .. import metrics
from ..storage.gauges import read_gauges
from ..storage.wakeups import Bus
from .base import Loop
from .heartbeat import WORKER_RETENTION
from .scheduler import ScheduleDuty

if TYPE_CHECKING:
    from .runtime import WorkerRuntime

__all__ = ["LEADER_LOCK", "Leader"]

logger = logging.getLogger("selvedge_django.worker")

LEADER_LOCK = "selvedge:leader"


class Leader(Loop):
    """Hold or contest the leader lock; sweep timeouts while holding it."""

    name = "leader"

    def __init__(self, runtime: WorkerRuntime, bus: Bus) -> None:
        settings = runtime.settings
        tick = min(1.0, settings.leader_heartbeat_interval)
        super().__init__(bus, tick, tick)
        self.runtime = runtime
        self.is_leader = False
        self._renewed_at = 0.0
        # While this worker leads, the metrics' gauges are read through its store.
        self._gauges = functools.partial(read_gauges, runtime.store)
        self.schedules = ScheduleDuty(runtime)

    def run_once(self) -> int:
        runtime = self.runtime
        settings = runtime.settings
        if runtime.stopping.is_set():
            return 0
        if not self.schedules.synced:  # the sync at start could not reach the database
            self.schedules.sync()
        now = time.monotonic()
        if not self.is_leader or now - self._renewed_at >= settings.leader_heartbeat_interval:
            held = runtime.store.locks.try_lock(
                LEADER_LOCK, runtime.worker_id, settings.leader_lease_duration
            )
            if held != self.is_leader:
                logger.info(
                    "worker %s %s leadership",
                    runtime.worker_id,
                    "took" if held else "lost",
                    extra={"worker_id": runtime.worker_id},
                )
            self.is_leader = held
            if held:
                self._renewed_at = now
                # Once a heartbeat: forget workers that were lost long ago.
                runtime.store.heartbeats.prune_workers(
                    WORKER_RETENTION, settings.max_workflows_per_batch
                )
            self._observe_gauges(held)
        if not self.is_leader:
            return 0
        runtime.store.task_timeouts.sweep_activity_timeouts(settings.max_workflows_per_batch)
        done = self.sweep_execution_timeouts(settings.max_workflows_per_batch)
        return done + self.schedules.run_once()

    def sweep_execution_timeouts(self, limit: int) -> int:
        """Terminate runs past their execution timeout (one bounded batch a round) and
        fire ``on_workflow_failed`` for each, as a terminate from the client API does."""
        runtime = self.runtime
        closed = runtime.store.execution_timeouts.sweep_execution_timeouts(limit)
        for run in closed:
            logger.warning(
                "workflow %s (%s) terminated: execution timeout",
                run.instance_id,
                run.workflow_name,
                extra={"instance_id": run.instance_id, "worker_id": runtime.worker_id},
            )
            runtime.fire(
                "on_workflow_failed",
                instance_id=run.instance_id,
                workflow_name=run.workflow_name,
                error=run.error,
                duration=0.0,
            )
        return len(closed)

    def _observe_gauges(self, leading: bool) -> None:
        if leading and metrics.enabled():
            metrics.set_gauge_source(self._gauges)
        else:
            metrics.clear_gauge_source(self._gauges)

    def resign(self) -> None:
        self._observe_gauges(False)
        if self.is_leader:
            try:
                self.runtime.store.locks.unlock(LEADER_LOCK, self.runtime.worker_id)
            except Exception:
                logger.warning("could not release the leader lock", exc_info=True)
            self.is_leader = False
