"""django-tasks-db's own test suite, run against SelvedgeBackend.

The suite (``tests/tests.py`` of the django-tasks-db source distribution, the file
that ``DJANGO_TASKS_DB_TESTS`` names; ``scripts/conformance`` downloads it) is loaded
with these changes, and nothing else:

- its task module (not in the distribution) is this folder's ``tasks`` module;
- every backend it configures, ``django_tasks_db.DatabaseBackend``, is
  SelvedgeBackend, with ``{"max_attempts": 1}`` (django-tasks-db runs a task once;
  a batch worker that returned while a retry waits would leave it READY), and the
  name ``DatabaseBackend`` it checks instances and signal senders against is
  SelvedgeBackend;
- ``assertNumQueries(n)`` checks nothing (the number of statements is the
  library's own; the rest of each such test runs);
- its worker runs are SelvedgeBackend's worker: ``call_command("db_worker",
  batch=True, ...)`` runs a Worker's loops in the test's thread until nothing is left
  to do (``run_until_idle``), on the queues asked for; a worker process is
  ``runselvedge worker``, and ``db_worker --batch`` is ``tests.conformance.batch``.

The tests left out (``EXCLUDED``) check the library itself rather than the backend:
its table (``DBTaskResult``), its log and command messages, its management
commands' options, its admin and its own helpers. Run it with ``scripts/conformance``;
under any other settings the module skips.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import types
import unittest
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

SOURCE = os.environ.get("DJANGO_TASKS_DB_TESTS", "")
if "django_tasks_db" not in settings.INSTALLED_APPS:
    pytest.skip("run by scripts/conformance (tests.conformance.settings)", allow_module_level=True)
if not SOURCE or not Path(SOURCE).is_file():
    pytest.skip(
        "DJANGO_TASKS_DB_TESTS names no file (scripts/conformance)", allow_module_level=True
    )

from selvedge_django.tasks import SelvedgeBackend, compat  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
THE_BACKEND = '"BACKEND": "selvedge_django.tasks.SelvedgeBackend"'
RUN_ONCE = '"OPTIONS": {"retry_policy": {"max_attempts": 1}}'

# (text, replacement, how many times the text occurs in the suite)
CHANGES = [
    (
        "from tests import tasks as test_tasks",
        "from tests.conformance import tasks as test_tasks",
        1,
    ),
    (
        '"BACKEND": "django_tasks_db.DatabaseBackend",\n',
        f"{THE_BACKEND}, {RUN_ONCE},\n",
        None,
    ),
]

_TABLE = "reads or writes django-tasks-db's table (DBTaskResult) or its query set"
_COMMAND = "db_worker's or prune_db_task_results' command-line options and messages"
EXCLUDED: dict[str, str] = {
    # DatabaseBackendTestCase
    "test_refresh_result": _TABLE,
    "test_refresh_result_async": _TABLE,
    # (and, of the same names, DatabaseBackendWorkerTestCase's: rows written by hand)
    "test_invalid_task_path": _TABLE + " (a row written by hand)",
    "test_missing_task_path": _TABLE + " (a row written by hand)",
    "test_task_name": _TABLE,
    "test_database_backend_app_missing": "expects django_tasks_db in the check's hint",
    "test_priority_range_check": _TABLE + " (its CHECK constraints)",
    "test_doesnt_wait_until_transaction_commit": _TABLE,
    "test_enqueue_logs": "django-tasks-db's log message for an enqueue",
    "test_index_scan_for_ready": _TABLE + " (its index)",
    "test_run_after_tz": _TABLE,
    "test_run_after_null_0016_migration": _TABLE + " (its migration 0016)",
    "test_custom_id_function": "django-tasks-db's OPTIONS['id_function']",
    "test_unknown_id_function": "django-tasks-db's OPTIONS['id_function']",
    "test_postgres_db_id_function": "django-tasks-db's OPTIONS['id_function']",
    "test_postgres_id_function_expression": "django-tasks-db's OPTIONS['id_function']",
    # DatabaseBackendWorkerTestCase
    "test_run_enqueued_task": _TABLE,
    "test_batch_processes_all_tasks": _TABLE,
    "test_doesnt_process_different_queue": _TABLE,
    "test_process_all_queues": _TABLE,
    "test_process_all_queues_excluding_one_queue": _TABLE + " (and db_worker --exclude-queues)",
    "test_exclude_queues_requires_processing_all_queues": _COMMAND,
    "test_complex_return_value": (
        "expects json.dumps's message for a value that is not JSON ('is not JSON"
        " serializable'); Django's normalize_json, which SelvedgeBackend applies as Django's"
        " own backends do, raises the same TypeError as 'Unsupported type'"
    ),
    "test_excluding_unknown_queue_processes_selected_queues": _TABLE,
    "test_failing_task": _TABLE,
    "test_complex_exception": _TABLE,
    "test_doesnt_process_different_backend": _TABLE,
    "test_unknown_backend": _COMMAND,
    "test_incorrect_backend": _COMMAND,
    "test_negative_interval": _COMMAND,
    "test_infinite_interval": _COMMAND,
    "test_fractional_interval": _COMMAND,
    "test_zero_interval": _COMMAND,
    "test_negative_max_tasks": _COMMAND,
    "test_zero_max_tasks": _COMMAND,
    "test_too_long_worker_id": _COMMAND,
    "test_empty_worker_id": _COMMAND,
    "test_run_after": _TABLE,
    "test_run_after_priority": _TABLE + " (its ordering)",
    "test_verbose_logging": "db_worker's log lines",
    "test_worker_with_locked_rows": _TABLE + " (locks its rows)",
    "test_max_tasks": _COMMAND + " (--max-tasks and its message)",
    "test_task_import_string": _TABLE + " (a row written by hand)",
    # DatabaseTaskResultTestCase, ConnectionExclusiveTranscationTestCase
    "test_cross_connection": _TABLE,
    "test_locks_tasks": _TABLE,
    "test_locks_tasks_sqlite": _TABLE,
    "test_locks_tasks_filtered": _TABLE,
    "test_locks_tasks_filtered_sqlite": _TABLE,
    "test_lock_no_rows": _TABLE,
    "test_get_locked_with_locked_rows": _TABLE,
    "test_exclusive_transaction": "django-tasks-db's exclusive_transaction helper",
    # DatabaseBackendPruneTaskResultsTestCase: its prune command on its table (and its
    # test_unknown_backend and test_incorrect_backend, like db_worker's: _COMMAND)
    "test_prunes_tasks": _TABLE,
    "test_doesnt_prune_new_tasks": _TABLE,
    "test_doesnt_prune_running_tasks": _TABLE,
    "test_only_prunes_specified_queue": _TABLE,
    "test_prune_all_queues": _TABLE,
    "test_min_age": _TABLE,
    "test_failed_min_age": _TABLE,
    "test_failed_min_age_zero": _TABLE,
    "test_dry_run": _TABLE,
    "test_negative_age": _COMMAND,
    # DatabaseWorkerProcessTestCase
    "test_interrupt_signals": _TABLE + " (worker_ids read from its rows)",
    "test_repeat_ctrl_c": _TABLE + " (worker_ids read from its rows)",
    "test_multiple_workers": "db_worker's output lines",
    # DBTaskResultOrderingTestCase, AdminTestCase
    "test_higher_priority_tasks_come_first": _TABLE + " (its ordering)",
    "test_earlier_run_after_comes_first_given_same_priority": _TABLE + " (its ordering)",
    "test_earlier_enqueued_at_comes_first_given_same_priority_and_run_after": _TABLE,
    "test_display_run_after_returns_empty_for_date_max_or_none": "django-tasks-db's admin",
    "test_display_run_after_returns_db_value": "django-tasks-db's admin",
}


def _load() -> types.ModuleType:
    text = Path(SOURCE).read_text()
    for old, new, count in CHANGES:
        found = text.count(old)
        if found == 0 or (count is not None and found != count):
            raise RuntimeError(f"the suite changed: {old!r} found {found} times")
        text = text.replace(old, new)
    module = types.ModuleType("tests.conformance.django_tasks_db_suite")
    module.__file__ = SOURCE
    sys.modules[module.__name__] = module
    exec(compile(text, SOURCE, "exec"), module.__dict__)
    module.DatabaseBackend = SelvedgeBackend  # type: ignore[attr-defined]
    return module


def run_worker(
    *,
    worker_id: str,
    queue_name: str = "default",
    backend_name: str = "default",
    **options: Any,
) -> None:
    """``db_worker --batch`` on SelvedgeBackend: the worker's loops, in this thread, until
    nothing is left to do. A backend that is not SelvedgeBackend runs nothing."""
    from selvedge_django.testing import run_until_idle
    from selvedge_django.worker import Worker

    if not isinstance(compat.task_backends[backend_name], SelvedgeBackend):
        return
    queues = None if queue_name == "*" else queue_name.split(",")
    run_until_idle(Worker(worker_id=worker_id, activity_queues=queues))


def start_worker(
    self: Any, args: list[str] | None = None, *, debug: bool = False, worker_id: str | None = None
) -> subprocess.Popen[str]:
    """A worker process on the test database: ``runselvedge worker``, or with
    ``--batch`` the batch runner, which exits once nothing is left to do."""
    from django.db import connection
    from django.utils.crypto import get_random_string

    worker_id = worker_id or get_random_string(32)
    if "--batch" in (args or []):
        command = [sys.executable, "-m", "tests.conformance.batch", "--worker-id", worker_id]
    else:
        command = [
            sys.executable,
            "-m",
            "django",
            "runselvedge",
            "worker",
            "--worker-id",
            worker_id,
        ]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.conformance.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": str(ROOT),
    }
    if connection.vendor == "postgresql":
        env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    process = subprocess.Popen(
        command,
        cwd=str(ROOT),
        env=env,
        stdout=None if debug else subprocess.PIPE,
        stderr=None if debug else subprocess.STDOUT,
        text=True,
    )
    self.processes.append(process)
    if "--batch" not in (args or []):
        _wait_until_up(process, worker_id)
    return process


# How long a worker process may take to start (Django set up, the registry loaded).
WORKER_START_DEADLINE_S = 60.0


def _wait_until_up(process: subprocess.Popen[str], worker_id: str) -> None:
    """Return once the worker has written its heartbeat row, which it does when it starts.

    The suite's tests sleep ``WORKER_STARTUP_TIME`` (one second) after starting a
    worker and expect it to have claimed the task by then, which ``db_worker`` does;
    a ``runselvedge worker`` process first sets Django up and loads the registry, which
    took longer than that on a loaded machine (``test_kill`` saw the task still
    ready). Waiting for the worker to be up keeps the suite's second for the claim."""
    from selvedge_django.models import WorkerHeartbeat

    deadline = time.monotonic() + WORKER_START_DEADLINE_S
    while not WorkerHeartbeat.objects.filter(worker_id=worker_id).exists():
        if process.poll() is not None:
            return  # exited: the test sees what it left
        if time.monotonic() > deadline:
            raise AssertionError(f"worker {worker_id} not up after {WORKER_START_DEADLINE_S} s")
        time.sleep(0.02)


def _any_number_of_queries(self: Any, num: int, *args: Any, **kwargs: Any) -> Any:
    """``assertNumQueries`` checks nothing here: the number is django-tasks-db's own."""
    return contextlib.nullcontext()


def _skip(cls: type, name: str, reason: str) -> None:
    setattr(cls, name, unittest.skip(f"excluded: {reason}")(getattr(cls, name)))


suite = _load()
suite.DatabaseBackendWorkerTestCase.run_worker = staticmethod(  # type: ignore[attr-defined]
    partial(run_worker, worker_id=suite.DatabaseBackendWorkerTestCase.worker_id)  # type: ignore[attr-defined]
)
suite.DatabaseWorkerProcessTestCase.start_worker = start_worker  # type: ignore[attr-defined]
_their_teardown = suite.DatabaseWorkerProcessTestCase.tearDown  # type: ignore[attr-defined]


def _teardown(self: Any) -> None:
    """Theirs (kill what still runs), then close the pipes it leaves open."""
    _their_teardown(self)
    for process in self.processes:
        if process.stdout is not None:
            process.stdout.close()


suite.DatabaseWorkerProcessTestCase.tearDown = _teardown  # type: ignore[attr-defined]

# CONFORMANCE_RUN_EXCLUDED=1 runs the excluded tests too (to look at them).
ALL_EXCLUDED = os.environ.get("CONFORMANCE_RUN_EXCLUDED") != "1"


def _test_cases() -> dict[str, type]:
    """The suite's TestCase classes, each test of EXCLUDED skipped with its reason."""
    found = {}
    for name, value in vars(suite).items():
        if not (isinstance(value, type) and issubclass(value, unittest.TestCase)):
            continue
        if value.__module__ != suite.__name__:
            continue
        value.assertNumQueries = _any_number_of_queries  # type: ignore[attr-defined]
        for test in [n for n in vars(value) if n.startswith("test")]:
            reason = EXCLUDED.get(test)
            if reason is not None and ALL_EXCLUDED:
                _skip(value, test, reason)
        found[name] = value
    return found


# Collected from this module's namespace, under the suite's own class names.
globals().update(_test_cases())
