"""The heartbeat loop: a worker's row in the heartbeat table, renewed on the database clock.

The row is written as the loop starts and every ``LEADER_HEARTBEAT_INTERVAL``
after, and expires ``LEADER_LEASE_DURATION`` after its last renewal (the timing
of the leader lock). The supervisor deletes it when the worker stops
gracefully; a killed worker's row expires by itself, and the leader deletes
rows that expired more than :data:`WORKER_RETENTION` seconds ago. The status
report (``runselvedge status``, the health view) reads these rows; no durable
step does.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING

from ..storage.heartbeats import WorkerInfo
from ..storage.wakeups import Bus
from .base import Loop

if TYPE_CHECKING:
    from .runtime import WorkerRuntime

__all__ = ["WORKER_RETENTION", "Heartbeat"]

logger = logging.getLogger("selvedge_django.worker")

# Seconds an expired worker row is kept (so the status report can show who was lost).
WORKER_RETENTION = 86_400.0


class Heartbeat(Loop):
    """Renew this worker's heartbeat row every ``LEADER_HEARTBEAT_INTERVAL``."""

    name = "heartbeat"

    def __init__(self, runtime: WorkerRuntime, bus: Bus) -> None:
        interval = runtime.settings.leader_heartbeat_interval
        super().__init__(bus, interval, interval)
        self.runtime = runtime
        settings = runtime.settings
        self.info = WorkerInfo(
            hostname=socket.gethostname(),
            pid=os.getpid(),
            service_name=settings.service_name,
            code_version=settings.code_version,
            queues=settings.activity_queues,
        )

    def run_once(self) -> int:
        runtime = self.runtime
        self.info.undecodable = runtime.undecodable.report()
        runtime.store.heartbeats.beat_worker(
            runtime.worker_id, self.info, runtime.settings.leader_lease_duration
        )
        return 0  # a fixed cadence: never "more work waiting"

    def next_delay(self, idle_delay: float) -> float:
        return self.interval

    def forget(self) -> None:
        """Delete this worker's row (a graceful stop); a failure leaves it to expire."""
        try:
            self.runtime.store.heartbeats.forget_worker(self.runtime.worker_id)
        except Exception:
            logger.warning("could not delete the worker's heartbeat row", exc_info=True)
