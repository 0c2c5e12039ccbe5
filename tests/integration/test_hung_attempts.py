"""Attempts that never return: they must not pin their instance, and they are counted.

Python cannot stop a thread. An activity that ignores its deadline (a socket
without a timeout) keeps its thread until its code returns. A hung *inline*
attempt used to keep the execution's lease renewed all that time, so the retry
that another attempt completed could not resume the workflow; now the lease is
given up once the attempt is past its deadline (or lost its claim, or missed a
heartbeat) for ``HUNG_AFTER`` seconds. Hung attempts, inline or in the
background, are logged once and listed by ``Worker.hung_attempts()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

import selvedge_django as sv
from selvedge_django.models import ActivityTask
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import HungAttempt, Worker
from tests.conftest import wait_until
from tests.testapp.models import Ledger

FAST_RETRY = {"max_attempts": 3, "initial_interval": 0.05, "backoff_coefficient": 1.0}
STOPS = {
    "deadline": ({"start_to_close_timeout": 1}, "start_to_close deadline passed"),
    "heartbeat": ({"heartbeat_timeout": 1}, "heartbeat timeout"),
}


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def start_hung(tag: str, marker: Path, options: dict[str, Any], *, background: bool) -> str:
    """act.wait whose first attempt holds while ``marker`` exists, ignoring every stop."""
    data: dict[str, Any] = {
        "activity": "act.wait",
        "input": {
            "tag": tag,
            "hold_while": str(marker),
            "mode": "ignore",
            "hold_on": [1],
            "max_hold": 60,
        },
        "options": {**options, "retry_policy": FAST_RETRY},
    }
    if background:
        data["background"] = True
    return sv.start_workflow("act.run", data)


def entries(tag: str) -> list[str]:
    return sorted(
        Ledger.objects.filter(entry__startswith=f"wait:{tag}:").values_list("entry", flat=True)
    )


@pytest.mark.parametrize("stop", list(STOPS))
def test_a_hung_inline_attempt_does_not_pin_its_instance(
    make_worker: Callable[..., Any],
    marker: Path,
    caplog: pytest.LogCaptureFixture,
    stop: str,
) -> None:
    """The retry completes and the workflow closes while attempt 1 still hangs."""
    caplog.set_level(logging.WARNING, logger="selvedge_django.worker")
    worker = make_worker(max_concurrent_activities=2, max_concurrent_resumptions=2)
    options, reason = STOPS[stop]
    instance_id = start_hung(f"in-{stop}", marker, options, background=False)

    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == f"in-{stop}:2"
    assert entries(f"in-{stop}") == [
        f"wait:in-{stop}:1:start",
        f"wait:in-{stop}:2:end",
        f"wait:in-{stop}:2:start",
    ]
    (hung,) = wait_until(worker.hung_attempts)
    assert isinstance(hung, HungAttempt)
    assert (hung.instance_id, hung.attempt, hung.inline, hung.reason) == (
        instance_id,
        1,
        True,
        reason,
    )
    assert hung.overdue >= 1.0
    (warning,) = wait_until(lambda: [r for r in caplog.records if "still runs" in r.getMessage()])
    assert instance_id in warning.getMessage() and "lease" in warning.getMessage()

    marker.unlink()  # the hung call returns at last: its late result changes nothing
    wait_until(lambda: f"wait:in-{stop}:1:end" in entries(f"in-{stop}"))
    wait_until(lambda: worker.hung_attempts() == [])
    assert sv.get_workflow_result(instance_id).output == f"in-{stop}:2"
    task = ActivityTask.objects.get(instance_id=instance_id, name="act.wait")
    assert (task.status, task.attempts, task.failures) == ("completed", 2, 1)


def test_a_hung_background_attempt_is_counted_and_keeps_its_thread(
    make_worker: Callable[..., Any], marker: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="selvedge_django.worker")
    worker = make_worker(max_concurrent_activities=2)
    options, reason = STOPS["deadline"]
    instance_id = start_hung("bg", marker, options, background=True)

    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == "bg:2"
    (hung,) = wait_until(worker.hung_attempts)  # 1 s past the deadline
    assert (hung.instance_id, hung.attempt, hung.inline, hung.reason) == (
        instance_id,
        1,
        False,
        reason,
    )
    assert worker.activities.free_slots() == 1  # the hung attempt's thread is still taken
    wait_until(lambda: [r for r in caplog.records if "still runs" in r.getMessage()])

    marker.unlink()
    wait_until(lambda: worker.hung_attempts() == [] and worker.activities.free_slots() == 2)
    assert entries("bg") == ["wait:bg:1:end", "wait:bg:1:start", "wait:bg:2:end", "wait:bg:2:start"]
    assert sv.get_workflow_result(instance_id).output == "bg:2"
    assert len([r for r in caplog.records if "still runs" in r.getMessage()]) == 1  # once


def test_an_attempts_deadline_runs_from_its_claim_not_from_its_threads_start(
    tdb: None, marker: Path
) -> None:
    """The database measures start_to_close from the claim; a busy machine or a full pool
    may start the attempt's thread well after it. The worker's deadline must not pass
    later than the database's, else the claim lapses first and a hung attempt is reported
    as a lost claim rather than as past its deadline."""
    instance_id = start_hung("claimed", marker, {"start_to_close_timeout": 30}, background=True)
    run_until_idle(Worker(activity_queues=[]))  # reserves the task, claims nothing
    worker = Worker(max_concurrent_activities=1)
    before = time.monotonic()
    (claimed,) = worker.store.tasks.claim_tasks(worker.worker_id, 1, ["act.wait"])
    after = time.monotonic()
    assert claimed.claim.instance_id == instance_id
    assert claimed.claimed_at is not None and before <= claimed.claimed_at <= after

    def run_attempt() -> None:
        try:
            worker.runtime.attempts.run_claimed(claimed)
        finally:
            connections.close_all()

    attempt = threading.Thread(target=run_attempt)
    attempt.start()  # later than the claim, as from a pool
    try:
        ((_, state),) = wait_until(worker.runtime.attempts.active_attempts)
        assert state.deadline_monotonic is not None
        assert before + 30 <= state.deadline_monotonic <= after + 30
    finally:
        marker.unlink()
        attempt.join(30)
    assert not attempt.is_alive()
    assert entries("claimed") == ["wait:claimed:1:end", "wait:claimed:1:start"]
