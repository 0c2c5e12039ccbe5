"""Pruning: delete closed instances older than a cutoff, in bounded batches."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.utils import timezone

from ..models import WorkflowStatus
from .base import client_store

__all__ = ["MAX_PRUNE_BATCH", "prune"]

# The most instances one prune batch deletes (their ids are one IN list).
MAX_PRUNE_BATCH = 5000


def prune(
    older_than: timedelta,
    *,
    statuses: list[str] | None = None,
    workflow_name: str | None = None,
    batch_size: int = 500,
    progress: Callable[[int], object] | None = None,
) -> int:
    """Delete closed instances older than ``older_than`` with everything they own.

    Works in bounded batches (one transaction each). Never deletes a running
    instance, nor a child whose parent is still running. ``progress`` is called
    with the running total after each batch. Returns how many were deleted.
    """
    closed = {WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED}
    wanted = set(statuses) if statuses else closed
    if not wanted <= closed:
        raise ValueError(f"prune only deletes closed instances, not {sorted(wanted - closed)}")
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise ValueError("older_than must be a non-negative timedelta")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError("batch_size must be an int")
    if not 1 <= batch_size <= MAX_PRUNE_BATCH:
        # One batch is one IN list of ids in the delete.
        raise ValueError(f"batch_size must be from 1 to {MAX_PRUNE_BATCH}")
    store = client_store()
    cutoff = timezone.now() - older_than
    total = 0
    while True:
        deleted = store.instances.prune_closed(wanted, cutoff, workflow_name, batch_size)
        if not deleted:
            break
        total += deleted
        if progress is not None:
            progress(total)
        if deleted < batch_size:
            break
    return total
