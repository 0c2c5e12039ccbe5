"""Releasing an execution lease: the one statement a suspension (or an abandonment) ends with.

The release keeps pending input runnable, records where a suspended execution
waits, and names the worker whose workflow cache keeps the execution (its sticky
window, during which other workers' dispatchers pass the instance over).
"""

from __future__ import annotations

from typing import Any

from ..engine.events import Fence
from ..models import WorkflowInstance
from . import sql
from .db import Database
from .inline import InlineClaimLapsed
from .operation import operation
from .wakeups import TOPIC_RUNNABLE

__all__ = ["Releases"]


class Releases:
    """The release of an execution lease (``store.releases``); the SQLite store without
    RETURNING has its own."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @operation
    def release_lease(
        self,
        fence: Fence,
        runnable: bool = False,
        parked: tuple[int, str] | None = None,
        sticky: float | None = None,
    ) -> None:
        """Clear a matching lease, keeping pending input runnable.

        ``parked`` is the position and key of the command a suspended execution waits
        at, kept for the next one (see :mod:`selvedge_django.engine.patches`).
        ``sticky`` (seconds) says the releasing worker keeps the execution in its
        workflow cache: other workers' dispatchers pass the instance over for that
        long (``WORKFLOW_CACHE["STICKY_WINDOW"]``); without it nobody is preferred.

        The execution ended without a storage error: its instance's count of them
        in a row goes back to 0, in the same update. One statement that also says
        whether input arrived meanwhile: only then is a dispatcher woken (every
        worker's, through NOTIFY), not on every release. An inline result still
        held for the execution commits with it (:mod:`.inline`).
        """
        if self.db.has_deferred(fence):
            self._release_with_deferred(fence, runnable, parked, sticky)
            return
        parked_seq, parked_key = parked if parked is not None else (None, None)
        rows = self.db._fetch(
            sql.RELEASE_LEASE,
            {
                "sticky_owner": fence.owner if sticky is not None else "",
                "sticky_ms": round((sticky or 0.0) * 1000),
                "parked_seq": parked_seq,
                "parked_key": parked_key,
                "runnable": runnable,
                "instance_id": fence.instance_id,
                "owner": fence.owner,
                "epoch": fence.epoch,
            },
        )
        if rows and rows[0][0]:
            self.db.after_commit(TOPIC_RUNNABLE)

    def _release_with_deferred(
        self,
        fence: Fence,
        runnable: bool,
        parked: tuple[int, str] | None,
        sticky: float | None = None,
    ) -> None:
        """release_lease with the inline results it records, in one transaction.

        When a result's claim lapsed it cannot be recorded: the lease is released
        without it and the instance left runnable, so that it replays (and the
        activity runs again) at once.
        """
        updates: dict[str, Any] = {
            "lease_owner": "",
            "lease_expires_ms": None,
            "execution_errors": 0,
            "execution_error": "",
            # A worker's cache that keeps the execution (release_lease's ``sticky``).
            "sticky_owner": fence.owner if sticky is not None else "",
            "sticky_until_ms": self.db.now_expr(sticky or 0.0),
        }
        if parked is not None:
            updates.update(parked_seq=parked[0], parked_key=parked[1])
        held = WorkflowInstance.objects.using(self.db.alias).filter(
            instance_id=fence.instance_id, lease_owner=fence.owner, lease_epoch=fence.epoch
        )
        try:
            with self.db.atomic():
                if held.update(**updates, **(self.db.wake_fields() if runnable else {})):
                    self.db.apply_deferred(fence)
                    self.db.after_commit(TOPIC_RUNNABLE)
        except InlineClaimLapsed:
            with self.db.atomic():
                if held.update(**updates, **self.db.wake_fields()):
                    self.db.after_commit(TOPIC_RUNNABLE)
