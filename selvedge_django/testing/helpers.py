"""Running a worker's loops in the test's thread, and the same for ``manage.py test``."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING

from .clock import ControllableClock, installed_clock

if TYPE_CHECKING:
    from ..worker import Worker

__all__ = ["SelvedgeTestMixin", "run_until_idle"]


def run_until_idle(worker: Worker, max_rounds: int = 1000) -> int:
    """Run an unstarted worker's loops in this thread until a round does nothing.

    Executions and activity attempts run inline, one at a time, so a test can
    advance a :class:`ControllableClock` between calls and observe each step.
    Each round also does the leader's duties: it records the activity timeouts
    that passed, terminates runs past their execution timeout and starts the
    runs of due schedules, so advancing past a deadline or a slot is seen here
    too. As in a worker's threads, an activity's ``SystemExit`` (its failure
    recorded) is logged, not raised here. Returns the number of units of work done.
    """
    if worker.started:
        raise RuntimeError("run_until_idle drives an unstarted Worker")
    worker.resumptions.inline = True
    worker.activities.inline = True
    limit = worker.settings.max_workflows_per_batch
    total = 0
    for _ in range(max_rounds):
        done = sum(loop.run_once() for loop in worker.work_loops())
        done += worker.store.task_timeouts.sweep_activity_timeouts(limit)
        done += worker.leader.sweep_execution_timeouts(limit)
        done += worker.leader.schedules.run_once()
        total += done
        if done == 0:
            return total
    raise RuntimeError(f"still busy after {max_rounds} rounds")


class SelvedgeTestMixin:
    """For ``manage.py test``: a controllable clock and a worker run in the test's thread.

    Mix it into a ``django.test.TransactionTestCase`` (workers commit their own
    transactions, which a ``TestCase`` would wrap in one that never commits)::

        class ReminderTests(SelvedgeTestMixin, TransactionTestCase):
            def test_reply(self):
                instance_id = sv.start_workflow("reminder", "Ada")
                self.run_until_idle()
                self.advance(timedelta(days=7))  # moves the clock, then runs

    Each test gets ``self.selvedge_clock`` (a :class:`ControllableClock`
    installed as ``SELVEDGE["CLOCK"]``) and ``self.selvedge_worker`` (an
    unstarted ``Worker``, made on first use, that :meth:`run_until_idle` drives).
    """

    selvedge_clock: ControllableClock

    def setUp(self) -> None:
        from django.test import TestCase

        if isinstance(self, TestCase):
            raise TypeError(
                f"{type(self).__name__}: SelvedgeTestMixin needs a TransactionTestCase; "
                "a TestCase wraps each test in a transaction that never commits"
            )
        super().setUp()  # type: ignore[misc]
        stack = contextlib.ExitStack()
        self.addCleanup(stack.close)  # type: ignore[attr-defined]
        self.selvedge_clock = stack.enter_context(installed_clock())
        self._selvedge_worker: Worker | None = None

    @property
    def selvedge_worker(self) -> Worker:
        """The unstarted Worker this test drives (made with the test's clock)."""
        if self._selvedge_worker is None:
            from ..worker import Worker

            self._selvedge_worker = Worker()
        return self._selvedge_worker

    def run_until_idle(self) -> int:
        """Run workflows, activities and due timers until nothing is runnable."""
        return run_until_idle(self.selvedge_worker)

    def advance(self, delta: timedelta | float) -> int:
        """Move the clock forward by ``delta``, then run until nothing is runnable."""
        self.selvedge_clock.advance(delta)
        return self.run_until_idle()
