"""SQLite write transactions take turns, within the busy timeout.

Real threads on the real test database file: one holds a write transaction, others
wait for it the way a worker's threads do; real processes for the turn between
processes (the lock of the file beside the database).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connection, connections

import selvedge_django as sv
from selvedge_django.conf import get_settings
from selvedge_django.engine.codec import Codec
from selvedge_django.models import ActivityTask, WorkflowInstance
from selvedge_django.storage import store_for
from selvedge_django.storage.sqlite.turns import _PATIENCE, TURN_FILE_SUFFIX, _writer_locks
from tests.conftest import wait_until
from tests.testapp.models import Ledger

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's single writer only"),
]


def _store() -> Any:
    return store_for("default", Codec(), get_settings())


def _with_timeout(seconds: float) -> None:
    """Give this thread's connection a busy timeout of its own (a new connection)."""
    conn = connections["default"]
    conn.close()
    settings = dict(conn.settings_dict)
    settings["OPTIONS"] = {**settings.get("OPTIONS", {}), "timeout": seconds}
    conn.settings_dict = settings


def _hold_write_lock(ready: threading.Event, release: threading.Event) -> threading.Thread:
    def hold() -> None:
        try:
            with _store().atomic():
                ready.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    assert ready.wait(10)
    return thread


def _write_with_timeout(seconds: float, body: Callable[[], None]) -> dict[str, Any]:
    """Run ``body`` in a write transaction on a thread whose connection has a busy timeout
    of ``seconds``: "error" (the "database is locked" text), "waited" (s) in the outcome."""
    outcome: dict[str, Any] = {}

    def write() -> None:
        _with_timeout(seconds)
        began = time.monotonic()
        try:
            with _store().atomic():
                body()
        except OperationalError as error:
            outcome["error"] = str(error)
        finally:
            outcome["waited"] = time.monotonic() - began
            connections.close_all()

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(60)
    return outcome


def test_writers_of_one_process_each_commit_once_in_turn(tdb: None) -> None:
    ready, release = threading.Event(), threading.Event()
    holder = _hold_write_lock(ready, release)
    order: list[int] = []
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            with _store().atomic():
                order.append(n)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            connections.close_all()

    writers = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in writers:
        thread.start()
    release.set()
    holder.join(10)
    for thread in writers:
        thread.join(30)
    assert errors == [] and sorted(order) == list(range(8))


def _waiting_for_the_turn() -> int:
    """How many threads of this process wait for the writer's turn of the test database."""
    name = str(connections["default"].settings_dict["NAME"])
    return _writer_locks[name].waiting


def test_a_writer_asking_again_waits_behind_one_waiting_past_the_patience(tdb: None) -> None:
    """A writer that commits and at once asks again (a worker's busy loop) does not pass
    a writer that has waited longer than the turn's patience, however often it asks."""
    order: list[str] = []
    holding, again = threading.Event(), threading.Event()

    def first() -> None:
        try:
            with _store().atomic():
                order.append("first")
                holding.set()
                again.wait(30)
            for n in range(3):
                with _store().atomic():
                    order.append(f"again {n}")
        finally:
            connections.close_all()

    def second() -> None:
        try:
            with _store().atomic():
                order.append("second")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert holding.wait(10)
    threads[1].start()
    wait_until(lambda: _waiting_for_the_turn() == 1)
    time.sleep(2 * _PATIENCE)  # the scenario: the second writer has waited past it
    again.set()
    for thread in threads:
        thread.join(30)
    assert order == ["first", "second", "again 0", "again 1", "again 2"]


def test_a_lease_taken_after_a_long_wait_for_the_turn_is_held_from_when_it_was_taken(
    make_worker: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A dispatcher that waits longer than a lease's belief (TTL - MARGIN - MAX_SKEW,
    2.5 s here) for the writer's turn, behind a long transaction of the project, holds
    the lease it then takes from the moment it took it: the execution runs to its end
    without losing the lease."""
    instance_id = sv.start_workflow("act.run", {"activity": "act.step", "input": {"tag": "late"}})
    ready, release = threading.Event(), threading.Event()
    holder = _hold_write_lock(ready, release)
    belief = get_settings().lease.belief
    try:
        with caplog.at_level(logging.WARNING, logger="selvedge_django"):
            make_worker()
            wait_until(lambda: _waiting_for_the_turn() >= 1)
            # The project's transaction goes on past a whole belief after the
            # dispatcher began to wait.
            release.wait(belief + 1)
            release.set()
            holder.join(10)
            result = sv.get_handle(instance_id).result(timeout=60)
    finally:
        release.set()
        holder.join(10)
    assert result["tag"] == "late"
    lost = [r.getMessage() for r in caplog.records if "LeaseLost" in r.getMessage()]
    assert lost == []


def test_a_start_that_waited_long_for_the_turn_runs_here_without_losing_its_lease(
    make_worker: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A start made with a worker in this process while a long transaction of the
    project holds the write lock (longer than a lease's belief) is leased to that worker
    from when its insert ran: the worker runs it to its end without losing the lease."""
    make_worker()
    ready, release = threading.Event(), threading.Event()
    started: list[str] = []

    def start() -> None:
        try:
            started.append(
                sv.start_workflow("act.run", {"activity": "act.step", "input": {"tag": "here"}})
            )
        finally:
            connections.close_all()

    holder = _hold_write_lock(ready, release)
    starter = threading.Thread(target=start)
    try:
        with caplog.at_level(logging.WARNING, logger="selvedge_django"):
            starter.start()
            wait_until(lambda: _waiting_for_the_turn() >= 1)
            release.wait(get_settings().lease.belief + 1)  # the project's long transaction
            release.set()
            holder.join(10)
            starter.join(30)
            result = sv.get_handle(started[0]).result(timeout=60)
    finally:
        release.set()
        holder.join(10)
        starter.join(30)
    assert result["tag"] == "here"
    assert [r.getMessage() for r in caplog.records if "LeaseLost" in r.getMessage()] == []


def test_waiting_for_the_turn_counts_against_the_busy_timeout(tdb: None) -> None:
    """A writer behind a transaction held past the busy timeout fails after about that
    timeout once (the turn's wait is not added to SQLite's own wait)."""
    ready, release = threading.Event(), threading.Event()
    holder = _hold_write_lock(ready, release)
    outcome = _write_with_timeout(2, lambda: None)
    release.set()
    holder.join(10)
    assert "database is locked" in outcome.get("error", ""), outcome
    # 2 s of turn and nothing left for SQLite; without the shortening it waited 4 s.
    assert 1.9 <= outcome["waited"] < 3.5, outcome


# Another process: whether the turn file's lock is free (prints "free" or "held").
_PROBE_TURN = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held")
"""
# Another process holding the turn file's lock until its standard input closes.
_HOLD_TURN = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def _turn_file() -> str:
    return str(connections["default"].settings_dict["NAME"]) + TURN_FILE_SUFFIX


def _turn_seen_from_another_process() -> str:
    probe = [sys.executable, "-c", _PROBE_TURN, _turn_file()]
    return subprocess.run(probe, capture_output=True, text=True, timeout=60, check=True).stdout


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_another_process_sees_the_turn_taken_for_as_long_as_a_write_transaction(
    tdb: None,
) -> None:
    ready, release = threading.Event(), threading.Event()
    holder = _hold_write_lock(ready, release)
    try:
        assert _turn_seen_from_another_process().strip() == "held"
    finally:
        release.set()
        holder.join(10)
    assert _turn_seen_from_another_process().strip() == "free"


def _ledger_entry() -> None:
    Ledger.objects.create(entry="past-the-turn")


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_a_process_keeping_the_turn_delays_a_writer_by_the_busy_timeout_only(
    tdb: None,
) -> None:
    """The wait for another process's turn counts against the busy timeout, and a writer
    whose turn does not come goes on at SQLite's lock (free here): it writes."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD_TURN, _turn_file()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as hold:
        assert hold.stdin is not None and hold.stdout is not None
        try:
            assert hold.stdout.readline().strip() == "held"
            outcome = _write_with_timeout(2, _ledger_entry)
        finally:
            hold.stdin.close()
            hold.wait(30)
    assert "error" not in outcome, outcome
    assert Ledger.objects.filter(entry="past-the-turn").count() == 1
    assert 1.9 <= outcome["waited"] < 10, outcome


def test_writes_go_on_without_the_turn_file_when_it_cannot_be_opened(
    tdb: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the file beside the database cannot be made (here a directory holds its
    name), processes meet at SQLite's lock alone, as without it; the log says why."""
    conn = connections["default"]
    conn.close()
    settings = dict(conn.settings_dict)
    name = tmp_path / "elsewhere.sqlite3"
    (tmp_path / f"elsewhere.sqlite3{TURN_FILE_SUFFIX}").mkdir()
    conn.settings_dict = {**settings, "NAME": str(name)}
    try:
        with caplog.at_level(logging.WARNING, logger="selvedge_django.store"):
            for n in range(2):
                with _store().atomic(), conn.cursor() as cursor:
                    cursor.execute("CREATE TABLE IF NOT EXISTS kept (n INTEGER)")
                    cursor.execute("INSERT INTO kept VALUES (%s)", [n])
            with conn.cursor() as cursor:
                cursor.execute("SELECT n FROM kept ORDER BY n")
                assert [row[0] for row in cursor.fetchall()] == [0, 1]
    finally:
        conn.close()
        conn.settings_dict = settings
    warnings = [r.getMessage() for r in caplog.records if TURN_FILE_SUFFIX in r.getMessage()]
    assert len(warnings) == 1 and "busy handler" in warnings[0], warnings


def test_renewals_take_the_turn_before_a_saturating_worker_s_writes(
    make_worker: Callable[..., Any], tmp_path: Path
) -> None:
    """One worker keeps the database busy with transactional attempts (each holds the
    write lock for 1 s) while plain activities of 6 s run inline with max_attempts=1:
    their claims (4 s TTL) live only if every renewal gets the writer's turn within a
    few seconds, ahead of the queue of the worker's own writes. None may run twice,
    and none may fail."""
    marker = tmp_path / "hold"
    marker.touch()
    make_worker(max_concurrent_activities=16, max_concurrent_resumptions=10)
    hogs = [
        sv.start_workflow(
            "act.run",
            {
                "activity": "act.tx_long",
                "input": {"tag": f"sat{n}", "seconds": 1.0},
                "background": True,
            },
        )
        for n in range(30)
    ]
    waits = [
        sv.start_workflow(
            "act.run",
            {
                "activity": "act.wait",
                "input": {
                    "tag": f"lone{n}",
                    "hold_while": str(marker),
                    "mode": "ignore",
                    "max_hold": 6,
                },
                "options": {"retry_policy": {"max_attempts": 1}},
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
        for entry in Ledger.objects.filter(entry__startswith="wait:lone").values_list(
            "entry", flat=True
        )
        if entry.endswith(":start")
    )
    attempts = Counter(
        ActivityTask.objects.filter(instance_id__in=ids).values_list("attempts", flat=True)
    )
    failed = [iid for iid, status in statuses.items() if status != "completed"]
    twice = {tag: n for tag, n in starts.items() if n > 1}
    summary = f"failed={len(failed)} ran_twice={twice} attempts={dict(attempts)}"
    assert failed == [], summary
    assert starts == Counter({f"wait:lone{n}": 1 for n in range(4)}), summary
    assert set(attempts) == {1}, summary
