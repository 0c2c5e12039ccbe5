"""Many worker processes on one PostgreSQL database.

Real ``manage.py runselvedge worker`` processes share the PostgreSQL test
database: four of them race through 500 workflows, the leader is killed and
another takes over, a listener's connection is terminated by the server and its
wake-ups resume, and a worker serving queue ``a`` never touches queue ``b``.
SQLite is skipped: processes sharing a SQLite file coordinate by polling, and
the leader and listener under test exist for PostgreSQL deployments.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

import selvedge_django as sv
from selvedge_django.models import ActivityTask, HistoryEvent, SystemLock, WorkflowInstance
from selvedge_django.storage.postgresql import listener as notify
from selvedge_django.worker.leader import LEADER_LOCK
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="PostgreSQL only: SKIP LOCKED dispatch across processes, the leader lock and "
    "LISTEN/NOTIFY are what these tests exercise (SQLite processes share work by polling)",
)


def leader_row() -> tuple[str, int, int] | None:
    """The leader lock as (owner, epoch, milliseconds until expiry), None while free."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT owner, epoch, expires_ms - CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000"
            " AS BIGINT) FROM selvedge_django_systemlock WHERE name = %s AND owner <> ''",
            [LEADER_LOCK],
        )
        row = cursor.fetchone()
    if row is None or row[2] < 0:
        return None
    return str(row[0]), int(row[1]), int(row[2])


def listen_backends() -> set[int]:
    """Backends of this test database that LISTEN, other than this process's listeners."""
    own = {listener.backend_pid for listener, _references in notify._listeners.values()}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
        )
        return {pid for (pid,) in cursor.fetchall()} - own


# -- four processes, five hundred workflows -----------------------------------------------


@pytest.mark.slow
def test_four_processes_complete_500_workflows_with_no_step_twice_and_none_lost(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    four_processes_share_workflows(worker_process, 500)


def four_processes_share_workflows(
    worker_process: Callable[..., WorkerProcess],
    count: int,
    env: dict[str, str] | None = None,
) -> None:
    """Four worker processes (``env``) race through ``count`` workflows: none lost, no
    step twice, the work shared (tests/processes/test_pgbouncer.py runs it through pgbouncer)."""
    names = [f"scale-{n}" for n in range(4)]
    # Five execution threads each (the activities run inline on them): 20 executions
    # race for the same rows while the four processes stay within ~50 connections.
    limits = ("--max-resumptions", "5", "--max-activities", "2")
    procs = [worker_process("--worker-id", name, *limits, env=env) for name in names]
    tags = [f"w{i}" for i in range(count)]
    ids = {sv.start_workflow("scale.three", tag): tag for tag in tags}

    def open_count() -> int:
        return WorkflowInstance.objects.filter(instance_id__in=list(ids), status="running").count()

    wait_until(lambda: open_count() == 0, timeout=240, interval=0.25)

    # None lost: every instance completed with the right value and exactly one close.
    instances = WorkflowInstance.objects.filter(instance_id__in=list(ids))
    assert instances.count() == count
    assert set(instances.values_list("status", flat=True)) == {"completed"}
    assert {json.loads(output) for output in instances.values_list("output", flat=True)} == {6}
    closes = Counter(
        HistoryEvent.objects.filter(instance_id__in=list(ids), key="$close").values_list(
            "instance_id", flat=True
        )
    )
    assert closes == Counter(dict.fromkeys(ids, 1))

    # No activity recorded twice: three activity rows per instance, each with one value,
    # each task claimed and run once, each body's side effect written once.
    rows = HistoryEvent.objects.filter(instance_id__in=list(ids), command="activity")
    assert Counter(rows.values_list("instance_id", flat=True)) == Counter(dict.fromkeys(ids, 3))
    assert set(rows.values_list("event_type", flat=True)) == {"ActivityCompleted"}
    tasks = ActivityTask.objects.filter(instance_id__in=list(ids))
    assert tasks.count() == 3 * count
    assert set(tasks.values_list("status", "attempts", "failures")) == {("completed", 1, 0)}
    entries = Counter(
        Ledger.objects.filter(entry__startswith="scale:w").values_list("entry", flat=True)
    )
    assert entries == Counter({f"scale:{tag}:{i}": 1 for tag in tags for i in range(3)})
    # The work was shared: SKIP LOCKED dispatch let several processes lease at once.
    owners = Counter(tasks.values_list("claim_owner", flat=True))
    assert set(owners) <= set(names)
    assert len(owners) >= 2, owners
    assert [p.terminate(timeout=60) for p in procs] == [0, 0, 0, 0]
    assert not WorkflowInstance.objects.exclude(lease_owner="").exists()


# -- the leader -------------------------------------------------------------------------

LEADER_LEASE = 3.0  # seconds; the heartbeat is a sixth of it (tests/settings.py)


@pytest.mark.slow
def test_killing_the_leader_hands_leadership_over_within_the_leader_lease(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    env = {"SELVEDGE_TEST_LEADER_LEASE": str(LEADER_LEASE)}
    first = worker_process("--worker-id", "lead-a", env=env)
    held = wait_until(leader_row, timeout=10)
    assert held[0] == "lead-a"
    second = worker_process("--worker-id", "lead-b", env=env)
    third = worker_process("--worker-id", "lead-c", env=env)

    # The followers contend every tick but never take a live lock.
    deadline = time.monotonic() + LEADER_LEASE * 1.5
    while time.monotonic() < deadline:
        row = leader_row()
        assert row is not None and row[0] == "lead-a" and row[1] == held[1], row
        time.sleep(0.05)

    first.kill()
    killed_at = time.monotonic()
    row = wait_until(
        lambda: (r := leader_row()) is not None and r[0] != "lead-a" and r,
        timeout=LEADER_LEASE * 4,
        interval=0.02,
    )
    handover = time.monotonic() - killed_at
    owner, epoch, _ = row
    assert owner in ("lead-b", "lead-c")
    assert epoch == held[1] + 1
    # The dead leader renewed at most one heartbeat before it died; a follower takes
    # the lock at its first tick after the expiry (one heartbeat, 0.5 s, here).
    assert handover <= LEADER_LEASE + 1.0, f"handover took {handover:.2f}s"

    # One leader at a time afterwards, and it keeps the lock by renewing it.
    deadline = time.monotonic() + LEADER_LEASE * 1.5
    while time.monotonic() < deadline:
        now_row = leader_row()
        assert now_row is not None and now_row[:2] == (owner, epoch), now_row
        time.sleep(0.05)
    assert SystemLock.objects.filter(name=LEADER_LOCK).count() == 1
    assert second.terminate() == 0
    assert third.terminate() == 0


# -- LISTEN/NOTIFY across a lost connection ----------------------------------------------

SLOW_POLL = 60.0  # seconds: a prompt wake-up in the worker can only come from a NOTIFY


def timed_run(instance_id: str, timeout: float) -> float:
    started = time.monotonic()
    result = sv.wait_workflow(instance_id, timeout=timeout)
    assert result.status == "completed", result.error
    return time.monotonic() - started


@pytest.mark.slow
def test_a_terminated_listener_reconnects_and_wake_ups_resume(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    proc = worker_process(
        "--worker-id", "listening", env={"SELVEDGE_TEST_POLL_INTERVAL": str(SLOW_POLL)}
    )
    (listener_pid,) = wait_until(listen_backends, timeout=10)
    time.sleep(0.5)  # past the loops' first poll: from now on they sleep for SLOW_POLL

    first = sv.start_workflow("scale.three", "listen-before")
    assert timed_run(first, timeout=10) < 5

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [listener_pid])
        assert cursor.fetchone() == (True,)
    (new_pid,) = wait_until(lambda: listen_backends() - {listener_pid}, timeout=10)
    assert new_pid != listener_pid
    # The reconnect wakes every loop once (to find what was missed); let that pass.
    time.sleep(1.0)

    second = sv.start_workflow("scale.three", "listen-after")
    assert timed_run(second, timeout=10) < 5
    # Both ran in the worker process; the second only because the new LISTEN heard it.
    assert set(
        ActivityTask.objects.filter(instance_id__in=[first, second]).values_list(
            "claim_owner", flat=True
        )
    ) == {"listening"}
    assert proc.terminate() == 0


def test_an_in_process_listener_reconnects_after_pg_terminate_backend(tdb: None) -> None:
    from selvedge_django.storage.wakeups import NOTIFY_CHANNEL, Bus, Waker

    bus = Bus()
    listener = notify.Listener("default", bus, reconnect_delay=0.1).start()
    try:
        assert notify.wait_until_connected(listener, 10)
        waker = Waker()
        bus.subscribe("closed:probe", waker)
        old_pid = listener.backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [old_pid])
        wait_until(lambda: listener.reconnects == 1 and listener.connected.is_set(), timeout=10)
        assert listener.backend_pid != old_pid
        waker.wait(0)  # forget anything seen before the NOTIFY below
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "closed:probe"])
        assert waker.wait(5), "no wake-up after the reconnect"
    finally:
        listener.stop()


# -- queues -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_serving_queue_a_never_runs_a_task_of_queue_b(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    serving_a = worker_process("--worker-id", "queue-a", "--queues", "a")
    a_ids = [sv.start_workflow("scale.queued", {"queue": "a", "tag": f"a{i}"}) for i in range(10)]
    b_ids = [sv.start_workflow("scale.queued", {"queue": "b", "tag": f"b{i}"}) for i in range(10)]
    pid_a = serving_a.proc.pid
    for instance_id in a_ids:
        result = sv.wait_workflow(instance_id, timeout=30)
        assert (result.status, result.output) == ("completed", pid_a)

    # Every queue-b workflow reached its activity and suspended there, unclaimed.
    def b_reserved() -> bool:
        return ActivityTask.objects.filter(instance_id__in=b_ids, queue="b").count() == 10

    wait_until(b_reserved, timeout=20)
    time.sleep(1.5)  # many poll rounds of the queue-a worker (tests poll every 0.05-0.5 s)
    b_tasks = ActivityTask.objects.filter(instance_id__in=b_ids)
    assert set(b_tasks.values_list("status", "attempts", "claim_owner")) == {("queued", 0, "")}
    assert not Ledger.objects.filter(entry__startswith="scale.queue:b:").exists()
    assert WorkflowInstance.objects.filter(instance_id__in=b_ids, status="running").count() == 10

    serving_b = worker_process("--worker-id", "queue-b", "--queues", "b")
    pid_b = serving_b.proc.pid
    for instance_id in b_ids:
        result = sv.wait_workflow(instance_id, timeout=30)
        assert (result.status, result.output) == ("completed", pid_b)
    owners: dict[str, Any] = {
        queue: set(
            ActivityTask.objects.filter(instance_id__in=a_ids + b_ids, queue=queue).values_list(
                "claim_owner", flat=True
            )
        )
        for queue in ("a", "b")
    }
    assert owners == {"a": {"queue-a"}, "b": {"queue-b"}}
    ran = Counter(
        entry.split(":")[1] + ":" + entry.split(":")[3]
        for entry in Ledger.objects.filter(entry__startswith="scale.queue:").values_list(
            "entry", flat=True
        )
    )
    assert ran == Counter({f"a:{pid_a}": 10, f"b:{pid_b}": 10})
    assert serving_a.terminate() == 0
    assert serving_b.terminate() == 0
