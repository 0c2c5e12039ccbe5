"""Waits across real processes: SIGKILL at exact crash points, and the testing page's example.

A ``runselvedge worker`` process started with ``SELVEDGE_WAIT_CRASH=<point>``
kills itself with SIGKILL at that point of a ``wait.crash_*`` workflow (see
tests/testapp/workflows/waits.py): right after a timer's reservation committed, inside
the transaction that consumes a signal, or right after it committed. Another
worker, in this process, then takes the expired lease (a ControllableClock moves
the database clock past the lease instead of waiting for it) and replays.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

import selvedge_django as sv
from selvedge_django.conf import get_settings
from selvedge_django.models import HistoryEvent, SignalMessage, TimerSubscription, WorkflowInstance
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import ROOT, WorkerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def clock(tdb: None) -> Iterator[ControllableClock]:
    """A ControllableClock starting now (the crashed worker used the real clock)."""
    clock = ControllableClock(start=timezone.now())
    with override_settings(SELVEDGE={**settings.SELVEDGE, "CLOCK": clock}):
        yield clock
    clock.reset_database_clock()


@pytest.fixture
def crash_worker(
    worker_process: Callable[..., WorkerProcess],
) -> Iterator[Callable[[str], WorkerProcess]]:
    """Start a worker process that SIGKILLs itself at ``point``; wait for it to die."""
    started: list[WorkerProcess] = []

    def start(point: str) -> WorkerProcess:
        # The instance already waits: the worker may reach its crash point before
        # its main thread prints "started".
        proc = worker_process(
            "--worker-id",
            f"crash-{point}",
            env={"SELVEDGE_WAIT_CRASH": point},
            wait_started=False,
        )
        started.append(proc)
        assert proc.proc.wait(30) == -signal.SIGKILL
        return proc

    yield start
    for proc in started:
        if proc.proc.stdout is not None:
            proc.proc.stdout.close()


def take_over(clock: ControllableClock) -> Worker:
    """Move the database clock past the dead worker's lease; return a worker to replay with."""
    inst_rows = WorkflowInstance.objects.exclude(lease_owner="")
    assert all(i.lease_owner.startswith("crash-") for i in inst_rows)
    clock.advance(get_settings().lease.ttl + 1)
    return Worker(activity_queues=[""])


def test_sigkill_between_a_timers_reservation_and_the_suspension_leaves_one_timer(
    clock: ControllableClock, crash_worker: Callable[[str], WorkerProcess]
) -> None:
    instance_id = sv.start_workflow("wait.crash_timer", {"seconds": 60})
    crash_worker("timer_reserved")

    (armed,) = TimerSubscription.objects.filter(instance_id=instance_id)
    (sleep_row,) = HistoryEvent.objects.filter(instance_id=instance_id, command="sleep")
    first_expiry = armed.expires_at
    assert json.loads(sleep_row.reservation or "") == {"expires_at": first_expiry.isoformat()}
    assert sleep_row.data is None
    held = WorkflowInstance.objects.get(instance_id=instance_id)
    assert held.lease_owner == "crash-timer_reserved"  # the suspension never happened

    worker = take_over(clock)
    worker.resumptions.inline = True
    assert worker.dispatcher.run_once() == 1  # replays new_timer, then suspends in get()
    (still,) = TimerSubscription.objects.filter(instance_id=instance_id)
    assert (still.id, still.expires_at) == (armed.id, first_expiry)
    held.refresh_from_db()
    assert (held.lease_owner, held.runnable, held.lease_epoch) == ("", False, 2)

    clock.advance(60)
    run_until_idle(worker)
    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output == first_expiry.isoformat()
    assert HistoryEvent.objects.filter(instance_id=instance_id, command="sleep").count() == 1


@pytest.mark.parametrize("point", ["receive_mid_commit", "receive_committed"])
def test_a_receive_killed_in_or_after_its_commit_neither_loses_nor_double_consumes(
    clock: ControllableClock, crash_worker: Callable[[str], WorkerProcess], point: str
) -> None:
    instance_id = sv.start_workflow("wait.crash_receive", None)
    sv.signal(instance_id, "c", "s1")
    sv.signal(instance_id, "c", "s2")
    crash_worker(point)

    first, second = SignalMessage.objects.filter(instance_id=instance_id).order_by("id")
    receives = HistoryEvent.objects.filter(instance_id=instance_id, command="receive")
    if point == "receive_mid_commit":
        # The consuming transaction never committed: nothing consumed, nothing recorded.
        assert (first.consumed_seq, second.consumed_seq) == (None, None)
        assert not receives.exists()
    else:
        assert (first.consumed_seq, second.consumed_seq) == (1, None)
        assert [json.loads(r.data or "") for r in receives] == ["s1"]

    run_until_idle(take_over(clock))

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output == ["s1", "s2"]
    recorded = list(receives.order_by("seq"))
    assert [(r.seq, json.loads(r.data or "")) for r in recorded] == [(1, "s1"), (2, "s2")]
    first.refresh_from_db()
    second.refresh_from_db()
    assert [(s.consumed_seq, s.consumed_key) for s in (first, second)] == [
        (1, recorded[0].key),
        (2, recorded[1].key),
    ]


def _testing_page_example() -> str:
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    # The complete test module: the first example that defines tests (a settings snippet
    # comes before it).
    for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
        if "\ndef test_" in block:
            return str(block)
    raise AssertionError("docs/testing.md has no complete test module")


def test_the_testing_pages_example_runs_under_pytest(tdb: None, tmp_path: Path) -> None:
    module = tmp_path / "test_readme_example.py"
    module.write_text(_testing_page_example(), encoding="utf-8")
    run_id = f"{os.getpid()}_readme"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SELVEDGE_TEST_SUBPROCESS", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT),
        SELVEDGE_RUN_ID=run_id,  # its own test database, created and dropped by pytest-django
        SELVEDGE_PG_TEST_NAME=f"test_selvedge_{run_id}",
        SELVEDGE_TEST_DB=connection.vendor.replace("postgresql", "postgres"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(module)],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    output: Any = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert re.search(r"\b3 passed\b", output), output
