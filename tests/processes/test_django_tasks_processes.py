"""django.tasks tasks run by real ``runselvedge worker`` processes, read from this one.

The worker processes import the tasks by their module path when they run them; this
process enqueues and reads results only (no worker of its own).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import WorkerProcess, wait_until

if (
    importlib.util.find_spec("django.tasks") is None
    and importlib.util.find_spec("django_tasks") is None
):
    pytest.skip("neither django.tasks nor the django-tasks backport", allow_module_level=True)

import selvedge_django as sv
from selvedge_django.models import HistoryEvent
from selvedge_django.tasks import compat
from selvedge_django.testing import FAULT_EXIT_STATUS, FaultInjector
from tests.testapp import tasks

Status = compat.TaskResultStatus
# A killed worker's claim and leadership lapse within seconds.
SHORT_LEASE = {"TTL": 1.0, "RENEW_INTERVAL": 0.25, "MARGIN": 0.25, "MAX_SKEW": 0.1}


def finished(task: Any, result_id: str) -> Any:
    def done() -> Any:
        result = task.get_result(result_id)
        return result if result.is_finished else None

    return wait_until(done, timeout=40)


def test_results_are_read_across_processes(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    ok = tasks.add.enqueue(20, 22)
    failing = tasks.always_fails.enqueue("in another process")
    worker_process("--worker-id", "tasks-proc-a")
    worker_process("--worker-id", "tasks-proc-b")

    done = finished(tasks.add, ok.id)
    assert (done.status, done.return_value) == (Status.SUCCESSFUL, 42)
    assert done.worker_ids[0] in {"tasks-proc-a", "tasks-proc-b"}
    assert done.started_at is not None and done.finished_at >= done.started_at

    failed = finished(tasks.always_fails, failing.id)
    assert failed.status == Status.FAILED
    assert failed.attempts == 3
    assert set(failed.worker_ids) <= {"tasks-proc-a", "tasks-proc-b"}
    assert all("ValueError: in another process" in e.traceback for e in failed.errors)
    # Nothing ran in this process.
    assert tasks.calls == []


def test_an_attempt_lost_with_its_worker_counts_with_its_worker_id_and_keeps_earlier_errors(
    worker_process: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """A worker killed during attempt 2: the result lists three attempts, the first two
    by the killed worker (its failure, then the lapse of its claim) and the third by the
    worker that took over; the first attempt's error is kept."""
    overrides = {"LEASE": SHORT_LEASE, "LEADER_LEASE_DURATION": 2, "LEADER_HEARTBEAT_INTERVAL": 0.5}
    short = {"SELVEDGE_TEST_OVERRIDES": json.dumps(overrides)}
    result = tasks.lost_once.enqueue(str(tmp_path))
    doomed = worker_process("--worker-id", "tasks-doomed", env=short)
    wait_until(lambda: list(tmp_path.glob("attempt-2-*")), timeout=40)
    doomed.kill()
    doomed.proc.wait(10)
    worker_process("--worker-id", "tasks-survivor", env=short)
    done = finished(tasks.lost_once, result.id)
    assert (done.status, done.return_value) == (Status.SUCCESSFUL, 3)
    assert done.attempts == 3
    assert done.worker_ids == ["tasks-doomed", "tasks-doomed", "tasks-survivor"]
    assert [e.exception_class_path.rsplit(".", 1)[-1] for e in done.errors] == [
        "RuntimeError",
        "ActivityTimeoutError",
    ]
    assert "attempt 1 fails" in done.errors[0].traceback


def test_a_worker_exiting_right_after_the_closing_completion_leaves_the_task_done_once(
    worker_process: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """The completion that closes the task's instance committed: the task is finished,
    with its value, and nothing runs it again."""
    faults = FaultInjector()
    faults.exit_after_commit(operation="complete_closing")
    result = tasks.marked.enqueue(str(tmp_path))
    # It may reach its crash point before it prints that it started: not waited for.
    doomed = worker_process("--worker-id", "tasks-doomed", env=faults.to_env(), wait_started=False)
    assert doomed.proc.wait(40) == FAULT_EXIT_STATUS, doomed.output()
    done = tasks.marked.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == (Status.SUCCESSFUL, "done", 1)
    assert sv.get_workflow_result(result.id).status == "completed"
    assert len(list(tmp_path.glob("run-*"))) == 1
    sv.replay_instance(result.id)


def test_a_worker_exiting_inside_the_closing_completion_leaves_the_task_to_run_again(
    worker_process: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """The process ends before the completion's last statement: nothing of it commits
    (the task is still claimed, the instance still running); the claim lapses and the
    next worker runs the task again (the lapse is one failure), and closes it."""
    overrides = {"LEASE": SHORT_LEASE, "LEADER_LEASE_DURATION": 2, "LEADER_HEARTBEAT_INTERVAL": 0.5}
    short = {"SELVEDGE_TEST_OVERRIDES": json.dumps(overrides)}
    faults = FaultInjector()
    faults.exit_at_statement("INSERT INTO", operation="complete_closing")
    result = tasks.marked.enqueue(str(tmp_path))
    # It may reach its crash point before it prints that it started: not waited for.
    doomed = worker_process(
        "--worker-id", "tasks-doomed", env={**short, **faults.to_env()}, wait_started=False
    )
    assert doomed.proc.wait(40) == FAULT_EXIT_STATUS, doomed.output()
    assert sv.describe(result.id).status == "running"
    events = HistoryEvent.objects.filter(instance_id=result.id).values_list("event_type", flat=True)
    assert list(events) == ["Reserved"]
    worker_process("--worker-id", "tasks-survivor", env=short)
    done = finished(tasks.marked, result.id)
    assert (done.status, done.return_value, done.attempts) == (Status.SUCCESSFUL, "done", 2)
    assert done.worker_ids == ["tasks-doomed", "tasks-survivor"]
    assert [e.exception_class_path.rsplit(".", 1)[-1] for e in done.errors] == [
        "ActivityTimeoutError"
    ]
    assert len(list(tmp_path.glob("run-*"))) == 2
    sv.replay_instance(result.id)
