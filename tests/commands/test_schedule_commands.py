"""``runselvedge schedules``: list, describe, pause, unpause, trigger, backfill, delete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

import selvedge_django as sv
from selvedge_django.schedules import schedule_store
from tests.conftest import ROOT


def run(*args: str) -> str:
    out = StringIO()
    call_command("runselvedge", "schedules", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def fails(*args: str) -> str:
    with pytest.raises((CommandError, SystemExit)) as caught:
        call_command("runselvedge", "schedules", *args, stdout=StringIO(), stderr=StringIO())
    return str(caught.value)


def test_list_describe_pause_unpause_trigger_delete(tdb: None) -> None:
    sv.create_schedule("b-cmd", "sched.echo", interval=60)
    sv.create_schedule("a-cmd", "sched.echo", cron="0 5 * * *", timezone="Europe/Paris")
    listed = [json.loads(line) for line in run("list").splitlines()]
    assert [s["name"] for s in listed] == ["a-cmd", "b-cmd"]
    assert listed[0]["cron"] == "0 5 * * *" and listed[1]["interval"] == 60.0
    described = json.loads(run("describe", "a-cmd"))
    assert described["timezone"] == "Europe/Paris" and described["next_run_at"]
    assert run("pause", "a-cmd").strip() == "paused a-cmd"
    assert json.loads(run("describe", "a-cmd"))["paused"] is True
    assert run("unpause", "a-cmd").strip() == "unpaused a-cmd"
    started = run("trigger", "b-cmd").strip()
    assert started.startswith("started b-cmd@")
    assert json.loads(run("describe", "b-cmd"))["recent_instance_ids"] == [started.split()[1]]
    assert run("delete", "b-cmd").strip() == "deleted b-cmd"
    assert "not found" in fails("describe", "b-cmd")
    assert "not found" in fails("trigger", "no such")


def test_backfill_prints_each_slot_and_starts_it_once(tdb: None) -> None:
    sv.create_schedule("fill", "sched.echo", cron="*/10 * * * *")
    now = datetime.fromtimestamp(schedule_store().now_ms() / 1000, UTC)
    end = now.replace(minute=now.minute - now.minute % 10, second=0, microsecond=0)
    start = end - timedelta(minutes=30)
    args = ("backfill", "fill", start.isoformat(), end.isoformat())
    first = run(*args).splitlines()
    assert first[:-1] == [
        f"fill@{(start + timedelta(minutes=m)).strftime('%Y-%m-%dT%H:%M:%SZ')}" for m in (0, 10, 20)
    ]
    assert first[-1] == "backfill of fill: 3 slots, each started once"
    assert run(*args).splitlines() == first
    assert sv.describe_schedule("fill").runs_started == 3


def test_backfill_refuses_times_without_an_offset(tdb: None) -> None:
    sv.create_schedule("fill", "sched.echo", interval=60)
    message = fails("backfill", "fill", "2030-01-01T00:00:00", "2030-01-02T00:00:00Z")
    assert "offset" in message or "2" in message


def test_common_options_work_after_an_actions_arguments(tdb: None) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SELVEDGE_TEST_SUBPROCESS": "1"}
    if connection.vendor == "postgresql":
        env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    sv.create_schedule("seen", "sched.echo", interval=60)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "runselvedge",
            "schedules",
            "list",
            "-v",
            "0",
            "--settings",
            "tests.settings",
        ],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["name"] == "seen"


def test_a_stored_host_dependent_timezone_is_an_error_and_writes_nothing(tdb: None) -> None:
    from selvedge_django.models import Schedule

    sv.create_schedule("host-cmd", "sched.echo", cron="0 3 * * *", timezone="Europe/Paris")
    sv.pause_schedule("host-cmd")
    Schedule.objects.filter(name="host-cmd").update(timezone="localtime")
    assert "IANA" in fails("unpause", "host-cmd")
    assert "IANA" in fails("backfill", "host-cmd", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")
    assert sv.describe_schedule("host-cmd").paused
    assert json.loads(run("describe", "host-cmd"))["timezone"] == "localtime"  # still readable
