"""Renews held leases and live activity claims before they expire.

A lease renewal moves the holder's belief forward from the moment the renewal
started; a renewal that matched no row drops the belief, so the execution's next
commit raises LeaseLost. A claim with a heartbeat timeout is extended only after
the activity reported new progress; a claim whose renewal matched no row cancels
its attempt (``heartbeat()`` then raises ActivityCancelled).

A renewal statement that fails (a database error) proves nothing about the lease
or the claim: it is tried again at the next tick, and the lease belief stays as
it was. An attempt is cancelled for such errors only once its claim's expiry has
passed by the local monotonic estimate (the start of the last successful claim or
renewal statement plus the claim TTL).

The renewer runs until the supervisor stops it, after everything in flight has
finished or been released at shutdown.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..notify import Bus
from .base import Loop

if TYPE_CHECKING:
    from ..engine.store import Fence, TaskClaim
    from ..runtime import WorkerRuntime

__all__ = ["Renewer"]

logger = logging.getLogger("selvedge_django.worker")


class Renewer(Loop):
    """Renew what this worker holds; returns 0 so it keeps its own cadence."""

    name = "renewer"

    def __init__(self, runtime: WorkerRuntime, bus: Bus) -> None:
        lease = runtime.settings.lease
        tick = min(0.25, lease.renew_interval / 4)
        super().__init__(bus, tick, tick)
        self.runtime = runtime
        self._renewed: dict[Fence, float] = {}
        self._claims: dict[TaskClaim, tuple[float, int]] = {}
        self._progress: dict[TaskClaim, tuple[float, int]] = {}

    def run_once(self) -> int:
        runtime = self.runtime
        now = time.monotonic()
        interval = runtime.settings.lease.renew_interval
        fences = runtime.held_fences()
        for fence in fences:
            last = self._renewed.setdefault(fence, now)
            if now - last >= interval and runtime.renew(fence) is not None:
                self._renewed[fence] = now  # after an error: again at the next tick
        for fence in list(self._renewed):
            if fence not in fences:
                del self._renewed[fence]
        live = set()
        for task, state in runtime.active_attempts():
            claim = task.claim
            live.add(claim)
            # Both clocks start with the attempt, not when this loop first sees it.
            last, progress = self._claims.setdefault(claim, (state.started, 0))
            seen_at, seen = self._progress.setdefault(claim, (state.started, 0))
            if state.progress != seen:
                self._progress[claim] = (now, state.progress)
            elif task.heartbeat_timeout is not None and now - seen_at > task.heartbeat_timeout:
                state.cancel("heartbeat timeout")
            every = min(interval, task.claim_ttl / 3)
            if now - last < every:
                continue
            if task.heartbeat_timeout is not None and state.progress == progress:
                continue  # no new heartbeat: let the claim lapse
            progress = state.progress
            try:
                ok = runtime.store.renew_task(claim, task.claim_ttl)
            except Exception:
                logger.warning(
                    "claim renewal of %s/%s failed", claim.instance_id, claim.key, exc_info=True
                )
                runtime.drop_broken_connection()
                if time.monotonic() >= runtime.claim_belief(claim):
                    state.cancel("claim lost")  # expired by now, as far as we can tell
                continue  # again at the next tick
            if ok:
                self._claims[claim] = (now, progress)
                runtime.claim_renewed(claim, now, task.claim_ttl)
            else:
                state.cancel("claim lost")
        for claim in list(self._claims):
            if claim not in live:
                del self._claims[claim]
                self._progress.pop(claim, None)
        return 0

    def next_delay(self, idle_delay: float) -> float:
        """Tick often enough to renew the shortest live claim several times per TTL."""
        ttls = [task.claim_ttl for task, _ in self.runtime.active_attempts()]
        return min([idle_delay, *(ttl / 4 for ttl in ttls)])
