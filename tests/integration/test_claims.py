"""Claims as tokens: one rule for every write an attempt makes, infrastructure errors
that never become an activity's outcome, and the name of a claim that lapsed.

Real SQLite or PostgreSQL (``SELVEDGE_TEST_DB``); a ``ControllableClock`` moves
workflow time and the database clock together where a claim has to lapse, and
the :class:`~selvedge_django.testing.FaultInjector` makes real statements fail.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.models import ActivityTask, HistoryEvent
from selvedge_django.storage import store_for
from selvedge_django.testing import ControllableClock, FaultInjector, run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp.models import Ledger


def start(activity: str, input: dict[str, Any], options: dict[str, Any] | None = None) -> str:
    data: dict[str, Any] = {"activity": activity, "input": input}
    if options is not None:
        data["options"] = options
    return sv.start_workflow("act.run", data)


def ledger(prefix: str) -> list[str]:
    return sorted(Ledger.objects.filter(entry__startswith=prefix).values_list("entry", flat=True))


def task_of(instance_id: str) -> ActivityTask:
    (task,) = ActivityTask.objects.filter(instance_id=instance_id, name__startswith="act.")
    return task


def drive(clock: ControllableClock, **overrides: Any) -> int:
    return run_until_idle(Worker(clock=clock, **overrides))


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def marker(tmp_path: Path) -> Any:
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


# -- one rule for complete, fail, retry and release --------------------------------------


def test_a_lapsed_claim_can_neither_complete_fail_retry_nor_release(
    clock: ControllableClock,
) -> None:
    instance_id = start("act.step", {"tag": "rule"}, {"queue": "rule-q"})
    drive(clock, activity_queues=[])
    store = store_for("default", Codec())
    store.options.lease_ttl = 5
    ready_ms = task_of(instance_id).not_before_ms  # its reservation time
    (claimed,) = store.tasks.claim_tasks("slow-worker", 1, ["act.step"])
    clock.advance(5.1)  # lapsed, and nobody has reclaimed it yet

    claim = claimed.claim
    assert store.tasks.complete_task(claim, json.dumps("late")) is False
    assert store.tasks.fail_task(claim, json.dumps({"message": "late"})) is False
    assert store.tasks.retry_task(claim, json.dumps({"message": "late"}), 10) is False
    assert store.tasks.release_task(claim) is False
    task = task_of(instance_id)
    assert (task.status, task.claim_owner, task.failures, task.not_before_ms) == (
        "running",
        "slow-worker",
        0,
        ready_ms,
    )
    assert HistoryEvent.objects.get(instance_id=instance_id, key__contains="act.step").data is None


@pytest.mark.parametrize("error", ["final", "retryable"])
def test_a_lapsed_attempts_error_goes_through_the_lapse_path(
    clock: ControllableClock, error: str
) -> None:
    """A lapse counts as a failure and is reclaimed at once: the late attempt's own error
    (final or retryable with a 10 s backoff) is not recorded."""
    flags = {"final_on": [1]} if error == "final" else {"fail_until": 2}
    instance_id = start("act.step", {"tag": f"late-{error}", **flags}, {"queue": "late-q"})
    drive(clock, activity_queues=[])
    worker = Worker(clock=clock, lease={"TTL": 5, "RENEW_INTERVAL": 1, "MARGIN": 1, "MAX_SKEW": 1})
    (claimed,) = worker.store.tasks.claim_tasks(worker.worker_id, 1, ["act.step"])
    clock.advance(5.1)  # the claim lapses while the attempt runs
    assert worker.runtime.attempts.run_claimed(claimed) is None  # its failure was not written

    task = task_of(instance_id)
    assert (task.status, task.failures) == ("running", 0)
    drive(clock)  # the lapse is counted and the task reclaimed without backoff

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output["attempt"] == 2
    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures) == ("completed", 2, 1)
    assert ledger(f"step:late-{error}") == [f"step:late-{error}:1", f"step:late-{error}:2"]


# -- what a lapse is called ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "kind"),
    [
        ({}, "claim_lapsed"),
        ({"start_to_close_timeout": 60}, "claim_lapsed"),  # lapsed before its deadline
        ({"start_to_close_timeout": 5}, "start_to_close"),
        ({"heartbeat_timeout": 5}, "heartbeat"),
    ],
    ids=["no-timeouts", "before-deadline", "deadline", "heartbeat"],
)
def test_a_vanished_worker_s_lapse_names_what_happened(
    clock: ControllableClock, options: dict[str, Any], kind: str
) -> None:
    instance_id = start("act.step", {"tag": "gone"}, {"queue": "gone-q", **options})
    drive(clock, activity_queues=[])
    store = store_for("default", Codec())
    store.options.lease_ttl = 5
    store.tasks.claim_tasks("vanished", 1, ["act.step"])
    clock.advance(5.1)
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.attempts, info.failures) == (2, 1)
    assert isinstance(info.last_error, sv.ActivityTimeoutError)
    assert isinstance(info.last_error, TimeoutError)
    assert (info.last_error.kind, info.last_error.attempt) == (kind, 1)


# -- infrastructure errors are not outcomes -----------------------------------------------


@pytest.mark.parametrize("path", ["background", "inline"])
def test_a_failed_write_of_a_success_is_retried_not_recorded_as_a_failure(
    make_worker: Callable[..., Any], path: str
) -> None:
    """A background attempt writes its result itself (complete_task, tried again); an
    inline attempt's result commits with the execution's next write, here the close: a
    failed close is a storage error, the result is recorded on its own, the run replays."""
    with FaultInjector() as faults:
        operation = "complete_task" if path == "background" else "close"
        fault = faults.fail_statement(operation=operation, times=2)
        make_worker(execution_error_backoff=0.01)
        instance_id = sv.start_workflow(
            "act.run",
            {
                "activity": "act.step",
                "input": {"tag": "infra"},
                "options": {"retry_policy": {"max_attempts": 1}},
                "background": path == "background",
            },
        )
        result = sv.wait_workflow(instance_id, timeout=20)
    assert fault.fired == 2
    assert result.status == "completed", result.error
    assert result.output["attempt"] == 1
    task = task_of(instance_id)
    assert (task.status, task.attempts, task.failures, task.last_error) == (
        "completed",
        1,
        0,
        None,
    )


def test_a_failed_write_of_a_transactional_success_releases_the_claim(
    make_worker: Callable[..., Any],
) -> None:
    """The attempt's writes rolled back with the failed write: it runs again, budget intact."""
    with FaultInjector() as faults:
        fault = faults.fail_statement(operation="complete_task", times=1)
        make_worker()
        instance_id = sv.start_workflow("test.tx_flow", {"entry": "txinfra"})
        result = sv.wait_workflow(instance_id, timeout=20)
    assert fault.fired == 1
    assert result.status == "completed", result.error
    (task,) = ActivityTask.objects.filter(instance_id=instance_id, name="test.tx_record")
    assert (task.status, task.attempts, task.failures) == ("completed", 2, 0)
    assert ledger("tx:txinfra") == ["tx:txinfra:2"]  # attempt 1's write rolled back


def test_a_failed_claim_renewal_does_not_cancel_a_claim_still_valid(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    lease = {"TTL": 3, "RENEW_INTERVAL": 1, "MARGIN": 1, "MAX_SKEW": 0.5}
    with FaultInjector() as faults:
        fault = faults.fail_statement(operation="renew_claims", times=1)
        make_worker(lease=lease)
        instance_id = start(
            "act.wait",
            {"tag": "renew", "hold_while": str(marker), "mode": "heartbeat", "max_hold": 20},
            {"retry_policy": {"max_attempts": 1}},
        )
        wait_until(lambda: ledger("wait:renew"))
        wait_until(lambda: fault.fired == 1 and fault.hits >= 3, timeout=20)
        marker.unlink()
        result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == "renew:1"
    task = task_of(instance_id)
    assert (task.status, task.attempts, task.failures) == ("completed", 1, 0)


def test_a_failed_lease_renewal_keeps_a_lease_still_believed_valid(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    # Renewals every 3.45 s of a 6 s lease (a 3.9-s interval, due half a second before the
    # 3.95-s belief ends): after one failed renewal the next regular one would find the
    # lease expired; a retry at the next tick (0.25 s) is in time.
    lease = {"TTL": 6, "RENEW_INTERVAL": 3.9, "MARGIN": 2, "MAX_SKEW": 0.05}
    with FaultInjector() as faults:
        fault = faults.fail_statement(operation="renew_leases", times=1)
        make_worker(lease=lease, worker_id="renewing")
        instance_id = sv.start_workflow(
            "test.crashable", {"entry": "lease", "hold_while": str(marker)}
        )
        wait_until(lambda: ledger("started:lease"))
        wait_until(lambda: fault.fired == 1 and fault.hits >= 3, timeout=20)
        marker.unlink()
        result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == "before+lease"
    # The execution that ran the held activity inline also recorded the result: the
    # lease was never given up, so no second execution ran it.
    inst = sv.describe(instance_id)
    assert inst.status == "completed"
    assert ledger("started:lease") == ["started:lease"]
    from selvedge_django.models import WorkflowInstance

    assert WorkflowInstance.objects.get(instance_id=instance_id).lease_epoch == 1


def test_a_renewal_interval_longer_than_the_belief_keeps_the_lease_trusted(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    # Accepted settings (RENEW_INTERVAL + MARGIN < TTL) whose renewal interval, 3.9 s, is
    # longer than the holder's belief, TTL - MARGIN - MAX_SKEW = 1.5 s. Renewing only every
    # interval, the holder would distrust for 2.4 s of every cycle a lease the database
    # still gives it, and a write then would abandon the execution.
    lease = {"TTL": 6, "RENEW_INTERVAL": 3.9, "MARGIN": 2, "MAX_SKEW": 2.5}
    make_worker(lease=lease, worker_id="renewing")
    instance_id = sv.start_workflow(
        "test.crashable", {"entry": "trusted", "hold_while": str(marker)}
    )
    wait_until(lambda: ledger("started:trusted"))
    # Hold the step past the belief of the lease that started it and finish it before the
    # renewal interval: the step is what this test is about, not a wait for a condition.
    time.sleep(2.2)
    marker.unlink()
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == "before+trusted"
    from selvedge_django.models import WorkflowInstance

    # One execution from start to close: the lease was never abandoned and taken again.
    assert WorkflowInstance.objects.get(instance_id=instance_id).lease_epoch == 1
