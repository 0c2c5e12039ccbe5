"""Worker processes behind a real pgbouncer in transaction pooling mode.

Each test starts its own pgbouncer (Debian's ``pgbouncer`` package; ``.ci/run``
installs it when missing and run as root) on a free port, with a generated
configuration pointing at the test's PostgreSQL and fewer server connections than
the workers open client connections, so that transactions of different workers
share server sessions. The workers connect through it (``DATABASE``), with
``DISABLE_SERVER_SIDE_CURSORS``; ``LISTEN`` cannot work through transaction
pooling (the session that listened goes back to the pool after the statement), so
their listener has a direct connection of its own (``LISTEN_DATABASE``), which is
the set-up docs/deployment.md describes. Renewals of leases and claims likewise get a
direct connection (``RENEWAL_DATABASE``): behind a small pool, transactional activities
hold every server connection for their whole body, and renewals queued behind them
let a healthy worker's leases and claims lapse.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.models import ActivityTask, WorkflowInstance
from tests.conftest import WorkerProcess, wait_until
from tests.pgbouncer import PGBOUNCER, Bouncer
from tests.testapp.models import Ledger

from .test_scale import four_processes_share_workflows

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="pgbouncer is for PostgreSQL"),
    pytest.mark.skipif(
        PGBOUNCER is None, reason="no pgbouncer (Debian's pgbouncer package; SELVEDGE_PGBOUNCER)"
    ),
    pytest.mark.slow,
]

POOL_SIZE = 8  # server connections for the test database, shared by every worker


def bouncer_for_test_database(pool_size: int = POOL_SIZE) -> Bouncer:
    """A pgbouncer in transaction mode in front of the test's PostgreSQL."""
    settings = connection.settings_dict
    return Bouncer(
        host=str(settings["HOST"] or "127.0.0.1"),
        port=str(settings["PORT"] or 5432),
        user=str(settings["USER"]),
        password=str(settings.get("PASSWORD") or ""),
        dbname=str(settings["NAME"]),
        pool_size=pool_size,
    )


@pytest.fixture
def pgbouncer(tdb: None) -> Iterator[Bouncer]:
    bouncer = bouncer_for_test_database()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def small_pgbouncer(tdb: None) -> Iterator[Bouncer]:
    """A pool of 3 server connections: a few transactional activities take all of them."""
    bouncer = bouncer_for_test_database(pool_size=3)
    try:
        yield bouncer
    finally:
        bouncer.stop()


def test_four_worker_processes_through_transaction_pooling_lose_and_double_nothing(
    pgbouncer: Bouncer, worker_process: Callable[..., WorkerProcess]
) -> None:
    """test_scale.py's four-process race, every worker connection through pgbouncer."""
    before = pgbouncer.transactions()
    four_processes_share_workflows(
        worker_process, 200, env={"SELVEDGE_TEST_PGBOUNCER_PORT": str(pgbouncer.port)}
    )
    # Every step went through the pool: at least a start-to-close's worth per workflow.
    assert pgbouncer.transactions() - before >= 200 * 5


def test_wake_ups_pass_with_a_direct_listener_and_notify_through_the_pool(
    pgbouncer: Bouncer, worker_process: Callable[..., WorkerProcess]
) -> None:
    """With polls a minute apart, a prompt result needs both notifications: the start's
    (sent here, heard by the worker's direct listener) and the close's (sent by the
    worker through pgbouncer, heard by this process's listener)."""
    slow = 60.0
    env = {
        "SELVEDGE_TEST_PGBOUNCER_PORT": str(pgbouncer.port),
        "SELVEDGE_TEST_POLL_INTERVAL": str(slow),
    }
    proc = worker_process("--worker-id", "pooled", env=env)
    time.sleep(1.0)  # past the loops' first poll: from now on they sleep for a minute
    with override_settings(SELVEDGE={**settings_selvedge(), "WAIT_POLL_INTERVAL": slow}):
        for n in range(3):
            started = time.monotonic()
            result = sv.wait_workflow(sv.start_workflow("scale.three", f"pooled{n}"), timeout=30)
            assert (result.status, result.output) == ("completed", 6), result.error
            assert time.monotonic() - started < 10  # a sixth of one poll interval
    assert proc.terminate() == 0


def test_a_listener_behind_transaction_pooling_hears_nothing(
    pgbouncer: Bouncer, worker_process: Callable[..., WorkerProcess]
) -> None:
    """Why LISTEN_DATABASE: the same worker listening through pgbouncer misses the start."""
    slow = 60.0
    env = {
        "SELVEDGE_TEST_PGBOUNCER_PORT": str(pgbouncer.port),
        "SELVEDGE_TEST_PGBOUNCER_LISTEN": "pooled",
        "SELVEDGE_TEST_POLL_INTERVAL": str(slow),
    }
    proc = worker_process("--worker-id", "deaf", env=env)
    time.sleep(1.0)  # past the loops' first poll
    instance_id = sv.start_workflow("scale.three", "deaf")
    with pytest.raises(TimeoutError):
        sv.wait_workflow(instance_id, timeout=5)  # no wake-up: found at the next poll only
    assert proc.terminate() == 0


def test_renewals_bypass_a_pool_that_transactional_activities_hold(
    small_pgbouncer: Bouncer, worker_process: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """With every server connection of the pool held by transactional activities (5 s
    each, longer than the 4 s lease of the tests), a renewal queued in the pool waits
    longer than the TTL. Through RENEWAL_DATABASE it does not queue at all: the plain
    inline activities that run meanwhile (6 s each, renewed several times) run once,
    and every workflow completes with every attempt its first."""
    marker = tmp_path / "hold"
    marker.touch()
    env = {"SELVEDGE_TEST_PGBOUNCER_PORT": str(small_pgbouncer.port)}  # RENEWAL_DATABASE direct
    proc = worker_process(
        "--worker-id", "pooled", "--max-activities", "6", "--max-resumptions", "8", env=env
    )
    hogs = [
        sv.start_workflow(
            "act.run",
            {
                "activity": "act.tx_long",
                "input": {"tag": f"hog{n}", "seconds": 5},
                "background": True,
            },
        )
        for n in range(6)
    ]
    waits = [
        sv.start_workflow(
            "act.run",
            {
                "activity": "act.wait",
                "input": {
                    "tag": f"plain{n}",
                    "hold_while": str(marker),
                    "mode": "ignore",
                    "max_hold": 6,
                },
            },
        )
        for n in range(4)
    ]
    ids = hogs + waits

    def open_count() -> int:
        return WorkflowInstance.objects.filter(instance_id__in=ids, status="running").count()

    wait_until(lambda: open_count() == 0, timeout=180, interval=0.25)
    statuses = dict(
        WorkflowInstance.objects.filter(instance_id__in=ids).values_list("instance_id", "status")
    )
    starts = Counter(
        entry.rsplit(":", 2)[0]
        for entry in Ledger.objects.filter(entry__startswith="wait:plain").values_list(
            "entry", flat=True
        )
        if entry.endswith(":start")
    )
    hog_rows = Counter(
        entry.rsplit(":", 1)[0]
        for entry in Ledger.objects.filter(entry__startswith="txl:hog").values_list(
            "entry", flat=True
        )
    )
    attempts = Counter(
        ActivityTask.objects.filter(instance_id__in=ids).values_list("attempts", flat=True)
    )
    failed = [iid for iid, status in statuses.items() if status != "completed"]
    twice = {tag: n for tag, n in starts.items() if n > 1}
    summary = f"failed={failed} ran_twice={twice} attempts={dict(attempts)}"
    assert failed == [], summary
    assert starts == Counter({f"wait:plain{n}": 1 for n in range(4)}), summary
    assert hog_rows == Counter({f"txl:hog{n}": 1 for n in range(6)}), summary
    assert set(attempts) == {1}, summary
    assert proc.terminate(timeout=60) == 0


# Run in a process of its own whose engine alias goes through the pool with prepared
# statements (tests/settings.py, SELVEDGE_TEST_PGBOUNCER_PREPARE): a statement prepared in
# one server session, then run again while that session is lent to another client.
PREPARED_SCRIPT = """
import os

import django
import psycopg

django.setup()
from django.db import ProgrammingError, connection

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.storage import store_for

store = store_for("default", Codec())
store.now_ms()
holder = psycopg.connect(
    host="127.0.0.1",
    port=int(os.environ["SELVEDGE_TEST_PGBOUNCER_PORT"]),
    dbname=connection.settings_dict["NAME"],
    user=connection.settings_dict["USER"],
    autocommit=True,
)
holder.execute("BEGIN")
holder.execute("SELECT 1")
try:
    store.now_ms()
except Exception as error:
    print("typed", isinstance(error, sv.PreparedStatementError))
    print("programming", isinstance(error, ProgrammingError))
    print(error)
else:
    print("no error")
"""


def test_prepared_statements_the_pool_did_not_keep_raise_a_typed_error(
    small_pgbouncer: Bouncer,
) -> None:
    """pgbouncer in transaction mode (before 1.21) hands each transaction any server
    session, where the statements psycopg prepared in another one do not exist. The
    engine's statements then raise PreparedStatementError, a ProgrammingError whose
    message says what to change, instead of a bare "prepared statement does not exist"."""
    import sys

    from tests.conftest import ROOT

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "SELVEDGE_PG_TEST_NAME": str(connection.settings_dict["NAME"]),
        "SELVEDGE_TEST_PGBOUNCER_PORT": str(small_pgbouncer.port),
        "SELVEDGE_TEST_PGBOUNCER_PREPARE": "1",
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-c", PREPARED_SCRIPT],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "typed True" in output and "programming True" in output, output
    assert "transaction mode" in output and "prepare_threshold" in output, output
    assert "max_prepared_statements" in output and "1.21" in output, output


# The engine's default (PREPARED_STATEMENTS on, nothing in OPTIONS) or its setting off,
# through the pool: a statement run often enough to be prepared in one server session,
# then run again while that session is lent to another client; then workflows run by a
# Worker through the pool.
ENGINE_PREPARED_SCRIPT = """
import os

import django
import psycopg

django.setup()
from django.db import ProgrammingError, connection

import selvedge_django as sv
from selvedge_django.conf import get_settings
from selvedge_django.engine.codec import Codec
from selvedge_django.storage import store_for
from selvedge_django.worker import Worker

print("prepared_statements", get_settings().prepared_statements)
store = store_for("default", Codec())
for _ in range(8):
    store.now_ms()
holder = psycopg.connect(
    host="127.0.0.1",
    port=int(os.environ["SELVEDGE_TEST_PGBOUNCER_PORT"]),
    dbname=connection.settings_dict["NAME"],
    user=connection.settings_dict["USER"],
    autocommit=True,
)
holder.execute("BEGIN")
holder.execute("SELECT 1")
try:
    for _ in range(3):
        store.now_ms()
    with Worker():
        ids = [sv.start_workflow("scale.three", f"pooled{n}") for n in range(12)]
        outputs = [sv.wait_workflow(i, timeout=60).output for i in ids]
    print("outputs", outputs)
except Exception as error:
    print("typed", isinstance(error, sv.PreparedStatementError))
    print("programming", isinstance(error, ProgrammingError))
    print(error)
else:
    print("no error")
holder.execute("ROLLBACK")
"""


def _run_engine_script(
    bouncer: Bouncer, prepare: str | None, script: str = ENGINE_PREPARED_SCRIPT
) -> str:
    import sys

    from tests.conftest import ROOT

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "SELVEDGE_PG_TEST_NAME": str(connection.settings_dict["NAME"]),
        "SELVEDGE_TEST_PGBOUNCER_PORT": str(bouncer.port),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("SELVEDGE_TEST_PGBOUNCER_PREPARE", None)
    if prepare is not None:
        env["SELVEDGE_TEST_PGBOUNCER_PREPARE"] = prepare
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_the_engines_prepared_statements_through_transaction_pooling_on_and_off(
    small_pgbouncer: Bouncer,
) -> None:
    """On (the default, nothing in DATABASES): pgbouncer before 1.21 hands a transaction
    a server session that lacks the statement the engine prepared in another, and the
    typed error names the setting. Off: the same statements, and workflows run by a
    Worker through the same pool, all pass."""
    on = _run_engine_script(small_pgbouncer, "engine")
    assert "prepared_statements True" in on, on
    assert "typed True" in on and "programming True" in on, on
    assert "PREPARED_STATEMENTS'] = False" in on and "transaction mode" in on, on
    off = _run_engine_script(small_pgbouncer, None)
    assert "prepared_statements False" in off, off
    assert "no error" in off, off
    assert "outputs [6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6]" in off, off


# A bulk enqueue of three batches through the pool (the engine's prepared statements
# off, as behind pgbouncer before 1.21): its statements go out in psycopg's pipeline
# mode inside one transaction, which keeps one server session; then one whose last
# call is bad, which must leave nothing.
BULK_ENQUEUE_SCRIPT = """
import django

django.setup()
from selvedge_django.conf import get_settings
from selvedge_django.models import ActivityTask, WorkflowInstance
from selvedge_django.operations import bulk
from selvedge_django.tasks import enqueue_many
from tests.testapp import tasks

print("prepared_statements", get_settings().prepared_statements)
bulk.TASK_BATCH = 50
results = enqueue_many([(tasks.add, [n, 1], {}) for n in range(120)])
ids = [r.id for r in results]
print("instances", WorkflowInstance.objects.filter(instance_id__in=ids).count())
print("queued", ActivityTask.objects.filter(instance_id__in=ids, status="queued").count())
try:
    enqueue_many([(tasks.add, [n, 1], {}) for n in range(120)] + [(tasks.add, [object()], {})])
except Exception as error:
    print("rejected", type(error).__name__)
print("in all", WorkflowInstance.objects.count())
"""


def test_a_bulk_enqueue_in_batches_passes_through_transaction_pooling(
    pgbouncer: Bouncer,
) -> None:
    output = _run_engine_script(pgbouncer, None, BULK_ENQUEUE_SCRIPT)
    assert "prepared_statements False" in output, output
    assert "instances 120" in output and "queued 120" in output, output
    assert "rejected" in output and "in all 120" in output, output


def settings_selvedge() -> dict[str, object]:
    from django.conf import settings

    return dict(settings.SELVEDGE)
