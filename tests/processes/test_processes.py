"""End to end: real ``manage.py runselvedge worker`` processes, killed and terminated.

The workers share the test database with this process (the SQLite file, or the
PostgreSQL test database); the activities they run write Ledger rows, which is
how the tests see inside them.
"""

from __future__ import annotations

import json
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import selvedge_django as sv
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Ledger


def ledger_count(entry: str) -> int:
    return Ledger.objects.filter(entry=entry).count()


def read_until(proc: WorkerProcess, needle: str, timeout: float = 30) -> str:
    """Read the worker's output until a line contains ``needle``; fail after ``timeout``."""
    seen: list[str] = []
    found = threading.Event()

    def reader() -> None:
        stream = proc.proc.stdout
        assert stream is not None
        for line in stream:
            seen.append(line)
            if needle in line:
                found.set()
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    if not found.wait(timeout):
        raise AssertionError(f"worker never printed {needle!r}; output so far: {''.join(seen)}")
    return "".join(seen)


def nothing_held() -> bool:
    return (
        not WorkflowInstance.objects.exclude(lease_owner="").exists()
        and not ActivityTask.objects.exclude(claim_owner="").filter(status="running").exists()
    )


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def test_sigkill_during_an_activity_then_another_process_finishes_the_workflow(
    worker_process: Callable[..., WorkerProcess], marker: Path
) -> None:
    first = worker_process("--worker-id", "proc-a")
    instance_id = sv.start_workflow("test.crashable", {"entry": "crash", "hold_while": str(marker)})
    wait_until(lambda: ledger_count("started:crash") == 1)
    first.kill()
    marker.unlink()

    # The dead process still owns the lease and the claim until they expire.
    inst = WorkflowInstance.objects.get(instance_id=instance_id)
    assert (inst.status, inst.lease_owner) == ("running", "proc-a")
    slow = ActivityTask.objects.get(instance_id=instance_id, name="test.slow_record")
    assert (slow.status, slow.claim_owner, slow.attempts) == ("running", "proc-a", 1)
    assert HistoryEvent.objects.get(instance_id=instance_id, key=slow.key).data is None

    second = worker_process("--worker-id", "proc-b")
    result = sv.wait_workflow(instance_id, timeout=40)

    assert result.status == "completed", result.error
    assert result.output == "before+crash"
    rows = list(
        HistoryEvent.objects.filter(instance_id=instance_id, command="activity").order_by("seq")
    )
    assert [(r.key, json.loads(r.data)) for r in rows] == [
        (rows[0].key, "before"),
        (slow.key, "crash"),
    ]
    assert HistoryEvent.objects.filter(instance_id=instance_id, key="$close").count() == 1
    # History is exactly once; the activity body is at least once: it started twice.
    assert ledger_count("before") == 1
    assert ledger_count("started:crash") == 2
    slow.refresh_from_db()
    assert (slow.status, slow.attempts, slow.claim_owner) == ("completed", 2, "proc-b")
    inst.refresh_from_db()
    # proc-b took the expired lease (epoch 2); if that happened before the claim expired,
    # the execution suspended and the activity's arrival dispatched it once more.
    assert inst.lease_epoch in (2, 3)
    assert second.terminate() == 0


def test_two_processes_racing_complete_every_workflow_exactly_once(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    procs = [worker_process("--worker-id", f"racer-{n}") for n in range(2)]
    inputs = {
        sv.start_workflow("test.sum3", {"a": i, "b": 2 * i, "c": 1}): 3 * i + 1 for i in range(100)
    }

    def all_closed() -> bool:
        return not WorkflowInstance.objects.filter(
            instance_id__in=list(inputs), status="running"
        ).exists()

    wait_until(all_closed, timeout=90, interval=0.2)

    instances = {i.instance_id: i for i in WorkflowInstance.objects.filter(instance_id__in=inputs)}
    assert {i.status for i in instances.values()} == {"completed"}
    assert {iid: json.loads(i.output) for iid, i in instances.items()} == inputs
    # A lease lost to a slow renewal on a loaded machine may be taken over (a higher
    # epoch); the fence keeps the history exactly once, which is what is checked here.
    closes = Counter(
        HistoryEvent.objects.filter(instance_id__in=inputs, key="$close").values_list(
            "instance_id", flat=True
        )
    )
    assert closes == Counter(dict.fromkeys(inputs, 1))
    activity_rows = HistoryEvent.objects.filter(instance_id__in=inputs, command="activity")
    per_instance = Counter(activity_rows.values_list("instance_id", flat=True))
    assert per_instance == Counter(dict.fromkeys(inputs, 3))
    assert not activity_rows.filter(data__isnull=True).exists()
    assert set(activity_rows.values_list("event_type", flat=True)) == {"ActivityCompleted"}
    tasks = ActivityTask.objects.filter(instance_id__in=inputs)
    assert tasks.count() == 300
    assert set(tasks.values_list("status", flat=True)) == {"completed"}
    owners = Counter(tasks.values_list("claim_owner", flat=True))
    assert set(owners) <= {"racer-0", "racer-1"}
    assert [p.terminate() for p in procs] == [0, 0]
    assert nothing_held()


def test_sigterm_stops_a_heartbeating_attempt_releases_it_and_exits_0(
    worker_process: Callable[..., WorkerProcess], marker: Path
) -> None:
    proc = worker_process("--worker-id", "proc-term")
    instance_id = sv.start_workflow(
        "test.hold_then_record", {"entry": "term", "hold_while": str(marker)}
    )
    wait_until(lambda: ledger_count("started:term") == 1)
    assert WorkflowInstance.objects.get(instance_id=instance_id).lease_owner == "proc-term"

    # The attempt is told to stop at once (heartbeat() raises), so the worker exits
    # without waiting for the marker; the released claim used no retry budget.
    assert proc.terminate(timeout=30) == 0

    assert ledger_count("done:term") == 0
    inst = WorkflowInstance.objects.get(instance_id=instance_id)
    assert (inst.status, inst.lease_owner) == ("running", "")
    assert nothing_held()
    (hold_task,) = ActivityTask.objects.filter(instance_id=instance_id)
    assert (hold_task.name, hold_task.status, hold_task.attempts, hold_task.failures) == (
        "test.hold",
        "queued",
        1,
        0,
    )

    marker.unlink()
    successor = worker_process("--worker-id", "proc-next")
    result = sv.wait_workflow(instance_id, timeout=30)
    assert result.status == "completed", result.error
    assert result.output == "term+after:term"
    assert ledger_count("started:term") == 2
    assert ledger_count("done:term") == 1
    assert successor.terminate() == 0  # idle: exits at once
    assert nothing_held()


def test_a_second_signal_exits_at_once_without_waiting_for_work_in_flight(
    worker_process: Callable[..., WorkerProcess], marker: Path
) -> None:
    proc = worker_process("--worker-id", "proc-twice")
    instance_id = sv.start_workflow(
        "test.hold_then_record", {"entry": "twice", "hold_while": str(marker)}
    )
    wait_until(lambda: ledger_count("started:twice") == 1)

    proc.proc.send_signal(signal.SIGINT)
    read_until(proc, "stopping")
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(30) == 1
    # The attempt never finished: the lease and the claim stay with the dead
    # worker until they expire, like after a crash.
    assert ledger_count("done:twice") == 0
    assert WorkflowInstance.objects.get(instance_id=instance_id).status == "running"


def test_sigterm_on_an_idle_worker_exits_0(worker_process: Callable[..., WorkerProcess]) -> None:
    proc = worker_process()
    assert proc.terminate(timeout=20) == 0
    assert "stopped" in proc.output()
