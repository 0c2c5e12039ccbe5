"""The workflow cache: suspended executions a worker keeps and continues without replay.

Without the cache, a wait that cannot complete unwinds the workflow code and
releases the lease; the next dispatch loads the whole history and replays the
code from its start, so a workflow that handles n signals one by one costs
O(n^2). With ``SELVEDGE["WORKFLOW_CACHE"]["MAX_ENTRIES"]`` above 0, such a wait
*parks* instead (:meth:`~selvedge_django.engine.execution.Execution.wait_here`):
the lease is released as it would be (one fenced statement, which also names
this worker as the instance's sticky owner for ``STICKY_WINDOW`` seconds), and
the execution's thread waits here with everything it knows. When this worker's
dispatcher leases the instance again, :meth:`WorkflowCache.resume` hands the
new lease to the parked thread, and the wait looks again for what arrived,
exactly where a replay would look, under the new fence.

Replay stays the source of truth. A parked execution is continued only when the
new lease proves that nothing but arrivals happened since it parked: the lease
epoch is the one right after the released one (every lease, and every terminate,
resume, fork and continue-as-new, takes a new epoch; history is written only under
a lease), the owner is this worker, the generation is the one the execution read,
the instance is running without a cancel request, and the workflow name still
names the same function. Anything else lets the execution go (it unwinds as a
suspension does, writing nothing) and the new lease replays, as without a cache.

Bounds: at most ``MAX_ENTRIES`` executions (100 by default), estimated at most
``MAX_BYTES`` together (64 MiB; least recently parked let go first, once parked
longer than ``STICKY_WINDOW``; a newcomer is declined rather than a younger
entry let go). Each parked
execution keeps its thread, so the resumption threads of a worker number at most
``MAX_CONCURRENT_RESUMPTIONS + MAX_ENTRIES``; a parked thread closes its
database connections after :data:`CONNECTION_IDLE` seconds, so idle entries hold
none. A sleep parks only when its timer fires within ``STICKY_WINDOW``
(:meth:`WorkflowCache.admit`): sleeping instances hold no thread. Hits, misses
and let-go entries are counted (:meth:`WorkflowCache.stats`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connections

from .. import metrics
from ..registry import get_workflow

if TYPE_CHECKING:
    from ..conf import WorkflowCacheSettings
    from ..engine.events import Fence
    from ..engine.execution import Execution
    from ..storage import InstanceHead
    from .pool import ThreadPool

__all__ = ["CONNECTION_IDLE", "WorkflowCache", "estimate_size"]

logger = logging.getLogger("selvedge_django.worker")

# The metric each of the cache's events adds to (SELVEDGE["METRICS"]).
_METRICS = {
    "hits": metrics.WORKFLOW_CACHE_HITS,
    "misses": metrics.WORKFLOW_CACHE_MISSES,
    "parked": metrics.WORKFLOW_CACHE_PARKED,
    "let_go": metrics.WORKFLOW_CACHE_LET_GO,
    "declined": metrics.WORKFLOW_CACHE_DECLINED,
}

# Seconds a parked execution keeps its thread's database connections open: a signal
# soon after reuses them, a long wait holds none.
CONNECTION_IDLE = 1.0
# How long a park waits for a let-go thread to end when the thread bound is reached.
_THREAD_WAIT = 0.5
# The estimate of one cached execution: a base for its thread and frames, a cost per
# history row and per signal position, plus the characters of the values it holds.
# The base is what bench/bench_parked.py measures a parked execution's thread to keep
# resident (about 200 KiB: the stack pages the database driver touched, the thread's
# Django connection wrapper, its frames), so MAX_BYTES bounds real memory.
_BASE_BYTES = 192 * 1024
_ROW_BYTES = 400
_SIGNAL_BYTES = 200


def estimate_size(execution: Execution) -> int:
    """An estimate of the memory a parked execution keeps alive, in bytes."""
    values = execution._size if execution.limits is not None else 0
    return (
        _BASE_BYTES
        + _ROW_BYTES * len(execution.history)
        + _SIGNAL_BYTES * len(execution.signals)
        + values
    )


@dataclass(eq=False)
class _Entry:
    execution: Execution
    fence: Fence  # the lease the execution released when it parked
    fn: Callable[..., Any]  # the function it runs: a redefinition is a code change
    size: int
    parked_at: float = field(default_factory=time.monotonic)
    wake: threading.Event = field(default_factory=threading.Event)
    resumed: Fence | None = None  # the new lease it goes on under; None: let go


class WorkflowCache:
    """The parked executions of one worker, by instance id (least recently parked first)."""

    def __init__(self, pool: ThreadPool, settings: WorkflowCacheSettings) -> None:
        self.pool = pool
        self.settings = settings
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._closed = False
        self._counts: Counter[str] = Counter()

    # -- the parked thread's side -----------------------------------------------------

    def admit(
        self, execution: Execution, fn: Callable[..., Any], sleep: float | None = None
    ) -> _Entry | None:
        """Take ``execution`` in (its lease still held), or None when it cannot be kept.

        A sleep (``sleep``: the seconds until its timer fires) is kept only when it
        ends within ``STICKY_WINDOW``: a kept execution holds a thread, and after the
        window any worker may take the instance, so a long sleep unwinds and costs no
        thread.

        Makes room first, letting the least recently parked entries go, but only those
        parked longer than ``STICKY_WINDOW`` ago: a younger entry is likely to be leased
        here again soon, and letting it go for a newcomer when more executions wait at
        once than the cache holds would cost a thread and a replay for each and save
        none. Declines when no room is left that way, when the cache is closed, the
        caller is not a thread of the pool (an inline run) or the execution alone is
        over ``MAX_BYTES``. The caller detaches its thread next (:meth:`detach`), which
        may still decline at the thread bound.
        """
        settings = self.settings
        if not settings.enabled or not self.pool.in_pool_thread() or self.pool.inline:
            return None
        if sleep is not None and sleep > settings.sticky_window:
            return None
        size = estimate_size(execution)
        fence = execution.fence
        assert fence is not None
        if size > settings.max_bytes:
            with self._lock:
                self._note("declined")
            return None
        with self._lock:
            if self._closed:
                return None
            stale = self._entries.pop(fence.instance_id, None)
            if stale is not None:
                self._bytes -= stale.size
                self._let_go(stale, "replaced")
            young = time.monotonic() - settings.sticky_window
            while self._entries and (
                len(self._entries) >= settings.max_entries
                or self._bytes + size > settings.max_bytes
            ):
                oldest = next(iter(self._entries.values()))
                if oldest.parked_at > young:
                    break
                del self._entries[oldest.fence.instance_id]
                self._bytes -= oldest.size
                self._let_go(oldest, "evicted")
        entry = _Entry(execution, fence, fn, size)
        with self._lock:
            if (
                self._closed
                or len(self._entries) >= settings.max_entries
                or self._bytes + size > settings.max_bytes
            ):
                self._note("declined")
                return None
            self._entries[fence.instance_id] = entry
            self._bytes += size
            self._note("parked")
        return entry

    def detach(self, entry: _Entry) -> bool:
        """Leave the pool for the wait, within the thread bound; False: not kept."""
        if self.pool.detach(self.settings.max_entries, _THREAD_WAIT):
            return True
        with self._lock:
            self._note("declined")
        self.discard(entry)
        return False

    def discard(self, entry: _Entry) -> None:
        """Take back :meth:`admit` before the lease was released (the release failed)."""
        with self._lock:
            if self._entries.get(entry.fence.instance_id) is entry:
                del self._entries[entry.fence.instance_id]
                self._bytes -= entry.size

    def wait(self, entry: _Entry) -> Fence | None:
        """Block the parked thread until its entry is resumed (the new fence) or let go.

        The caller detached its thread from the pool and released the lease first.
        """
        if not entry.wake.wait(CONNECTION_IDLE):
            # No transaction is open at a wait: the connection is idle and reopens lazily.
            connections.close_all()
            entry.wake.wait()
        if entry.resumed is not None:
            self.pool.attached()
        return entry.resumed

    # -- the dispatcher's side ----------------------------------------------------------

    def resume(self, fence: Fence, head: InstanceHead) -> bool:
        """Hand a new lease to the parked execution of its instance, if it may go on.

        Returns False when no execution of the instance is parked here, or it is let
        go because the lease shows more than arrivals since it parked: the caller then
        runs a replay under ``fence``. True: the parked thread holds a resumption slot
        and goes on under ``fence``.
        """
        with self._lock:
            entry = self._entries.pop(fence.instance_id, None)
            if entry is None:
                self._note("misses", "absent")
                return False
            self._bytes -= entry.size
            reason = self._mismatch(entry, fence, head)
            if reason is not None:
                self._note("misses", reason)
                self._let_go(entry, reason)
                return False
            self._note("hits")
            if head.parked_value is not None:
                # Read with the lease: the wait finds it without a read of its own.
                entry.execution.arrived(head.parked_key, *head.parked_value)
            self.pool.attach()
            entry.resumed = fence
            entry.wake.set()
            return True

    @staticmethod
    def _mismatch(entry: _Entry, fence: Fence, head: InstanceHead) -> str | None:
        """Why the new lease may not go on with the parked execution (None: it may)."""
        execution = entry.execution
        if fence.owner != entry.fence.owner or fence.epoch != entry.fence.epoch + 1:
            return "lease"  # another lease, or an operator's action, came between
        if head.status != "running" or head.cancel_requested:
            return "status"
        if head.history_generation != execution.snapshot.history_generation:
            return "generation"
        definition = get_workflow(head.workflow_name)
        if (
            head.workflow_name != execution.workflow_name
            or definition is None
            or definition.fn is not entry.fn
        ):
            return "code"
        return None

    # -- both ------------------------------------------------------------------------

    def _let_go(self, entry: _Entry, reason: str) -> None:
        """Wake a parked thread with nothing to go on with (the lock held)."""
        self._note("let_go", reason)
        self._counts[f"let_go_{reason}"] += 1
        entry.resumed = None
        entry.wake.set()

    def _note(self, name: str, reason: str | None = None) -> None:
        """Count one event in the stats and in its metric (the lock held)."""
        self._counts[name] += 1
        metrics.record(_METRICS[name], 1, reason=reason)

    def open(self) -> None:
        """Take executions in (again): the worker starts."""
        with self._lock:
            self._closed = False

    def clear(self) -> None:
        """Let every parked execution go and take no more (the worker stops)."""
        with self._lock:
            self._closed = True
            entries, self._entries = list(self._entries.values()), OrderedDict()
            self._bytes = 0
            for entry in entries:
                self._let_go(entry, "stopped")

    def stats(self) -> dict[str, int]:
        """Counters: ``hits`` (continued without replay), ``misses`` (leases replayed
        while the cache was on), ``parked``, ``let_go`` (and ``let_go_<reason>``),
        ``declined``, and now: ``entries``, ``bytes``, ``threads`` (parked or continued
        executions' threads alive)."""
        with self._lock:
            counts = dict(self._counts)
            counts.update(entries=len(self._entries), bytes=self._bytes, threads=self.pool.detached)
        for name in ("hits", "misses", "parked", "let_go", "declined"):
            counts.setdefault(name, 0)
        return counts
