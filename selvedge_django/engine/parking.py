"""Parking: a live wait that cannot complete stays where it is, for the worker's cache.

Without a cache, such a wait raises :class:`~.execution.Suspend`: the code unwinds,
the lease is released, and the next lease replays the code from its start. A
runtime that keeps executions (its ``park(execution, why)``, see
:mod:`selvedge_django.worker.cache`) releases the lease itself and blocks this
thread until the instance is leased to it again; :func:`wait_here` then returns
with the new fence, and the wait looks again for what arrived, exactly where a
replay would look. Each live wait calls it in a loop (``while not ready:
wait_here(...)``).
"""

from __future__ import annotations

from .execution import Execution

__all__ = ["wait_here"]


def wait_here(execution: Execution, why: str) -> None:
    """Park at a live wait that cannot complete; raise Suspend when not kept (or let go)."""
    park = getattr(execution.runtime, "park", None)
    if (
        park is None
        or execution.readonly
        or execution.fatal is not None
        or execution.suspension is not None
        or execution.continuation is not None
        or execution.in_predicate
        or execution.in_activity
        # Recorded commands past this position: the suspension judges them (leftovers).
        or execution.seq < execution.max_recorded_seq
    ):
        raise execution.suspend(why)
    # None: not kept (the lease still held), or let go after the release.
    fence = park(execution, why)
    if fence is None:
        raise execution.suspend(why)
    execution.fence = fence
    execution.released = False
