"""Starts run by a worker of the starting process, without a dispatch.

A :class:`~selvedge_django.worker.Worker` running in the process that calls
``start_workflow`` takes the new instance directly: the start's insert already
holds the lease for that worker (epoch 1, not runnable, so no dispatcher
anywhere can take it first), and after commit the execution is handed to the
worker's resumption pool with the snapshot the starter already knows (the
input, an empty history). That skips the lease update, the snapshot reads and
the wake-up of a dispatcher.

If the worker has no free resumption slot by then, or is stopping, the lease is
released with the instance runnable, and any dispatcher takes it as usual. If
the process dies first, the lease expires and another worker takes it: the same
as for any held lease.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .worker.supervisor import Worker

__all__ = ["finished", "local_worker", "register", "running_here", "started_here", "unregister"]

_lock = threading.Lock()
_workers: dict[str, list[Worker]] = {}
# Instances whose handed-over execution has not finished yet.
_running: set[str] = set()


def register(worker: Worker) -> None:
    """Offer a started worker's free resumption slots to starts of this process."""
    with _lock:
        _workers.setdefault(worker.store.identity, []).append(worker)


def unregister(worker: Worker) -> None:
    with _lock:
        workers = _workers.get(worker.store.identity, [])
        if worker in workers:
            workers.remove(worker)
        if not workers:
            _workers.pop(worker.store.identity, None)


def local_worker(identity: str) -> Worker | None:
    """A running worker of this process on the database ``identity`` with a free slot."""
    with _lock:
        workers = list(_workers.get(identity, ()))
    for worker in workers:
        if worker.accepts_local_starts():
            return worker
    return None


def started_here(instance_id: str) -> None:
    """An execution of ``instance_id`` was handed to a worker of this process."""
    with _lock:
        _running.add(instance_id)


def finished(instance_id: str) -> None:
    """That execution ended (after its close, if it closed, committed and was published)."""
    with _lock:
        _running.discard(instance_id)


def running_here(instance_id: str) -> bool:
    """Whether a handed-over execution of ``instance_id`` is still under way here.

    ``wait_workflow`` skips its first read then: the instance is running, and its
    close (if this execution closes it) wakes the waiter through the bus.
    """
    with _lock:
        return instance_id in _running
