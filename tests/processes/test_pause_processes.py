"""Pausing with real worker processes: restarts, two workers, NOTIFY, and crash points.

A paused queue and a paused instance are rows in the database: a worker started
after the pause, or restarted during it, leaves them alone like the one that saw
the pause. A worker hears of a queue's pause and unpause at once on PostgreSQL
(NOTIFY) and within ``ACTIVITY_POLL_INTERVAL`` on SQLite. A client process that
exits inside a pause or an unpause (just before its last statement, or right
after its commit) leaves the instance exactly as before or exactly paused
(unpaused), never half: its tasks and timers held with it or not at all.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

import selvedge_django as sv
from selvedge_django.models import ActivityTask, TimerSubscription, WorkflowInstance
from selvedge_django.testing import FAULT_EXIT_STATUS, FaultInjector, run_until_idle
from selvedge_django.worker import Worker
from tests.processes.test_crash_matrix_recovery import last_step, runselvedge

QUIET = {"run_local_starts": False}


def overrides(**settings: Any) -> dict[str, str]:
    return {"SELVEDGE_TEST_OVERRIDES": json.dumps(settings)}


def status(instance_id: str) -> str:
    return str(WorkflowInstance.objects.get(instance_id=instance_id).status)


def test_a_paused_queue_and_instance_stay_paused_across_a_worker_restart(
    tdb: None, worker_process: Callable[..., Any]
) -> None:
    sv.pause_queue("pq")
    held = sv.start_workflow("pause.activity", "held")
    parked = sv.start_workflow("pause.receive", None)
    run_until_idle(Worker(**QUIET, activity_queues=["other"]))
    sv.pause_workflow(parked, reason="restart test")
    sv.signal(parked, "go", "later")
    env = overrides(ACTIVITY_POLL_INTERVAL=0.5, WAIT_POLL_INTERVAL=0.2)
    first = worker_process("--worker-id", "pause-a", env=env)
    witness = sv.start_workflow("pause.other", "one")
    assert sv.wait_workflow(witness, timeout=30).output == "one"
    assert first.terminate() == 0
    second = worker_process("--worker-id", "pause-b", env=env)
    witness = sv.start_workflow("pause.other", "two")
    assert sv.wait_workflow(witness, timeout=30).output == "two"
    # Both workers ran work started after the pauses, and left the paused work alone.
    task = ActivityTask.objects.get(instance_id=held)
    assert (task.status, task.attempts) == ("queued", 0)
    assert sv.describe(parked).paused and status(parked) == "running"
    sv.unpause_queue("pq")
    sv.unpause_workflow(parked)
    assert sv.wait_workflow(held, timeout=30).output == "held"
    assert sv.wait_workflow(parked, timeout=30).output == "later"
    assert second.terminate() == 0


def test_two_worker_processes_hear_of_a_queue_pause_and_unpause(
    tdb: None, worker_process: Callable[..., Any]
) -> None:
    postgres = connection.vendor == "postgresql"
    # On PostgreSQL the workers poll every 30 s and keep what they read as long: only
    # NOTIFY can tell them of a pause in time. On SQLite they poll every 0.5 s.
    poll = 30.0 if postgres else 0.5
    env = overrides(ACTIVITY_POLL_INTERVAL=poll, MAX_POLL_INTERVAL=poll, WAIT_POLL_INTERVAL=0.2)
    workers = [worker_process("--worker-id", f"pq-{n}", env=env) for n in range(2)]
    # Each worker has read the paused queues (none) for its claims by now.
    first = [sv.start_workflow("pause.activity", n) for n in range(4)]
    for iid in first:
        sv.wait_workflow(iid, timeout=30)
    sv.pause_queue("pq")
    if not postgres:
        # What a worker read before the pause is kept for up to one poll interval.
        time.sleep(poll * 2)
    held = [sv.start_workflow("pause.activity", f"held-{n}") for n in range(4)]
    witnesses = [sv.start_workflow("pause.other", n) for n in range(4)]
    for iid in witnesses:
        assert sv.wait_workflow(iid, timeout=30).status == "completed"
    assert set(
        ActivityTask.objects.filter(instance_id__in=held).values_list("status", flat=True)
    ) == {"queued"}
    unpaused_at = time.monotonic()
    sv.unpause_queue("pq")
    for iid in held:
        assert sv.wait_workflow(iid, timeout=30).status == "completed"
    took = time.monotonic() - unpaused_at
    # At once on PostgreSQL (far within the 30 s poll); within the poll interval on SQLite,
    # plus the claims and the workflows' last steps.
    assert took < (10.0 if postgres else poll + 10.0), took
    claimed_by = set(
        ActivityTask.objects.filter(instance_id__in=[*first, *held]).values_list(
            "claim_owner", flat=True
        )
    )
    assert claimed_by <= {"pq-0", "pq-1"}
    for proc in workers:
        assert proc.terminate() == 0


def state(instance_id: str) -> dict[str, Any]:
    """Every row a pause or an unpause writes."""
    inst = WorkflowInstance.objects.filter(instance_id=instance_id).values()
    return {
        "instance": [{k: v for k, v in row.items() if k != "updated_at"} for row in inst],
        "tasks": list(ActivityTask.objects.filter(instance_id=instance_id).values()),
        "timers": list(TimerSubscription.objects.filter(instance_id=instance_id).values()),
    }


def parked(name: str) -> str:
    """A pause.held run with its activity's task queued on "pq" (served by no worker here)."""
    iid = sv.start_workflow("pause.held", name, instance_id=name)
    run_until_idle(Worker(**QUIET, activity_queues=["other"]))
    assert ActivityTask.objects.get(instance_id=iid).status == "queued"
    return iid


def pause_case(name: str) -> tuple[str, list[str], Callable[[], object]]:
    twin = parked(f"{name}-twin")
    return parked(name), ["pause", name, "--reason", "crash"], lambda: sv.pause_workflow(twin)


def unpause_case(name: str) -> tuple[str, list[str], Callable[[], object]]:
    twin = parked(f"{name}-twin")
    sv.pause_workflow(twin)
    iid = parked(name)
    sv.pause_workflow(iid, reason="crash")
    return iid, ["unpause", name], lambda: sv.unpause_workflow(twin)


CASES = {"pause": pause_case, "unpause": unpause_case}


@pytest.mark.slow
@pytest.mark.parametrize("when", ["inside", "after_commit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_client_exiting_during_a_pause_or_unpause_leaves_it_whole_or_undone(
    tdb: None, name: str, when: str
) -> None:
    iid = f"crash-{name}-{when}".replace("_", "-")
    source, args, twin_run = CASES[name](iid)
    step = last_step(name, twin_run)
    before = state(source)
    injector = FaultInjector()
    if when == "inside":
        injector.exit_at_statement(None, operation=name, step=step)
    else:
        injector.exit_after_commit(None, operation=name, step=step)
    done = runselvedge(args, injector.to_env())
    assert done.returncode == FAULT_EXIT_STATUS, done.stdout + done.stderr
    after = state(source)
    if when == "inside":
        assert after == before  # rolled back with the process
        retry = runselvedge(args)
        assert retry.returncode == 0, retry.stdout + retry.stderr
    else:
        assert after != before
        retry = runselvedge(args)
        assert retry.returncode != 0, retry.stdout
        assert state(source) == after
    # Never half: the tasks are held exactly while the instance is paused.
    paused = sv.describe(source).paused
    held = {task["held"] for task in state(source)["tasks"]}
    assert held == {paused}
    assert paused == (name == "pause")
    # And the run completes once unpaused.
    if paused:
        sv.unpause_workflow(source)
    sv.signal(source, "go", "done")
    run_until_idle(Worker(**QUIET))
    assert sv.get_workflow_result(source).output == [source, "done"]
