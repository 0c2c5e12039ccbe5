"""runselvedge pause, unpause and queues, and the paused queues of status --json."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import selvedge_django as sv
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker


def run(*args: str) -> str:
    out = StringIO()
    call_command("runselvedge", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def fails(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        call_command("runselvedge", *args, stdout=StringIO(), stderr=StringIO())
    return str(caught.value)


def test_pause_and_unpause_one_instance(tdb: None) -> None:
    iid = sv.start_workflow("pause.receive", None)
    run_until_idle(Worker())
    assert run("pause", iid, "--reason", "looking into it") == f"paused {iid}\n"
    description = json.loads(run("describe", iid))
    assert (description["paused"], description["paused_reason"]) == (True, "looking into it")
    assert "paused already" in fails("pause", iid)
    assert run("unpause", iid) == f"unpaused {iid}\n"
    assert "not paused" in fails("unpause", iid)
    assert "not found" in fails("pause", "cli-missing")


def test_bulk_pause_and_unpause_by_workflow_with_dry_run(tdb: None) -> None:
    ids = [sv.start_workflow("pause.receive", None, instance_id=f"p-{n}") for n in range(3)]
    other = sv.start_workflow("pause.timers", None)
    run_until_idle(Worker())
    assert run("pause", "--workflow", "pause.receive", "--dry-run").splitlines() == [
        *(f"would pause {i}" for i in ids),
        "pause: would act on 3 instance(s)",
    ]
    assert not any(sv.describe(i).paused for i in ids)
    out = run("pause", "--workflow", "pause.receive", "--reason", "provider down")
    assert out.splitlines()[-1] == "pause: acted on 3 instance(s)"
    assert all(sv.describe(i).paused_reason == "provider down" for i in ids)
    assert not sv.describe(other).paused
    # Again: nothing is left to pause.
    assert run("pause", "--workflow", "pause.receive") == "pause: acted on 0 instance(s)\n"
    assert run("unpause", "--since", "1h").splitlines()[-1] == "unpause: acted on 3 instance(s)"
    assert not any(sv.describe(i).paused for i in ids)
    assert "--status running" in fails("pause", "--status", "failed")


def test_queues_list_pause_and_unpause(tdb: None) -> None:
    assert run("queues", "pause", "pq") == "paused queue 'pq'\n"
    assert run("queues", "pause", "pq") == "queue 'pq' was paused\n"
    sv.start_workflow("pause.activity", 1)
    run_until_idle(Worker())
    listed = [json.loads(line) for line in run("queues", "list").splitlines()]
    assert [(q["name"], q["paused"], q["queued"], q["running"]) for q in listed] == [
        ("pq", True, 1, 0)
    ]
    report = json.loads(run("status", "--json"))
    assert report["queues"]["pq"]["paused"] is True
    assert report["queues"]["pq"]["queued"] == 1
    assert "pq (paused)" in run("status")
    assert run("queues", "unpause", "pq") == "unpaused queue 'pq'\n"
    assert run("queues", "unpause", "pq") == "queue 'pq' was not paused\n"
    assert json.loads(run("status", "--json"))["queues"]["pq"]["paused"] is False
    assert run("queues", "pause", "") == "paused queue ''\n"
    assert "NUL" in fails("queues", "pause", "a\x00b")


def test_bulk_pause_by_search_attribute(tdb: None) -> None:
    acme = [
        sv.start_workflow(
            "pause.receive", None, instance_id=f"acme-{n}", attributes={"tenant": "acme"}
        )
        for n in range(2)
    ]
    other = sv.start_workflow("pause.receive", None, attributes={"tenant": "globex"})
    run_until_idle(Worker())
    out = run("pause", "--attr", "tenant=acme", "--reason", "acme's ledger is read-only")
    assert out.splitlines()[-1] == "pause: acted on 2 instance(s)"
    assert [sv.describe(i).paused for i in acme] == [True, True]
    assert not sv.describe(other).paused
    assert run("unpause", "--attr", "tenant=acme").splitlines()[-1] == (
        "unpause: acted on 2 instance(s)"
    )
