"""Inline results that commit with the execution's next write: one commit per inline step.

An inline attempt (an activity run on the workflow's own thread, claimed with its
reservation) does not commit its result on its own. The worker hands it to
:meth:`InlineResultStore.defer_completion`, the workflow code goes on with the
value, and the next fenced write of that execution (the next command's
reservation, a wait, a timer, a child start, the suspension's lease release, the
close or a continue-as-new) records it first, in its own transaction: the task
completed under the attempt's claim (claim epoch, owner, unexpired) and the value
in its history row. So the value commits before, or together with, anything the
code did after seeing it, and a durable inline step costs one commit.

A crash in between loses only the attempt: the task is still claimed, its claim
lapses, and the activity runs again (at least once, as the contract allows; a
lapse counts as a failure, as for any attempt a crash interrupts). A claim that
lapsed before the write makes that write fail (nothing of it commits) with
:class:`InlineClaimLapsed`, a :class:`LeaseLost`: the execution stops and the
instance replays from what is recorded. Whatever is still pending when an
execution ends without such a write (it was fenced out, a write failed) is
handed back by :meth:`take_deferred` and recorded on its own, as a background
completion would be (retried while the database refuses it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import exceptions as exc
from ..engine.events import EV_ACTIVITY_COMPLETED, Fence
from ..engine.ports import TaskClaim
from ..models import WorkflowInstance
from .base import StoreBase
from .operation import operation
from .wakeups import TOPIC_RUNNABLE

__all__ = ["InlineClaimLapsed", "InlineResultStore", "Pending"]


class InlineClaimLapsed(exc.LeaseLost):
    """An inline result's claim lapsed before the write that was to record it."""


@dataclass
class Pending:
    """An inline attempt's result held for its execution's next fenced write."""

    fence: Fence
    claim: TaskClaim
    output: str
    on_recorded: Callable[[], None] | None
    # Written by the current transaction, which has not committed yet.
    applying: bool = False


class InlineResultStore(StoreBase):
    """Deferred inline completions, per execution thread."""

    if TYPE_CHECKING:  # provided by TaskStore

        def _complete_sql(self, claim: TaskClaim) -> tuple[str, list[Any]]: ...

        def _arrive_record(
            self, claim: TaskClaim, event_type: str, data: str
        ) -> tuple[str, list[Any]]: ...

        def complete_task(
            self, claim: TaskClaim, output: str, *, inline_fence: Fence | None = None
        ) -> bool: ...

    def _pending(self) -> list[Pending]:
        items: list[Pending] | None = getattr(self._inline, "items", None)
        if items is None:
            items = self._inline.items = []
        return items

    @operation
    def defer_completion(
        self,
        fence: Fence,
        claim: TaskClaim,
        output: str,
        on_recorded: Callable[[], None] | None = None,
    ) -> None:
        """Hold an inline attempt's result for the next fenced write of ``fence``.

        ``on_recorded`` runs once the result has committed.
        """
        self._pending().append(Pending(fence, claim, output, on_recorded))

    @operation
    def has_deferred(self, fence: Fence) -> bool:
        """Whether a result of ``fence``'s execution waits for its next write."""
        return any(p.fence == fence for p in getattr(self._inline, "items", ()) or ())

    def _apply_deferred(self, fence: Fence) -> None:
        """Record the results held for ``fence``, inside its write's transaction, just
        after the fence check (the instance row first, then each task: the lock order
        of every completion)."""
        items = [p for p in getattr(self._inline, "items", ()) or () if p.fence == fence]
        for item in items:
            if item.applying:
                continue
            if not self._record_inline(item.claim, item.output, fence):
                # The claim lapsed: this value may never be recorded. The write fails
                # (it rolls back), and the execution replays from what is recorded.
                self._pending().remove(item)
                raise self._lapsed(fence, item.claim)
            item.applying = True
            transaction.on_commit(functools.partial(self._recorded, item), using=self.alias)

    def _sole_deferred(self, fence: Fence) -> Pending | None:
        """The one result held for ``fence`` (None: none, several, or one being written),
        for a store that records it inside the write's own statement."""
        items = [p for p in getattr(self._inline, "items", ()) or () if p.fence == fence]
        if len(items) != 1 or items[0].applying:
            return None
        return items[0]

    def _settle_deferred(self, item: Pending, *, recorded: bool) -> None:
        """A held result that a committed statement recorded (``recorded``), or found
        unrecordable because its claim lapsed: it is no longer held."""
        if recorded:
            self._recorded(item)
        elif item in self._pending():
            self._pending().remove(item)

    @staticmethod
    def _lapsed(fence: Fence, claim: TaskClaim) -> InlineClaimLapsed:
        return InlineClaimLapsed(
            f"the claim of inline activity {claim.key!r} of"
            f" {fence.instance_id!r} lapsed before its result was recorded"
        )

    def _record_inline(self, claim: TaskClaim, output: str, fence: Fence) -> bool:
        """The claim-checked completion and the history value (no wake-up: the execution
        holding ``fence`` reads it itself); False when the claim lapsed."""
        complete, params = self._complete_sql(claim)
        if not self._execute(complete, params):
            return False
        record, record_params = self._arrive_record(claim, EV_ACTIVITY_COMPLETED, output)
        self._execute(record, record_params)
        return True

    def _recorded(self, item: Pending) -> None:
        pending = self._pending()
        if item in pending:
            pending.remove(item)
        if item.on_recorded is not None:
            item.on_recorded()

    def _deferred_rolled_back(self) -> None:
        """The store transaction rolled back: what it wrote is pending again."""
        for item in getattr(self._inline, "items", ()) or ():
            item.applying = False

    @operation
    def take_deferred(self, fence: Fence) -> list[tuple[TaskClaim, str, Callable[[], None] | None]]:
        """Hand over the results still held for ``fence`` (the execution ended without a
        write that took them): each is then recorded on its own with
        :meth:`complete_task`, claim-checked, as a background attempt records its own."""
        items = [p for p in self._pending() if p.fence == fence]
        for item in items:
            self._pending().remove(item)
        return [(item.claim, item.output, item.on_recorded) for item in items]

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
            "sticky_until_ms": self.now_expr(sticky or 0.0),
        }
        if parked is not None:
            updates.update(parked_seq=parked[0], parked_key=parked[1])
        held = WorkflowInstance.objects.using(self.alias).filter(
            instance_id=fence.instance_id, lease_owner=fence.owner, lease_epoch=fence.epoch
        )
        try:
            with self.atomic():
                if held.update(**updates, **(self.wake_fields() if runnable else {})):
                    self._apply_deferred(fence)
                    self.after_commit(TOPIC_RUNNABLE)
        except InlineClaimLapsed:
            with self.atomic():
                if held.update(**updates, **self.wake_fields()):
                    self.after_commit(TOPIC_RUNNABLE)
