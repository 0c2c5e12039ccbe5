"""The django.tasks backend against Django's documented behaviour (docs/tasks.md).

Runs on Django 6 (django.tasks) and on Django 5.2 with the django-tasks backport; the
module skips when neither is importable. Tasks run under a real in-process Worker;
tests/processes/test_django_tasks_processes.py reads results across processes.
"""

from __future__ import annotations

import asyncio
import importlib.util
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.utils import timezone

from tests.conftest import wait_until

if (
    importlib.util.find_spec("django.tasks") is None
    and importlib.util.find_spec("django_tasks") is None
):
    pytest.skip("neither django.tasks nor the django-tasks backport", allow_module_level=True)

import selvedge_django as sv
from selvedge_django.tasks import SelvedgeBackend, compat
from tests.testapp import tasks

pytestmark = pytest.mark.usefixtures("tdb", "task_calls")

Status = compat.TaskResultStatus


@pytest.fixture
def signals() -> Any:
    """Every django.tasks signal sent in this process: (name, result id, status)."""
    seen: list[tuple[str, str, str]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, task_result.id, str(task_result.status)))

        return receive

    handlers = {
        compat.task_enqueued: receiver("enqueued"),
        compat.task_started: receiver("started"),
        compat.task_finished: receiver("finished"),
    }
    for signal, handler in handlers.items():
        signal.connect(handler, weak=False)
    yield seen
    for signal, handler in handlers.items():
        signal.disconnect(handler)


def finished(result: Any, timeout: float = 20) -> Any:
    """Wait until the result's task has finished; return the refreshed result."""

    def done() -> bool:
        result.refresh()
        return result.is_finished

    wait_until(done, timeout=timeout)
    return result


def test_a_task_runs_under_the_worker_and_reports_success(worker: Any, signals: Any) -> None:
    result = tasks.add.enqueue(2, 3)
    assert result.status == Status.READY
    assert result.backend == "default"
    assert isinstance(result.task.get_backend(), SelvedgeBackend)
    finished(result)
    assert result.status == Status.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert result.attempts == 1
    assert result.worker_ids == [worker.worker_id]
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert tasks.calls == [("add", (2, 3))]
    # The same, read afresh through the task (no replay: the instance and its task rows).
    again = tasks.add.get_result(result.id)
    assert (again.status, again.return_value, again.args) == (Status.SUCCESSFUL, 5, [2, 3])
    # It is an instance of the built-in workflow, visible like any other.
    assert sv.describe(result.id).workflow_name == "selvedge.task"
    [activity] = sv.list_activity_tasks(result.id)
    assert (activity.name, activity.queue, activity.status) == (
        "selvedge.task.run",
        "default",
        "completed",
    )
    # task_finished follows the commit that finished the result, a moment after it.
    wait_until(lambda: ("finished", result.id, "SUCCESSFUL") in signals)
    assert [(name, status) for name, rid, status in signals if rid == result.id] == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]


def test_enqueue_in_a_rolled_back_transaction_runs_nothing(worker: Any, signals: Any) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        doomed = tasks.noted.enqueue("rolled back")
        raise RuntimeError("roll back")
    kept = None
    with transaction.atomic():
        kept = tasks.noted.enqueue("committed")
        # Inside the transaction the task is not enqueued yet: no signal.
        assert not any(name == "enqueued" for name, _, _ in signals)
    finished(kept)
    with pytest.raises(compat.TaskResultDoesNotExist):
        tasks.noted.get_result(doomed.id)
    assert tasks.calls == [("noted", "committed")]
    assert [rid for name, rid, _ in signals if name == "enqueued"] == [kept.id]


def test_a_deferred_task_runs_not_before_run_after(worker: Any) -> None:
    run_after = timezone.now() + timedelta(seconds=1.5)
    result = tasks.noted.using(run_after=run_after).enqueue("later")
    assert result.task.run_after == run_after
    assert tasks.noted.get_result(result.id).status == Status.READY
    finished(result)
    assert result.started_at >= run_after
    assert result.task.run_after == run_after
    assert tasks.calls == [("noted", "later")]


def test_a_failing_task_retries_then_fails_with_every_traceback(worker: Any, signals: Any) -> None:
    result = tasks.always_fails.enqueue("boom")
    finished(result)
    assert result.status == Status.FAILED
    assert result.attempts == 3  # OPTIONS["retry_policy"]["max_attempts"]
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 3
    assert result.errors[-1].exception_class is ValueError
    assert "raise ValueError(message)" in result.errors[-1].traceback
    assert "ValueError: boom" in result.errors[-1].traceback
    assert result.worker_ids == [worker.worker_id] * 3
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert tasks.calls == [("always_fails", "boom")] * 3
    # Started on each attempt; finished once, when the failure is final (and committed).
    wait_until(lambda: ("finished", result.id, "FAILED") in signals)
    mine = [(name, status) for name, rid, status in signals if rid == result.id]
    assert mine == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("started", "RUNNING"),
        ("started", "RUNNING"),
        ("finished", "FAILED"),
    ]


def test_non_retryable_errors_and_a_per_task_policy_stop_at_once(worker: Any) -> None:
    refused = tasks.refuses.enqueue()
    once = tasks.once.enqueue("only once")
    finished(refused)
    finished(once)
    assert (refused.status, refused.attempts) == (Status.FAILED, 1)
    assert refused.errors[0].exception_class_path == "tests.testapp.tasks.Refused"
    assert (once.status, once.attempts) == (Status.FAILED, 1)


def test_a_task_that_succeeds_on_a_retry_keeps_the_earlier_errors(worker: Any) -> None:
    result = tasks.flaky.enqueue(succeed_on=2)
    finished(result)
    assert result.status == Status.SUCCESSFUL
    assert result.return_value == 2  # context.attempt counted the attempts
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"]


def test_async_tasks_and_queues(worker: Any) -> None:
    doubled = tasks.async_double.enqueue(21)
    mail = tasks.send_email.enqueue("ada@example.com", subject="hi")
    finished(doubled)
    finished(mail)
    assert doubled.return_value == 42
    assert mail.return_value == {"to": "ada@example.com", "subject": "hi"}
    [activity] = sv.list_activity_tasks(mail.id)
    assert activity.queue == "emails"


def test_a_worker_without_the_queue_leaves_its_tasks_ready(make_worker: Any) -> None:
    make_worker(activity_queues=["default"])
    mail = tasks.send_email.enqueue("bob@example.com")
    plain = finished(tasks.add.enqueue(1, 1))
    assert plain.status == Status.SUCCESSFUL
    assert tasks.send_email.get_result(mail.id).status == Status.READY


def test_tasks_run_highest_priority_first_then_oldest() -> None:
    from selvedge_django.testing import run_until_idle
    from selvedge_django.worker import Worker

    enqueued = [
        tasks.noted.using(priority=priority).enqueue(label)
        for label, priority in [("low", -10), ("first-0", 0), ("top", 100), ("second-0", 0)]
    ]
    # One attempt at a time: the order of the calls is the order of the claims.
    run_until_idle(Worker(max_concurrent_activities=1))
    # (The two of priority 0 may share their enqueue millisecond: either goes first.)
    order = [value for name, value in tasks.calls if name == "noted"]
    assert (order[0], sorted(order[1:3]), order[3]) == ("top", ["first-0", "second-0"], "low")
    [activity] = sv.list_activity_tasks(enqueued[2].id)
    assert activity.options.priority == 100
    assert sv.describe(enqueued[2].id).priority == 100
    assert tasks.noted.get_result(enqueued[0].id).task.priority == -10


def test_validation_follows_base_task_backend() -> None:
    with pytest.raises(compat.InvalidTask, match="Queue 'nope' is not valid"):
        tasks.add.using(queue_name="nope")
    with pytest.raises(compat.InvalidTask, match="aware datetime"):
        tasks.add.using(run_after=timezone.now().replace(tzinfo=None))
    with pytest.raises(compat.InvalidTask, match="priority"):
        tasks.add.using(priority=101)

    def local() -> None:  # not at module level
        pass

    with pytest.raises(compat.InvalidTask, match="module level"):
        compat.Task(func=local)
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    assert sv.find_instances(workflow_name="selvedge.task").instances == []


def test_get_result_of_an_unknown_or_foreign_id() -> None:
    backend = compat.task_backends["default"]
    with pytest.raises(compat.TaskResultDoesNotExist):
        backend.get_result("no-such-id")
    other = sv.start_workflow("tests.not.a.task", None)
    with pytest.raises(compat.TaskResultDoesNotExist):
        backend.get_result(other)


def test_a_bad_per_task_retry_policy_is_refused_at_definition() -> None:
    with pytest.raises(ValueError, match="unknown keys"):
        SelvedgeBackend.task_class(func=tasks.add.func, retry_policy={"attempts": 3})


def test_system_checks_report_bad_options() -> None:
    backend = SelvedgeBackend(
        "broken",
        {
            "OPTIONS": {
                "retry_policy": {"max_attempts": -1},
                "speed": "fast",
                "task_modules": "myapp.jobs",
            }
        },
    )
    messages = backend.check()
    assert [m.id for m in messages] == ["selvedge.E102"] * 3
    assert "unknown OPTIONS 'speed'" in messages[0].msg
    assert "max_attempts" in messages[1].msg
    assert "task_modules" in messages[2].msg
    assert SelvedgeBackend("fine", {"OPTIONS": {"start_to_close_timeout": 30}}).check() == []


def test_system_check_needs_the_app_installed(settings: Any) -> None:
    settings.INSTALLED_APPS = ["django.contrib.contenttypes"]
    [message] = SelvedgeBackend("default", {}).check()
    assert message.id == "selvedge.E101"


def test_aenqueue_and_aget_result(worker: Any) -> None:
    async def scenario() -> tuple[Any, Any]:
        result = await tasks.add.aenqueue(4, 5)
        while not result.is_finished:
            await asyncio.sleep(0.02)
            await result.arefresh()
        return result, await tasks.add.aget_result(result.id)

    try:
        result, again = asyncio.run(asyncio.wait_for(scenario(), 20))
    finally:
        # The async calls ran on other threads, each with its own connection.
        asyncio.run(sync_to_async(connections.close_all)())
    assert (result.status, result.return_value) == (Status.SUCCESSFUL, 9)
    assert again.return_value == 9


def test_the_checks_run_once_on_either_framework(settings: Any) -> None:
    """Django 6 runs a backend's checks; the backport without its app does not, so the
    app's own check does: either way, selvedge.E102 is reported once."""
    from django.core import checks

    settings.TASKS = {
        **settings.TASKS,
        "broken": {
            "BACKEND": "selvedge_django.tasks.SelvedgeBackend",
            "OPTIONS": {"speed": "fast"},
        },
    }
    found = [m for m in checks.run_checks() if m.id == "selvedge.E102"]
    assert len(found) == 1
    assert "TASKS['broken']" in found[0].msg


def test_task_finished_is_sent_once_the_outcome_is_committed(worker: Any) -> None:
    """A task_finished receiver that reads the result afresh (to notify a user, say)
    sees it finished: the signal follows the commit of the outcome it reports."""
    read: list[tuple[str, str, Any]] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        fresh = task_result.task.get_result(task_result.id)
        read.append((task_result.id, str(fresh.status), fresh.finished_at))

    compat.task_finished.connect(receive, weak=False)
    try:
        good = tasks.add.enqueue(1, 1)
        bad = tasks.refuses.enqueue()
        later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)
        finished(good)
        finished(bad)
        # A terminated task is finished too, by the process that terminated it.
        sv.terminate_workflow(later.id, "not wanted")
        finished(later)
        wait_until(lambda: len(read) == 3)
    finally:
        compat.task_finished.disconnect(receive)
    by_id = {rid: (status, at) for rid, status, at in read}
    assert by_id[good.id] == ("SUCCESSFUL", good.finished_at)
    assert by_id[bad.id] == ("FAILED", bad.finished_at)
    assert by_id[later.id] == ("FAILED", later.finished_at)
    assert None not in (good.finished_at, bad.finished_at, later.finished_at)


def test_enqueue_returns_the_result_as_stored(worker: Any) -> None:
    now = tasks.add.enqueue(1, 2)
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(3, 4)
    with transaction.atomic():
        inside = tasks.noted.enqueue("atomic")
        assert inside == tasks.noted.get_result(inside.id)
    # Read before the worker takes them (a result that moved on differs, of course).
    for result in (now, later):
        stored = result.task.get_result(result.id)
        if stored.status == Status.READY:
            assert result == stored
        assert result.enqueued_at == stored.enqueued_at


def test_system_exit_and_keyboard_interrupt_are_the_tasks_failures(
    worker: Any, signals: Any
) -> None:
    """A task's BaseException is its failure, as in Django's reference backend: its class
    path and traceback, the worker's id, the retry policy; the worker keeps running."""
    exited = tasks.exits.enqueue(3)
    interrupted = tasks.interrupted.enqueue()
    finished(exited)
    finished(interrupted)
    for result, path, line in (
        (exited, "builtins.SystemExit", "raise SystemExit(code)"),
        (interrupted, "builtins.KeyboardInterrupt", "raise KeyboardInterrupt"),
    ):
        assert result.status == Status.FAILED
        assert result.attempts == 3  # retried under OPTIONS["retry_policy"]
        assert [e.exception_class_path for e in result.errors] == [path] * 3
        assert line in result.errors[0].traceback
        assert result.worker_ids == [worker.worker_id] * 3
    assert result.errors[0].exception_class is KeyboardInterrupt
    # The worker is still running.
    assert finished(tasks.add.enqueue(1, 2)).return_value == 3


def test_run_until_idle_records_a_tasks_system_exit_like_the_worker() -> None:
    from selvedge_django.testing import run_until_idle
    from selvedge_django.worker import Worker

    result = tasks.exits.enqueue(1)
    helper = Worker()

    def done() -> bool:
        run_until_idle(helper)  # the task's SystemExit does not reach the test
        result.refresh()
        return result.is_finished  # (each retry waits its backoff first)

    wait_until(done)
    assert result.status == Status.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.SystemExit"] * 3
    assert "" not in result.worker_ids


def test_worker_ids_never_hold_an_empty_string(worker: Any) -> None:
    """An operator's termination is no attempt: the result lists no worker for it."""
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)
    sv.terminate_workflow(later.id, "not wanted")
    done = finished(later)
    assert done.status == Status.FAILED
    assert done.worker_ids == []
    assert done.attempts == 0


def test_an_attempt_past_its_deadline_counts_with_its_worker(settings: Any, worker: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "timed": {
            "BACKEND": "selvedge_django.tasks.SelvedgeBackend",
            "OPTIONS": {"start_to_close_timeout": 0.3, "retry_policy": {"max_attempts": 1}},
        },
    }
    result = finished(tasks.slow.using(backend="timed").enqueue(1.0))
    assert result.status == Status.FAILED
    assert [e.exception_class_path for e in result.errors] == [
        "selvedge_django.exceptions.ActivityTimeoutError"
    ]
    assert result.worker_ids == [worker.worker_id]


def _start_raw_task(path: str, *args: Any) -> str:
    """A selvedge.task instance whose stored input names ``path`` (as a row written by
    someone else, or by older code, would); the engine's default retry policy."""
    import uuid

    from selvedge_django.tasks.runner import start_task

    result_id = uuid.uuid4().hex
    start_task(
        {
            "task": path,
            "args": list(args),
            "kwargs": {},
            "backend": "default",
            "queue_name": "default",
            "priority": 0,
            "options": {},
        },
        instance_id=result_id,
        priority=0,
    )
    return result_id


def test_a_stored_task_of_an_unknown_module_fails_at_once_without_importing_it(
    worker: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    import sys

    marker = tmp_path / "imported"
    (tmp_path / "sv_unregistered_tasks.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\ndef job():\n    return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    unknown = _start_raw_task("sv_unregistered_tasks.job")
    missing = _start_raw_task("sv_no_such_module.job")
    not_a_task = _start_raw_task("subprocess.check_output")
    for result_id in (unknown, missing, not_a_task):
        wait_until(lambda rid=result_id: sv.describe(rid).status != "running")
        assert sv.describe(result_id).status == "failed"
        [activity] = sv.list_activity_tasks(result_id)
        assert activity.attempts == 1  # refused for good at once, not retried
        assert activity.last_error.type == "selvedge_django.tasks.results.UnknownTaskError"
    assert not marker.exists()
    assert "sv_unregistered_tasks" not in sys.modules


def test_a_worker_knows_the_tasks_of_the_modules_in_task_modules(
    worker: Any, tmp_path: Any, monkeypatch: Any, settings: Any
) -> None:
    """Tasks outside an app's tasks.py: the modules listed in OPTIONS["task_modules"] are
    imported by the worker before it runs a task, and their tasks are known. One that
    fails to import stops no other; its tasks fail as its import does, and are retried."""
    import sys

    from selvedge_django.tasks import results

    (tmp_path / "sv_listed_jobs.py").write_text(
        "try:\n    from django.tasks import task\nexcept ImportError:\n"
        "    from django_tasks import task\n\n@task()\ndef double(x):\n    return 2 * x\n"
    )
    (tmp_path / "sv_broken_jobs.py").write_text("raise RuntimeError('broken deploy')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(results, "_task_modules", None)  # a fresh worker process
    settings.TASKS = {
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {"task_modules": ["sv_broken_jobs", "sv_listed_jobs"]},
        }
    }
    try:
        result_id = _start_raw_task("sv_listed_jobs.double", 21)
        broken_id = _start_raw_task("sv_broken_jobs.job")
        wait_until(lambda: sv.describe(result_id).status != "running")
        assert compat.task_backends["default"].get_result(result_id).return_value == 42
        wait_until(lambda: sv.list_activity_tasks(broken_id)[0].failures >= 1)
        [broken] = sv.list_activity_tasks(broken_id)
        assert broken.status != "failed"  # retried: a deploy may fix it
        assert "broken deploy" in str(broken.last_error)
    finally:
        sys.modules.pop("sv_listed_jobs", None)
        sv.terminate_workflow(broken_id, "end of test")
