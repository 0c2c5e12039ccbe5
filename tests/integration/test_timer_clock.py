"""Timers fire by the database clock; ``CLOCK`` drives ``ctx.now()`` and expiry only.

A timer armed for ``d`` seconds fires once ``d`` seconds have passed on the
database clock since its arming, and records the expiry the configured clock
gave (workflow time). Real worker threads on the real test database, with
configured clocks that are frozen in the past or a day ahead.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import selvedge_django as sv
from selvedge_django.models import HistoryEvent, TimerSubscription
from tests.conftest import wait_until

PAST = datetime(2001, 1, 1, tzinfo=UTC)


def frozen_in_the_past() -> datetime:
    return PAST


class JumpingClock:
    """The system clock, plus an offset a test can change (a clock that jumps)."""

    def __init__(self) -> None:
        self.ahead = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.ahead


def sleep_row(instance_id: str) -> HistoryEvent:
    (row,) = HistoryEvent.objects.filter(instance_id=instance_id, command="sleep")
    return row


def test_a_timer_fires_although_the_configured_clock_is_frozen_in_the_past(
    make_worker: Callable[..., Any],
) -> None:
    make_worker(clock=frozen_in_the_past)
    instance_id = sv.start_workflow("wait.sleep", {"seconds": 1})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    # Workflow time stays the configured clock's: the expiry recorded is past + 1 s.
    expiry = (PAST + timedelta(seconds=1)).isoformat()
    assert json.loads(sleep_row(instance_id).data or "") == expiry
    assert result.output["after"] == expiry
    assert not TimerSubscription.objects.exists()


def test_a_clock_that_jumps_ahead_does_not_hasten_a_timer(make_worker: Callable[..., Any]) -> None:
    clock = JumpingClock()
    worker = make_worker(clock=clock)
    started = datetime.now(UTC)
    instance_id = sv.start_workflow("wait.sleep", {"seconds": 1.5})
    wait_until(lambda: TimerSubscription.objects.filter(instance_id=instance_id).exists())
    clock.ahead = timedelta(days=1)  # after the arming: the expiry now lies far behind CLOCK
    worker.timer_poller.waker.wake()  # as another timer's arming would: look again now
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    row = sleep_row(instance_id)
    assert row.arrived_at is not None
    # Fired no earlier than its duration after the start (the database clock and this
    # process's wall clock are the same machine's here).
    assert row.arrived_at - started >= timedelta(seconds=1.5)
    recorded = datetime.fromisoformat(json.loads(row.data or ""))
    assert recorded - started < timedelta(hours=1)  # the expiry armed before the jump
    # Workflow time after the fire is the configured clock's: a day ahead.
    after = datetime.fromisoformat(result.output["after"])
    assert after - started > timedelta(hours=23)


def test_a_timed_receive_times_out_by_the_database_clock(
    make_worker: Callable[..., Any],
) -> None:
    make_worker(clock=frozen_in_the_past)
    instance_id = sv.start_workflow("wait.receive_timeout", {"timeout": 1})
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert not TimerSubscription.objects.exists()
