"""The start handoff: starts run by a worker of the starting process, without a dispatch.

A :class:`LocalRunner` (a :class:`~selvedge_django.worker.Worker`) running in the process that calls
``start_workflow`` takes the new instance directly: the start's insert already
holds the lease for that worker (epoch 1, not runnable, so no dispatcher
anywhere can take it first), and after commit the execution is handed to the
worker's resumption pool with the snapshot the starter already knows (the
input, an empty history). That skips the lease update, the snapshot reads and
the wake-up of a dispatcher.

If the worker has no free resumption slot by then, or is stopping, or the
starter's transaction stayed open so long that the lease can no longer be trusted,
the lease is released with the instance runnable, and any dispatcher takes it as
usual. If the process dies first, the lease expires and another worker takes it:
the same as for any held lease.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..conf import SelvedgeSettings
    from ..engine.events import Fence
    from ..engine.ports import ExecutionSnapshot

__all__ = [
    "LocalRunner",
    "finished",
    "local_worker",
    "register",
    "running_here",
    "started_here",
    "unregister",
]


class LocalRunner(Protocol):
    """What a start needs of the worker it hands an execution to."""

    @property
    def worker_id(self) -> str:
        """The lease owner the start's insert names."""
        ...

    @property
    def settings(self) -> SelvedgeSettings:
        """Its settings (the lease TTL the insert sets)."""
        ...

    def accepts_local_starts(self) -> bool:
        """Whether it takes a start now (running, not stopping, a free slot)."""
        ...

    def run_local_start(self, fence: Fence, snapshot: ExecutionSnapshot, leased_at: float) -> None:
        """Run the started instance (its start committed, leased to it) or release it."""
        ...


_lock = threading.Lock()
_workers: dict[str, list[LocalRunner]] = {}
# Instances whose handed-over execution has not finished yet.
_running: set[str] = set()


def register(worker: LocalRunner, identity: str) -> None:
    """Offer a started worker's free resumption slots to starts of this process on the
    database ``identity`` (its store's)."""
    with _lock:
        _workers.setdefault(identity, []).append(worker)


def unregister(worker: LocalRunner, identity: str) -> None:
    """Take back :func:`register`."""
    with _lock:
        workers = _workers.get(identity, [])
        if worker in workers:
            workers.remove(worker)
        if not workers:
            _workers.pop(identity, None)


def local_worker(identity: str) -> LocalRunner | None:
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
    """That execution ended (after its close, if it closed, committed and was published).

    Also the stores' ``on_closed`` callback: a close unmarks the instance before its
    wake-up goes out.
    """
    with _lock:
        _running.discard(instance_id)


def running_here(instance_id: str) -> bool:
    """Whether a handed-over execution of ``instance_id`` is still under way here.

    ``wait_workflow`` skips its first read then: the instance is running, and its
    close (if this execution closes it) wakes the waiter through the bus.
    """
    with _lock:
        return instance_id in _running
