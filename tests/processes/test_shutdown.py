"""Graceful shutdown: renewals go on until in-flight work finished or was released.

``Worker.stop()`` tells every attempt in flight to stop at once, keeps its leases
and claims renewed while it waits, records results that still arrive, and at the
timeout releases what is still held (a graceful release: the attempt number is
used, the retry budget is not). Real worker threads on the real test database;
the last test runs a real ``runselvedge worker`` process and sends it SIGTERM.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from selvedge_django.storage import store_for
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Ledger

from .test_processes import read_until

# Claims of these workers live 1.5 s unless renewed.
SHORT_LEASE = {"TTL": 1.5, "RENEW_INTERVAL": 0.3, "MARGIN": 0.3, "MAX_SKEW": 0.1}


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


def db_now_ms() -> int:
    return store_for("default", Codec()).now_ms()


def renewed_past(task_id: int, ms: int) -> bool:
    expires = ActivityTask.objects.get(id=task_id).claim_expires_ms
    return expires is not None and expires > ms


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def test_a_heartbeating_attempt_is_told_to_stop_and_released_with_its_budget_intact(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    # Another worker leads, so a claim that lapsed during the shutdown would be swept
    # there: with max_attempts=1, as the final RetryExhaustedError.
    leader = make_worker(
        worker_id="leading",
        activity_queues=[],
        leader_heartbeat_interval=0.2,
        leader_lease_duration=5,
    )
    wait_until(lambda: leader.leader.is_leader)
    leaving = make_worker(worker_id="leaving")
    instance_id = start(
        "act.wait",
        {"tag": "hb", "hold_while": str(marker), "mode": "heartbeat", "hold_on": [1]},
        {"heartbeat_timeout": 1, "retry_policy": {"max_attempts": 1}},
    )
    wait_until(lambda: ledger("wait:hb:1:start"))
    task = task_of(instance_id)
    assert task.claim_owner == "leaving"

    leaving.stop(timeout=3)

    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures, task.claim_owner) == ("queued", 1, 0, "")
    assert task.last_error is None
    assert ledger("wait:hb") == ["wait:hb:1:start"]  # heartbeat() raised: it never ended
    make_worker(worker_id="successor")
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == "hb:2"
    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures) == ("completed", 2, 0)


def test_a_result_that_arrives_during_shutdown_is_recorded_under_a_renewed_claim(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    leaving = make_worker(worker_id="finishing", lease=SHORT_LEASE)
    instance_id = start("act.wait", {"tag": "late", "hold_while": str(marker), "mode": "ignore"})
    wait_until(lambda: ledger("wait:late:1:start"))
    task = task_of(instance_id)

    def stop() -> None:
        try:
            leaving.stop(timeout=30)
        finally:
            connections.close_all()  # this thread's own, used to release what is left

    stopped = threading.Thread(target=stop)
    stop_ms = db_now_ms()
    stopped.start()
    try:
        # The claim outlives its TTL counted from the start of the shutdown: renewed.
        wait_until(lambda: renewed_past(task.id, stop_ms + 1500 + 300), timeout=10)
    finally:
        marker.unlink()
        stopped.join(30)
    assert not stopped.is_alive()

    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures) == ("completed", 1, 0)
    row = HistoryEvent.objects.get(instance_id=instance_id, key=task.key)
    assert (row.event_type, json.loads(row.data)) == ("ActivityCompleted", "late:1")
    # The execution in flight finished too, under its renewed lease.
    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output == "late:1"


def test_claims_still_held_at_the_timeout_are_released_and_their_late_result_discarded(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    leaving = make_worker(worker_id="stubborn")
    instance_id = start(
        "act.wait",
        {"tag": "deaf", "hold_while": str(marker), "mode": "ignore", "hold_on": [1]},
        {"retry_policy": {"max_attempts": 1}},
    )
    wait_until(lambda: ledger("wait:deaf:1:start"))

    leaving.stop(timeout=1)

    task = task_of(instance_id)
    assert (task.status, task.attempts, task.failures, task.claim_owner) == ("queued", 1, 0, "")
    inst = WorkflowInstance.objects.get(instance_id=instance_id)
    assert (inst.status, inst.lease_owner) == ("running", "")
    marker.unlink()
    wait_until(lambda: ledger("wait:deaf:1:end"))  # the ignored attempt ends: discarded
    make_worker(worker_id="next")
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == "deaf:2"
    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures) == ("completed", 2, 0)


def test_sigterm_keeps_renewing_until_the_attempt_in_flight_is_recorded(
    worker_process: Callable[..., WorkerProcess], marker: Path
) -> None:
    overrides = {"LEASE": SHORT_LEASE, "SHUTDOWN_TIMEOUT": 30}
    proc = worker_process(
        "--worker-id", "proc-drain", env={"SELVEDGE_TEST_OVERRIDES": json.dumps(overrides)}
    )
    instance_id = sv.start_workflow("test.crashable", {"entry": "drain", "hold_while": str(marker)})
    wait_until(lambda: Ledger.objects.filter(entry="started:drain").exists())
    (task,) = ActivityTask.objects.filter(instance_id=instance_id, name="test.slow_record")

    stop_ms = db_now_ms()
    proc.proc.send_signal(signal.SIGTERM)
    read_until(proc, "stopping")
    try:
        wait_until(lambda: renewed_past(task.id, stop_ms + 1500 + 300), timeout=10)
        assert proc.proc.poll() is None  # still finishing the attempt in flight
    finally:
        marker.unlink()
    assert proc.proc.wait(30) == 0

    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures) == ("completed", 1, 0)
    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output == "before+drain"
    assert WorkflowInstance.objects.get(instance_id=instance_id).lease_epoch == 1
