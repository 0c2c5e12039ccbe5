"""Shared fixtures: real databases, real worker threads and real worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

ROOT = Path(__file__).resolve().parent.parent


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} seconds")
        time.sleep(interval)


def _delete_instead_of_truncate() -> None:
    """Empty PostgreSQL test tables with DELETE between transactional tests.

    Django's flush TRUNCATEs every table after each ``transactional_db`` test, which
    on PostgreSQL makes new files for each table: about 0.25 s a test here, most of
    the PostgreSQL suite's wall time. The tables hold a few rows by then, and
    DELETE empties them in milliseconds (the foreign keys are deferred to the
    flush's commit). Sequences keep counting, which no test relies on.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(
        self: Any,
        style: Any,
        tables: Any,
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if reset_sequences or allow_cascade or not tables:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        return [f"DELETE FROM {self.quote_name(table)};" for table in tables]

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _delete_instead_of_truncate()


# A bystander on the machine's PostgreSQL server: a connection opened before the first
# test and checked after the last one. The suite shares the server with whatever else
# runs beside it; a test that restarted or reconfigured it (instead of a cluster of its
# own, tests/pgcluster.py) would drop this connection and fail the run here.
_bystander: Any = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _bystander
    from django.conf import settings

    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql") or os.environ.get("SELVEDGE_TEST_PGBOUNCER_PORT"):
        return
    import psycopg

    _bystander = psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db["USER"],
        password=db["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
        application_name="selvedge-test-bystander",
    )
    _bystander.execute("SELECT 1")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _bystander is None:
        return
    import psycopg

    try:
        _bystander.execute("SELECT 1")
    except psycopg.Error as exc:
        print(f"\nthe machine's PostgreSQL dropped a bystander's connection during the run: {exc}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    finally:
        _bystander.close()


@pytest.fixture
def tdb(transactional_db: None) -> None:
    """A real (transactional) test database that worker threads and processes can see."""


@contextlib.contextmanager
def extra_database(alias: str, settings_dict: dict[str, Any]) -> Iterator[None]:
    """Declare the ``DATABASES`` alias ``alias`` for the block (Django's defaults filled in).

    Declared after the test's databases were set up, the alias is neither created
    nor flushed by the test case: the block points it at a database that exists, and
    removes it before the test case's teardown walks the aliases. The test case
    refuses to open a connection of an alias it was not told about, so the block
    opens this one at once (Django's own ``connect()``) and keeps it open (the test
    client does not close connections after a request).
    """
    from django.conf import settings

    filled = connections.configure_settings(
        {
            "default": dict(connections["default"].settings_dict),
            alias: {**settings_dict, "CONN_MAX_AGE": None},
        }
    )[alias]
    declared = [connections.settings]
    if settings.DATABASES is not connections.settings:
        declared.append(settings.DATABASES)
    for databases in declared:
        databases[alias] = filled
    try:
        connections[alias].connect()
        yield
    finally:
        for opened in connections.all(initialized_only=True):
            if opened.alias == alias:
                opened.close()
                del connections[alias]
        for databases in declared:
            databases.pop(alias, None)


@pytest.fixture
def redefine() -> Iterator[Callable[[str, Callable[..., Any]], None]]:
    """Register another function under a workflow name for one test (a code change).

    The original registration comes back after the test.
    """
    import selvedge_django as sv
    from selvedge_django import registry

    saved: dict[str, Any] = {}

    def define(name: str, fn: Callable[..., Any]) -> None:
        if name not in saved:
            saved[name] = registry.get_workflow(name)
        registry.unregister(name, kind="workflow")
        sv.workflow(name=name)(fn)

    yield define
    for name, original in saved.items():
        registry.unregister(name, kind="workflow")
        if original is not None:
            sv.workflow(name=name)(original.fn)


@pytest.fixture
def worker(tdb: None) -> Iterator[Any]:
    """A started in-process Worker, stopped after the test."""
    from selvedge_django.worker import Worker

    w = Worker()
    w.start()
    try:
        yield w
    finally:
        w.stop(timeout=10)


@pytest.fixture
def make_worker(tdb: None) -> Iterator[Callable[..., Any]]:
    """Build started Workers with overrides; all are stopped after the test."""
    from selvedge_django.worker import Worker

    started: list[Worker] = []

    def make(**overrides: Any) -> Worker:
        w = Worker(**overrides)
        w.start()
        started.append(w)
        return w

    yield make
    for w in started:
        w.stop(timeout=10)


class WorkerProcess:
    """A real ``manage.py runselvedge worker`` process on the test database."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, wait_started: bool = True
    ) -> None:
        """Start the process; unless ``wait_started`` is false, wait for its "started" line.

        A worker expected to die at a crash point may do so before it prints that
        line: its loops start first, and work may already be waiting for them.
        """
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "SELVEDGE_TEST_SUBPROCESS": "1",
            "PYTHONPATH": str(ROOT),
            # A worker that does not exit in time is aborted: faulthandler then prints
            # every thread's stack into the output that the failure reports.
            "PYTHONFAULTHANDLER": "1",
            **(env or {}),
        }
        if connection.vendor == "postgresql":
            full_env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runselvedge", "worker", "-v", "1", *args],
            cwd=str(ROOT),
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if not wait_started:
            return
        # System checks may warn before the "started" line (W008 behind a pooler, say):
        # those lines are kept, and the wait goes on to the line that says it started.
        self.before_start: list[str] = []
        line = ""
        while self.proc.stdout is not None and len(self.before_start) < 100:
            line = self.proc.stdout.readline()
            if not line or "started" in line:
                break
            self.before_start.append(line)
        if "started" not in line:
            rest = "".join(self.before_start)
            rest += self.proc.stdout.read() if self.proc.stdout else ""
            # Reaped and closed here: the caller never gets the object to clean up.
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            raise AssertionError(f"worker did not start: {line}{rest}")

    def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait for the graceful exit; return the exit status.

        A process still running after ``timeout`` is aborted and the test fails
        with its output, which ends with the stack of every thread.
        """
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            raise AssertionError(
                f"worker did not exit within {timeout} s of SIGTERM; its output:\n{self.output()}"
            ) from None

    def output(self) -> str:
        return self.proc.stdout.read() if self.proc.stdout else ""


@pytest.fixture
def worker_process(tdb: None) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real worker processes; any still running are killed after the test."""
    procs: list[WorkerProcess] = []

    def start(
        *args: str, env: dict[str, str] | None = None, wait_started: bool = True
    ) -> WorkerProcess:
        p = WorkerProcess(*args, env=env, wait_started=wait_started)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.proc.poll() is None:
            p.kill()
        if p.proc.stdout is not None:
            p.proc.stdout.close()
