"""django.tasks tasks run by real ``runselvedge worker`` processes, read from this one.

The worker processes import the tasks by their module path when they run them; this
process enqueues and reads results only (no worker of its own).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import WorkerProcess, wait_until

if (
    importlib.util.find_spec("django.tasks") is None
    and importlib.util.find_spec("django_tasks") is None
):
    pytest.skip("neither django.tasks nor the django-tasks backport", allow_module_level=True)

from selvedge_django.tasks import compat
from tests.testapp import tasks

Status = compat.TaskResultStatus


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
