"""Schedules under real workers: a leader killed mid-fire, and leaders that change hands.

* A real ``runselvedge worker`` process exits (the fault injector's ``os._exit``)
  between inserting a slot's run and updating the schedule, or right after that
  transaction commits; a second worker takes over the leadership, and the slot's
  run starts exactly once either way.
* Two in-process workers run an hour of simulated time (the testing clock moves
  the database clock a minute at a time, so the leader lock lapses at every step
  and both may act as leader for a moment); the leader is stopped halfway. Every
  slot starts exactly once, none is missed or skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django.models import Schedule, SystemLock, WorkflowInstance
from selvedge_django.schedules import schedule_store
from selvedge_django.testing import FAULT_EXIT_STATUS, ControllableClock, FaultInjector
from selvedge_django.worker.leader import LEADER_LOCK
from tests.conftest import WorkerProcess, wait_until

MINUTE = timedelta(minutes=1)
# Worker subprocesses: a short leader lease, so that the second takes over soon.
FAST_TAKEOVER = {"LEADER_LEASE_DURATION": 2, "LEADER_HEARTBEAT_INTERVAL": 0.3}
# The statement that records a fire in the schedule row, after the run's INSERT.
RECORD_UPDATE = r"UPDATE \S*selvedge_django_schedule\S* SET next_slot_ms"


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def db_now() -> datetime:
    return datetime.fromtimestamp(schedule_store().now_ms() / 1000, UTC)


def runs(name: str) -> list[str]:
    return list(
        WorkflowInstance.objects.filter(instance_id__startswith=f"{name}@")
        .order_by("instance_id")
        .values_list("instance_id", flat=True)
    )


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["exit", "exit_after_commit"])
def test_a_leader_killed_between_starting_a_slot_and_updating_the_schedule(
    worker_process: Callable[..., WorkerProcess], crash: str
) -> None:
    slot = db_now().replace(microsecond=0) + timedelta(seconds=3)
    # One slot only (start_at = end_at), so its run is the only one there can be.
    sv.create_schedule(
        "crash", "sched.echo", interval=3600, start_at=slot, end_at=slot, input="once"
    )
    faults = FaultInjector()
    if crash == "exit":
        # Before the schedule's update: the run's INSERT ran in the same transaction.
        faults.exit_at_statement(RECORD_UPDATE, operation="fire_due")
    else:
        faults.exit_after_commit(RECORD_UPDATE, operation="fire_due")
    env = {
        **faults.to_env(),
        "SELVEDGE_TEST_OVERRIDES": json.dumps(FAST_TAKEOVER),
    }
    victim = worker_process("--worker-id", "victim", env=env, wait_started=False)
    assert victim.proc.wait(60) == FAULT_EXIT_STATUS, victim.output()
    row = Schedule.objects.get(name="crash")
    run_id = f"crash@{iso(slot)}"
    if crash == "exit":
        assert runs("crash") == []  # rolled back with the schedule's update
        assert row.next_slot_ms == int(slot.timestamp() * 1000) and row.runs_started == 0
    else:
        assert runs("crash") == [run_id]  # committed with it
        assert row.next_slot_ms is None and row.runs_started == 1

    survivor = worker_process(
        "--worker-id", "survivor", env={"SELVEDGE_TEST_OVERRIDES": json.dumps(FAST_TAKEOVER)}
    )
    wait_until(
        lambda: WorkflowInstance.objects.filter(instance_id=run_id, status="completed").exists(),
        timeout=60,
    )
    assert runs("crash") == [run_id]
    described = sv.describe_schedule("crash")
    assert described.runs_started == 1 and described.missed_runs == 0
    assert described.recent_instance_ids == [run_id] and described.next_run_at is None
    assert sv.get_workflow_result(run_id).output == {"input": "once", "instance_id": run_id}
    assert survivor.terminate() == 0


@pytest.mark.slow
def test_two_workers_for_an_hour_of_simulated_time_start_every_slot_exactly_once(
    make_worker: Callable[..., Any], selvedge_clock: ControllableClock
) -> None:
    options = {"leader_lease_duration": 1.0, "leader_heartbeat_interval": 0.2}
    workers = [make_worker(worker_id=f"w{n}", **options) for n in (1, 2)]
    start = db_now().replace(second=0, microsecond=0) + MINUTE
    sv.create_schedule("hourly-sim", "sched.echo", interval=60, catchup_window=600)
    slot_ms = int(start.timestamp() * 1000)

    def handled(slot: datetime) -> bool:
        row = Schedule.objects.get(name="hourly-sim")
        run_id = f"hourly-sim@{iso(slot)}"
        done = WorkflowInstance.objects.filter(instance_id=run_id, status="completed")
        return row.next_slot_ms is not None and row.next_slot_ms > slot_ms and done.exists()

    leaders: set[str] = set()
    for minute in range(60):
        slot = start + minute * MINUTE
        slot_ms = int(slot.timestamp() * 1000)
        selvedge_clock.advance(slot + timedelta(milliseconds=200) - db_now())
        wait_until(lambda slot=slot: handled(slot), timeout=30)
        lock = SystemLock.objects.filter(name=LEADER_LOCK).first()
        if lock is not None:
            leaders.add(lock.owner)
        if minute == 30 and lock is not None:  # the leader goes away; a new worker joins later
            for worker in workers:
                if worker.worker_id == lock.owner:
                    worker.stop(timeout=10)
            workers = [w for w in workers if w.started]
            assert len(workers) == 1
        if minute == 40:
            workers.append(make_worker(worker_id="w3", **options))

    expected = [f"hourly-sim@{iso(start + n * MINUTE)}" for n in range(60)]
    assert runs("hourly-sim") == expected
    described = sv.describe_schedule("hourly-sim")
    assert (described.runs_started, described.missed_runs, described.overlap_skipped_runs) == (
        60,
        0,
        0,
    )
    assert len(leaders) >= 2, leaders  # the leadership changed hands
