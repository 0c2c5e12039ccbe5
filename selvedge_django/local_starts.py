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

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .supervisor import Worker

__all__ = ["local_worker", "register", "unregister"]

logger = logging.getLogger("selvedge_django.worker")

_lock = threading.Lock()
_workers: dict[str, list[Worker]] = {}


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
