"""Inline results that commit with the execution's next write: one commit per inline step.

An inline attempt (an activity run on the workflow's own thread, claimed with its
reservation) does not commit its result on its own. The worker hands it to
:meth:`Inline.defer_completion`, the workflow code goes on with the
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

from django.db import transaction

from .. import exceptions as exc
from ..engine.events import Fence
from ..engine.ports import TaskClaim
from .db import Database
from .operation import operation

__all__ = ["Inline", "InlineClaimLapsed", "Pending"]


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


class Inline:
    """The inline results held per execution thread, until their execution's next write
    (``store.inline``). :meth:`Tasks._apply_deferred
    <selvedge_django.storage.tasks.Tasks._apply_deferred>` records them."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _pending(self) -> list[Pending]:
        items: list[Pending] | None = getattr(self.db._inline, "items", None)
        if items is None:
            items = self.db._inline.items = []
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
        return any(p.fence == fence for p in getattr(self.db._inline, "items", ()) or ())

    def _apply_deferred(
        self, fence: Fence, record: Callable[[TaskClaim, str, Fence], bool]
    ) -> None:
        """Record the results held for ``fence`` with ``record`` (the claim-checked
        completion and its history value; False when the claim lapsed), inside its
        write's transaction, just after the fence check (the instance row first, then
        each task: the lock order of every completion)."""
        items = [p for p in getattr(self.db._inline, "items", ()) or () if p.fence == fence]
        for item in items:
            if item.applying:
                continue
            if not record(item.claim, item.output, fence):
                # The claim lapsed: this value may never be recorded. The write fails
                # (it rolls back), and the execution replays from what is recorded.
                self._pending().remove(item)
                raise self._lapsed(fence, item.claim)
            item.applying = True
            transaction.on_commit(functools.partial(self._recorded, item), using=self.db.alias)

    def _sole_deferred(self, fence: Fence) -> Pending | None:
        """The one result held for ``fence`` (None: none, several, or one being written),
        for a store that records it inside the write's own statement."""
        items = [p for p in getattr(self.db._inline, "items", ()) or () if p.fence == fence]
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

    def _recorded(self, item: Pending) -> None:
        pending = self._pending()
        if item in pending:
            pending.remove(item)
        if item.on_recorded is not None:
            item.on_recorded()

    def _deferred_rolled_back(self) -> None:
        """The store transaction rolled back: what it wrote is pending again."""
        for item in getattr(self.db._inline, "items", ()) or ():
            item.applying = False

    @operation
    def take_deferred(self, fence: Fence) -> list[tuple[TaskClaim, str, Callable[[], None] | None]]:
        """Hand over the results still held for ``fence`` (the execution ended without a
        write that took them): each is then recorded on its own with
        :meth:`Tasks.complete_task`, claim-checked, as a background attempt records its own."""
        items = [p for p in self._pending() if p.fence == fence]
        for item in items:
            self._pending().remove(item)
        return [(item.claim, item.output, item.on_recorded) for item in items]
