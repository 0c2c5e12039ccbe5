"""``runselvedge status`` as a real process, about real ``runselvedge worker`` processes.

Two workers start, one is killed (its heartbeat row expires: a lost worker, and the other
takes over as leader), the other stops gracefully (its row is deleted). The leader lease is
short here (``SELVEDGE_TEST_LEADER_LEASE``), so heartbeats come every half second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from django.db import connection

import selvedge_django as sv
from tests.conftest import ROOT, WorkerProcess, wait_until

LEASE = {"SELVEDGE_TEST_LEADER_LEASE": "3"}


def runselvedge_status(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py runselvedge status`` on the test database."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": str(ROOT),
        **LEASE,
    }
    if connection.vendor == "postgresql":
        env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    return subprocess.run(
        [sys.executable, "-m", "django", "runselvedge", "status", *args],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def status_json() -> dict[str, Any]:
    done = runselvedge_status("--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def status_when(predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def check() -> bool:
        seen[:] = [status_json()]
        return predicate(seen[0])

    try:
        wait_until(check, timeout=40, interval=0.2)
    except AssertionError:
        raise AssertionError(f"last status: {json.dumps(seen, indent=2)}") from None
    return seen[0]


def alive(report: dict[str, Any]) -> list[str]:
    return [w["worker_id"] for w in report["workers"]]


def test_status_follows_workers_that_start_die_and_stop(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    first = worker_process("--worker-id", "proc-a", "--queues", "other", env=LEASE)
    second = worker_process("--worker-id", "proc-b", "--queues", "other", env=LEASE)
    report = status_when(lambda r: alive(r) == ["proc-a", "proc-b"] and r["leader"] is not None)
    by_id = {w["worker_id"]: w for w in report["workers"]}
    assert by_id["proc-a"]["pid"] == first.proc.pid
    assert by_id["proc-b"]["pid"] == second.proc.pid
    assert by_id["proc-a"]["queues"] == ["other"]
    assert report["warnings"] == []

    # An activity on a queue neither serves: queued, and seen as such.
    iid = sv.start_workflow("status.parked_flow", 7)
    report = status_when(lambda r: r["queues"].get("status-parked", {}).get("queued") == 1)
    assert report["queues"]["status-parked"]["running"] == 0

    # Kill the leader: its row expires (a lost worker) and the other one leads.
    leader = report["leader"]
    other = "proc-b" if leader == "proc-a" else "proc-a"
    (first if leader == "proc-a" else second).kill()
    report = status_when(lambda r: alive(r) == [other] and r["leader"] == other)
    assert [w["worker_id"] for w in report["lost_workers"]] == [leader]

    # The table for people says the same.
    table = runselvedge_status()
    assert table.returncode == 0, table.stderr
    assert "workers alive: 1" in table.stdout
    assert f"{other} (leader)" in table.stdout
    assert "workers lost" in table.stdout and leader in table.stdout
    assert "status-parked" in table.stdout

    # A graceful stop deletes the row: nobody alive, and nobody else lost.
    sv.cancel_workflow(iid, "done")
    assert (second if other == "proc-b" else first).terminate() == 0
    report = status_json()
    assert alive(report) == [] and report["leader"] is None
    assert [w["worker_id"] for w in report["lost_workers"]] == [leader]
    assert "no worker is alive" in report["warnings"]
