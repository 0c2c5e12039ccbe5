"""Activity retries and queues across real ``manage.py runselvedge worker`` processes.

The processes share the test database with this process; they see the real
database clock (no test offset), so the backoff here is real time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.models import ActivityTask, WorkflowInstance
from selvedge_django.storage import store_for
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Ledger

BACKOFF = 5.0  # long enough for a new worker process to start within it


def db_now_ms() -> int:
    return store_for("default", Codec()).now_ms()


def entries(prefix: str) -> list[str]:
    return sorted(Ledger.objects.filter(entry__startswith=prefix).values_list("entry", flat=True))


def test_sigkill_during_backoff_resumes_the_retry_at_its_recorded_time(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    first = worker_process("--worker-id", "backoff-a")
    policy = {"max_attempts": 3, "initial_interval": BACKOFF, "max_interval": BACKOFF}
    instance_id = sv.start_workflow(
        "act.run",
        {
            "activity": "act.step",
            "input": {"tag": "kill", "fail_until": 2},
            "options": {"retry_policy": policy},
        },
    )

    def backing_off() -> ActivityTask | None:
        task = ActivityTask.objects.filter(instance_id=instance_id).first()
        suspended = WorkflowInstance.objects.filter(instance_id=instance_id, lease_owner="")
        if task is None or task.failures != 1 or task.status != "queued":
            return None
        return task if suspended.exists() else None

    task = wait_until(backing_off)
    due_ms = task.not_before_ms
    assert due_ms - db_now_ms() > 1000  # still inside the backoff
    first.kill()  # SIGKILL: no cleanup at all

    second = worker_process("--worker-id", "backoff-b")
    assert db_now_ms() < due_ms, "the second worker started after the due time"
    result = sv.wait_workflow(instance_id, timeout=40)

    assert result.status == "completed", result.error
    assert result.output["attempt"] == 2
    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures, task.claim_owner) == (
        "completed",
        2,
        1,
        "backoff-b",
    )
    # The retry ran at its recorded time, not sooner, although a worker was idle before it.
    assert due_ms <= task.claim_started_ms < due_ms + 5000
    assert entries("step:kill") == ["step:kill:1", "step:kill:2"]
    assert second.terminate() == 0


def test_queues_option_restricts_a_worker_process(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    proc = worker_process("--worker-id", "queues-a", "--queues", "proc-q, proc-r")
    elsewhere = sv.start_workflow(
        "act.run",
        {"activity": "act.step", "input": {"tag": "pq-no"}, "options": {"queue": "proc-s"}},
    )
    served = sv.start_workflow(
        "act.run",
        {"activity": "act.step", "input": {"tag": "pq-yes"}, "options": {"queue": "proc-r"}},
    )
    result = sv.wait_workflow(served, timeout=40)
    wait_until(
        lambda: (
            ActivityTask.objects.filter(instance_id=elsewhere).exists()
            and WorkflowInstance.objects.get(instance_id=elsewhere).lease_owner == ""
        )
    )

    assert result.status == "completed", result.error
    assert result.output["options"]["queue"] == "proc-r"
    task = ActivityTask.objects.get(instance_id=elsewhere)
    # The workflow ran (and reserved its task) but the attempt, inline or not, did not.
    assert (task.queue, task.status, task.attempts) == ("proc-s", "queued", 0)
    assert entries("step:pq") == ["step:pq-yes:1"]
    assert proc.terminate() == 0


def test_heartbeat_details_survive_a_killed_worker_and_reach_the_next_attempt(
    worker_process: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    # Attempt 1 heartbeats {"attempt": 1, "beats": k} in a worker process that is then
    # SIGKILLed; its claim lapses (heartbeat timeout) and attempt 2, in another process,
    # is handed the last details a renewal of the dead worker stored.
    marker = tmp_path / "hold"
    marker.touch()
    first = worker_process("--worker-id", "hb-a")
    iid = sv.start_workflow(
        "act.run",
        {
            "activity": "act.wait",
            "input": {"tag": "hbk", "hold_while": str(marker), "hold_on": [1], "details": True},
            "options": {"heartbeat_timeout": 2, "retry_policy": {"max_attempts": 3}},
        },
    )

    def stored_beats() -> int:
        task = ActivityTask.objects.filter(instance_id=iid).first()
        details = json.loads(task.heartbeat_details) if task and task.heartbeat_details else {}
        return int(details.get("beats", 0))

    wait_until(lambda: stored_beats() >= 2)  # stored by at least two renewals
    first.kill()
    beats = stored_beats()  # (a commit the kill cut short may still land: at least these)
    second = worker_process("--worker-id", "hb-b")
    result = sv.wait_workflow(iid, timeout=40)
    assert (result.status, result.output) == ("completed", "hbk:2"), result.error
    (entry,) = Ledger.objects.filter(entry__startswith="wait:hbk:2:from:")
    handed = json.loads(entry.entry.removeprefix("wait:hbk:2:from:"))
    assert handed["attempt"] == 1 and handed["beats"] >= beats >= 2
    task = ActivityTask.objects.get(instance_id=iid)
    assert (task.attempts, task.claim_owner) == (2, "hb-b")
    assert second.terminate() == 0
