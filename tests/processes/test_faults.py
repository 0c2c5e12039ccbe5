"""Process and database faults: SIGKILL at random moments, a stalled worker, a database restart.

Real ``runselvedge worker`` processes on the test database run ``fault.flow``
(activities, a retry, timers, signals, a child, a cancelled scope) or
``fault.stall``; ``tests/testapp/audit.py`` then classifies every instance as
completed, lost or doubled.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

import selvedge_django as sv
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from tests.conftest import WorkerProcess, wait_until
from tests.pgcluster import PrivateCluster, private_cluster, private_database, server_bin_dir
from tests.testapp.audit import audit
from tests.testapp.models import Ledger

LEASE_1S = {"TTL": 1.0, "RENEW_INTERVAL": 0.25, "MARGIN": 0.25, "MAX_SKEW": 0.1}
FAST_TAKEOVER = {
    "LEASE": LEASE_1S,
    "ACTIVITY_QUEUES": [""],  # fault.flow's parked task is never served
    "LEADER_LEASE_DURATION": 2,
    "LEADER_HEARTBEAT_INTERVAL": 0.5,
}
ENV = {"SELVEDGE_TEST_OVERRIDES": json.dumps(FAST_TAKEOVER)}


class Output:
    """A worker's output, read as it comes (a full pipe would block the worker)."""

    def __init__(self, proc: WorkerProcess) -> None:
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: WorkerProcess) -> None:
        assert proc.proc.stdout is not None
        for line in proc.proc.stdout:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()

    def wait_for(self, needle: str, timeout: float = 30) -> None:
        with self._seen:
            if not self._seen.wait_for(lambda: any(needle in s for s in self.lines), timeout):
                raise AssertionError(f"worker never printed {needle!r}: {''.join(self.lines)}")

    def close(self) -> None:
        self._thread.join(10)


@pytest.fixture
def workers(
    worker_process: Callable[..., WorkerProcess],
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes with one-second leases; their output is read as it comes."""
    started: list[WorkerProcess] = []

    def start(name: str) -> WorkerProcess:
        proc = worker_process("--worker-id", name, env=ENV)
        proc.out = Output(proc)  # type: ignore[attr-defined]
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.kill()  # SIGKILL also ends a stopped process
        proc.out.close()  # type: ignore[attr-defined]
        if proc.proc.stdout is not None:
            proc.proc.stdout.close()


def start_flows(count: int, rng: random.Random, *, sleep: tuple[float, float]) -> list[str]:
    """Start fault.flow instances, each with its two signals, in one transaction each."""
    ids = []
    for _ in range(count):
        iid = f"fault-{uuid.uuid4().hex[:10]}"
        with transaction.atomic():
            sv.start_workflow(
                "fault.flow", {"tag": iid, "sleep": rng.uniform(*sleep)}, instance_id=iid
            )
            sv.signal(iid, "go", 1)
            sv.signal(iid, "go", 2)
        ids.append(iid)
    return ids


def all_closed(ids: list[str]) -> bool:
    return not WorkflowInstance.objects.filter(instance_id__in=ids, status="running").exists()


# -- SIGKILL at random moments ------------------------------------------------------------


@pytest.mark.slow
def test_workers_killed_at_random_moments_and_restarted_lose_and_double_nothing(
    workers: Callable[..., WorkerProcess],
) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    procs = [workers(f"kill-{n}-0") for n in range(2)]
    ids = start_flows(16, rng, sleep=(0.0, 1.0))
    for kill in range(1, 7):
        # A random worker, at a random moment: in an execution, an attempt, a commit...
        threading.Event().wait(rng.uniform(0.1, 1.0))
        victim = rng.randrange(len(procs))
        procs[victim].kill()
        procs[victim] = workers(f"kill-{victim}-{kill}")
        if kill == 2:
            ids += start_flows(8, rng, sleep=(0.0, 1.0))
    wait_until(lambda: all_closed(ids), timeout=120, interval=0.2)

    result = audit(ids)
    assert result.ok, (seed, result.summary(), result.lost, result.doubled)
    assert (result.started, result.completed) == (24, 24)
    assert [p.terminate() for p in procs] == [0, 0]


# -- a stalled worker is fenced ---------------------------------------------------------


def snapshot(instance_id: str) -> list[tuple[str, str, str | None]]:
    return list(
        HistoryEvent.objects.filter(instance_id=instance_id)
        .order_by("id")
        .values_list("key", "event_type", "data")
    )


def stop_between_writes(pid: int) -> None:
    """SIGSTOP a worker process while it is inside no write transaction of the engine.

    A process stopped inside one would hold its locks for as long as it stays stopped
    (on SQLite the one write lock of the file), and no other worker could take over:
    not the stall under test. So the signal is sent while this test holds the write
    side of every engine table: SQLite's write lock (the test settings begin write
    transactions IMMEDIATE), or PostgreSQL's EXCLUSIVE table locks, which wait for each
    transaction that wrote to them and keep new writes out until the commit.

    ``kill`` returns before the process has stopped: one of its threads takes the
    signal when the scheduler next runs it and stops the others, which until then go on
    (on a busy machine long enough for the held activity to see its marker gone and
    commit its completion). So the locks are held until ``waitpid`` reports the whole
    process stopped.
    """
    tables = [model._meta.db_table for model in apps.get_app_config("selvedge_django").get_models()]
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            names = ", ".join(connection.ops.quote_name(table) for table in tables)
            cursor.execute(f"LOCK TABLE {names} IN EXCLUSIVE MODE")
        else:
            WorkflowInstance.objects.filter(instance_id="").update(runnable=False)
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while (reported := os.waitpid(pid, os.WUNTRACED | os.WNOHANG)) == (0, 0):
            assert time.monotonic() < deadline, f"worker {pid} did not stop"
            time.sleep(0.001)
        assert os.WIFSTOPPED(reported[1]), f"worker {pid} ended instead: {reported[1]}"


@pytest.mark.slow
def test_a_worker_stalled_past_its_lease_is_fenced_when_it_resumes(
    workers: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    marker = tmp_path / "hold"
    marker.touch()
    stale = workers("stale")
    iid = sv.start_workflow("fault.stall", {"tag": "stall", "hold_while": str(marker)})
    wait_until(lambda: Ledger.objects.filter(entry="fault.hold:stall:1:start").exists())
    held = WorkflowInstance.objects.get(instance_id=iid)
    assert (held.lease_owner, held.lease_epoch) == ("stale", 1)

    # The stalled process can neither renew nor write; its lease and claim lapse.
    stop_between_writes(stale.proc.pid)
    try:
        marker.unlink()
        successor = workers("successor")
        result = sv.wait_workflow(iid, timeout=60)
        assert result.status == "completed", result.error
        assert result.output == ["stall:attempt 2", "stall:after"]
        recorded = snapshot(iid)
    finally:
        os.kill(stale.proc.pid, signal.SIGCONT)

    # Resumed, it finishes its attempt: the late result is discarded (claim fence), and
    # the execution stops at its next step (lease belief), writing nothing.
    stale.out.wait_for(f"execution of {iid} abandoned: LeaseLost")  # type: ignore[attr-defined]
    assert Ledger.objects.filter(entry="fault.hold:stall:1:done").exists()
    assert snapshot(iid) == recorded
    task = ActivityTask.objects.get(instance_id=iid, name="fault.hold")
    assert (task.status, task.attempts, task.failures, task.claim_owner) == (
        "completed",
        2,
        1,
        "successor",
    )
    after = ActivityTask.objects.get(instance_id=iid, name="fault.step")
    assert (after.attempts, after.claim_owner) == (1, "successor")
    assert Ledger.objects.filter(entry="fault:stall:after:1").count() == 1
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert inst.status == "completed" and inst.lease_epoch >= 2
    assert HistoryEvent.objects.filter(instance_id=iid, key="$close").count() == 1
    assert stale.terminate() == 0
    assert successor.terminate() == 0


# -- PostgreSQL restarted during a run ----------------------------------------------------


ON_POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def _pg_reachable() -> bool:
    import psycopg

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
        params.pop(key, None)
    try:
        with psycopg.connect(**params, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


@pytest.fixture
def own_postgres(tdb: None) -> Iterator[PrivateCluster]:
    """The test database on a PostgreSQL cluster of this test's own, which it may restart."""
    with private_cluster() as cluster, private_database(cluster):
        yield cluster


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_POSTGRES, reason="restarts a PostgreSQL server")
@pytest.mark.skipif(server_bin_dir() is None, reason="needs the PostgreSQL server binaries")
def test_workers_carry_on_after_postgresql_restarts(
    own_postgres: PrivateCluster, workers: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    rng = random.Random(7)
    procs = [workers(f"pg-{n}") for n in range(2)]
    ids = start_flows(12, rng, sleep=(0.5, 3.0))
    wait_until(
        lambda: WorkflowInstance.objects.filter(instance_id__in=ids, status="completed").exists()
    )
    assert not all_closed(ids)
    connections.close_all()
    try:
        own_postgres.restart()
    finally:
        if not _pg_reachable():
            own_postgres.start()
        wait_until(_pg_reachable, timeout=60, interval=0.2)
    # Work started after the restart is picked up too: nobody restarted the workers.
    ids += start_flows(6, rng, sleep=(0.0, 0.5))
    # An attempt three times longer than its one-second claim survives only if the
    # worker renews the claim: every thread must have reconnected, the renewer's too.
    marker = tmp_path / "hold"
    marker.touch()
    held = sv.start_workflow("fault.stall", {"tag": "pg", "hold_while": str(marker)})
    started = wait_until(
        lambda: Ledger.objects.filter(entry="fault.hold:pg:1:start").first(), timeout=60
    )
    outlived = started.created_at + timedelta(seconds=3)
    wait_until(lambda: timezone.now() > outlived, timeout=10)
    marker.unlink()
    assert sv.wait_workflow(held, timeout=60).output == ["pg:attempt 1", "pg:after"]
    task = ActivityTask.objects.get(instance_id=held, name="fault.hold")
    assert (task.attempts, task.failures) == (1, 0)
    wait_until(lambda: all_closed(ids), timeout=120, interval=0.2)

    result = audit(ids)
    assert result.ok, (result.summary(), result.lost, result.doubled)
    assert result.completed == 18
    assert all(p.proc.poll() is None for p in procs)
    assert [p.terminate() for p in procs] == [0, 0]
