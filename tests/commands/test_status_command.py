"""``runselvedge status`` through ``call_command``: its options, its two outputs.

The command against real worker processes is tests/processes/test_status_processes.py.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import selvedge_django as sv


def run(*args: str) -> str:
    out = StringIO()
    call_command("runselvedge", "status", *args, stdout=out)
    return out.getvalue()


def test_stuck_after_sets_when_an_undispatched_instance_counts_as_stuck(tdb: None) -> None:
    iid = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    assert json.loads(run("--json"))["stuck"] == []
    report = json.loads(run("--json", "--stuck-after", "0s"))
    assert [(s["instance_id"], s["reason"]) for s in report["stuck"]] == [(iid, "not_dispatched")]
    table = run("--stuck-after", "0")
    assert "stuck:" in table and iid in table and "not_dispatched" in table
    assert "WARNING: no worker is alive" in table
    assert "instances running: 1   runnable: 1" in table


def test_a_bad_duration_is_refused(tdb: None) -> None:
    with pytest.raises(CommandError, match="invalid duration"):
        run("--stuck-after", "soon")
