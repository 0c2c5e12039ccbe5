"""PostgreSQL as deployments configure it: role timeouts, lost and exhausted connections.

Each test runs a real ``runselvedge worker`` process against the PostgreSQL test
database, connected as a role the test creates (and drops), so that role-level
settings apply to the worker's sessions only:

* ``statement_timeout`` and ``idle_in_transaction_session_timeout`` set on the role;
* every connection of the worker terminated at once by the server, the renewer's too;
* no connection slot left (the role's ``CONNECTION LIMIT`` brought to 0: the server
  refuses new sessions with ``too_many_connections``, SQLSTATE 53300, the error
  ``max_connections`` gives, without exhausting a server other sessions share).

The worker keeps working or recovers, and no work is lost or done twice: every
workflow completes with its value and every activity body ran once.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

import selvedge_django as sv
from selvedge_django.models import ActivityTask, WorkflowInstance
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Ledger

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="PostgreSQL roles, timeouts and connections"
    ),
    pytest.mark.slow,
]

# A short lease and claim, so that a worker that lost its connections for good would show
# up as lapsed claims (bodies run twice) within the test.
OVERRIDES = {"LEASE": {"TTL": 4, "RENEW_INTERVAL": 1, "MARGIN": 1, "MAX_SKEW": 0.5}}


class Role:
    """A login role on the test database with privileges on its tables."""

    def __init__(self) -> None:
        self.name = f"sv_role_{os.getpid()}_{uuid.uuid4().hex[:8]}"

    def sql(self, statement: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement.replace("{role}", f'"{self.name}"'))

    def create(self) -> None:
        self.sql("CREATE ROLE {role} LOGIN")
        self.sql("GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        self.sql("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")

    def drop(self) -> None:
        self.terminate_sessions()
        self.sql("DROP OWNED BY {role}")
        self.sql("DROP ROLE {role}")

    def backends(self) -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
                [self.name],
            )
            return [pid for (pid,) in cursor.fetchall()]

    def terminate_sessions(self) -> int:
        pids = self.backends()
        with connection.cursor() as cursor:
            for pid in pids:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        return len(pids)

    def worker(self, start: Callable[..., WorkerProcess], name: str, *args: str) -> Drained:
        env = {"SELVEDGE_PG_USER": self.name, "SELVEDGE_TEST_OVERRIDES": json.dumps(OVERRIDES)}
        return Drained(start("--worker-id", name, *args, env=env))


class Drained:
    """A worker process whose output is read as it comes.

    These tests make the worker log many errors (tracebacks of refused connections):
    unread, they would fill the pipe, and every thread that logs would block on it.
    """

    def __init__(self, process: WorkerProcess) -> None:
        self.process = process
        self.lines: list[str] = []
        stdout = process.proc.stdout
        assert stdout is not None
        self._reader = threading.Thread(target=lambda: self.lines.extend(stdout), daemon=True)
        self._reader.start()

    def terminate(self) -> int:
        return self.process.terminate()

    def output(self) -> str:
        self._reader.join(10)
        return "".join(self.lines)


@pytest.fixture
def role(tdb: None) -> Iterator[Role]:
    role = Role()
    role.create()
    try:
        yield role
    finally:
        role.drop()


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def entries(prefix: str) -> Counter[str]:
    return Counter(Ledger.objects.filter(entry__startswith=prefix).values_list("entry", flat=True))


def start_steps(tag: str, n: int) -> list[str]:
    return [sv.start_workflow("scale.three", f"{tag}{i}") for i in range(n)]


def assert_steps_ran_once(tag: str, ids: list[str]) -> None:
    results = {i: sv.wait_workflow(i, timeout=90) for i in ids}
    assert {(r.status, r.output) for r in results.values()} == {("completed", 6)}, results
    n = len(ids)
    assert entries(f"scale:{tag}") == Counter(
        {f"scale:{tag}{i}:{s}": 1 for i in range(n) for s in range(3)}
    )
    tasks = ActivityTask.objects.filter(instance_id__in=ids)
    assert set(tasks.values_list("status", "attempts", "failures")) == {("completed", 1, 0)}


def hold(tag: str, marker: Path, **flags: Any) -> str:
    """act.wait holding while ``marker`` exists; ``flags`` go to act.run or act.wait."""
    data: dict[str, Any] = {"tag": tag, "hold_while": str(marker), "mode": "ignore", "max_hold": 60}
    data.update({k: v for k, v in flags.items() if k == "record_end"})
    return sv.start_workflow(
        "act.run",
        {
            "activity": "act.wait",
            "input": data,
            **{k: v for k, v in flags.items() if k != "record_end"},
        },
    )


# -- role timeouts ----------------------------------------------------------------------


def test_a_worker_keeps_working_under_role_statement_and_idle_transaction_timeouts(
    role: Role, worker_process: Callable[..., WorkerProcess], marker: Path
) -> None:
    """statement_timeout 500 ms, idle_in_transaction_session_timeout 1 s on the worker's role.

    A transactional activity idles in its transaction for 2.5 s (its body waits on
    something else), and a client holds a signal open on an instance for 2.5 s while
    that instance's activity result waits to be written (each try of that write is
    cancelled by the statement timeout, and tried again).
    """
    role.sql("ALTER ROLE {role} SET statement_timeout = '500ms'")
    role.sql("ALTER ROLE {role} SET idle_in_transaction_session_timeout = '1s'")
    proc = role.worker(worker_process, "timeouts", "-v", "2")  # INFO: the retried writes
    transactional = sv.start_workflow(
        "act.run", {"activity": "act.tx_long", "input": {"tag": "idle", "seconds": 2.5}}
    )
    pinned = hold("pinned", marker)
    ids = start_steps("to", 10)
    wait_until(lambda: entries("wait:pinned:1:start"))

    holder_ready = threading.Event()
    release = threading.Event()

    def hold_row() -> None:
        try:
            with transaction.atomic():
                sv.signal(pinned, "poke", "held")
                holder_ready.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_row, daemon=True)
    holder.start()
    assert holder_ready.wait(10)
    marker.unlink()  # the result is ready, its write waits for the row
    time.sleep(2.5)  # the client's transaction is the workload here, not a wait
    release.set()
    holder.join(10)

    assert_steps_ran_once("to", ids)
    result = sv.wait_workflow(transactional, timeout=60)
    assert (result.status, result.output) == ("completed", "txl:idle:1"), result.error
    assert entries("txl:idle") == Counter({"txl:idle:1": 1})
    assert sv.wait_workflow(pinned, timeout=60).status == "completed"
    assert entries("wait:pinned") == Counter({"wait:pinned:1:start": 1, "wait:pinned:1:end": 1})
    assert proc.terminate() == 0
    # The result's write did wait behind the held row, and was cancelled and tried again.
    assert "canceling statement due to statement timeout" in proc.output()


# -- lost and exhausted connections -------------------------------------------------------


def test_every_worker_connection_terminated_at_once_loses_nothing(
    role: Role, worker_process: Callable[..., WorkerProcess], marker: Path
) -> None:
    """The server ends every session of the worker (renewer, loops, pools, listener) while
    it holds an inline attempt, a background one and their leases and claims."""
    proc = role.worker(worker_process, "terminated")
    # The bodies write nothing after the termination: a body's own query on its dead
    # connection would fail the attempt (an activity error, retried), which is the
    # activity's business; what is under test is the worker's own upkeep.
    inline = hold("inline", marker, record_end=False)
    background = hold("bg", marker, record_end=False, background=True)
    wait_until(lambda: entries("wait:inline:1:start") and entries("wait:bg:1:start"))
    for _ in range(3):  # every session, then the ones that reconnected at once
        assert role.terminate_sessions() >= 1
        time.sleep(0.5)
    ids = start_steps("tt", 5)
    time.sleep(2)  # two renewal intervals with the new connections
    marker.unlink()

    assert_steps_ran_once("tt", ids)
    for instance_id, tag in ((inline, "inline"), (background, "bg")):
        result = sv.wait_workflow(instance_id, timeout=60)
        assert (result.status, result.output) == ("completed", f"{tag}:1"), result.error
        assert entries(f"wait:{tag}") == Counter({f"wait:{tag}:1:start": 1})
    tasks = ActivityTask.objects.filter(instance_id__in=[inline, background])
    assert set(tasks.values_list("status", "attempts", "failures")) == {("completed", 1, 0)}
    # The leases were renewed all along. The inline result commits with the execution's
    # next write (one commit per step); when that write is the first statement on a
    # connection the server ended, the execution stops there and its result is
    # recorded on its own, so at most one replay follows, which takes the recorded
    # value: the activity ran once (above).
    assert WorkflowInstance.objects.get(instance_id=inline).lease_epoch in (1, 2)
    assert proc.terminate() == 0


def test_a_worker_recovers_when_connection_slots_free_up(
    role: Role, worker_process: Callable[..., WorkerProcess]
) -> None:
    """No slot for the worker's role for 3 s: its sessions are gone and every new one is
    refused with too_many_connections; workflows started meanwhile run once slots return."""
    proc = role.worker(worker_process, "exhausted", "--max-resumptions", "3")
    warm = start_steps("warm", 3)
    assert_steps_ran_once("warm", warm)

    role.sql("ALTER ROLE {role} CONNECTION LIMIT 0")
    try:
        role.terminate_sessions()
        ids = start_steps("ex", 8)
        wait_until(lambda: not role.backends(), timeout=10)  # nobody got back in
        time.sleep(3)  # refused all along: the outage under test
        assert not role.backends()
        assert WorkflowInstance.objects.filter(instance_id__in=ids, status="running").count() == 8
    finally:
        role.sql("ALTER ROLE {role} CONNECTION LIMIT -1")

    assert_steps_ran_once("ex", ids)
    assert proc.terminate() == 0
    assert "too many connections" in proc.output()
