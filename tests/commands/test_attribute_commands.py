"""``runselvedge list --attr`` and the bulk resume, fork and terminate selected by attributes."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import selvedge_django as sv
from selvedge_django.models import WorkflowInstance
from selvedge_django.operations.recovery import select_instances
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests.integration.test_attributes import FAIL_ONCE, fails


def run(*args: str) -> str:
    out = StringIO()
    call_command("runselvedge", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        call_command("runselvedge", *args, stdout=StringIO(), stderr=StringIO())
    return str(caught.value)


def listed(*args: str) -> list[str]:
    return [json.loads(line)["instance_id"] for line in run("list", *args).splitlines()]


def test_list_filters_by_attributes(tdb: None) -> None:
    sv.start_workflow(
        "test.sum3", None, instance_id="a1", attributes={"tenant": "acme", "order": 7}
    )
    sv.start_workflow(
        "test.sum3", None, instance_id="a2", attributes={"tenant": "acme", "vip": True}
    )
    sv.start_workflow(
        "test.sum3", None, instance_id="g1", attributes={"tenant": "globex", "order": "7"}
    )
    assert sorted(listed("--attr", "tenant=acme")) == ["a1", "a2"]
    # A value matches the text and what it spells: the number 7 and the string "7".
    assert sorted(listed("--attr", "order=7")) == ["a1", "g1"]
    assert listed("--attr", "tenant=acme", "--attr", "order=7") == ["a1"]
    assert listed("--attr", "vip=true") == ["a2"]
    assert listed("--attr", "tenant=acme", "--status", "completed") == []
    line = json.loads(run("list", "--attr", "order=7", "--workflow", "sum3", "--limit", "1"))
    assert line["attributes"]["order"] in (7, "7")
    assert "twice" in refused("list", "--attr", "tenant=a", "--attr", "tenant=b")


@pytest.mark.parametrize("bad", ["tenant", "Tenant=acme", "=acme"])
def test_a_malformed_attr_is_a_usage_error(tdb: None, bad: str) -> None:
    with pytest.raises((CommandError, SystemExit)):
        call_command("runselvedge", "list", "--attr", bad, stdout=StringIO(), stderr=StringIO())


def test_bulk_resume_fork_and_terminate_select_by_attributes(tdb: None) -> None:
    for tag in ("x1", "x2", "y1"):
        FAIL_ONCE[tag] = True
        tenant = "acme" if tag.startswith("x") else "globex"
        sv.start_workflow(fails, tag, instance_id=f"run-{tag}", attributes={"tenant": tenant})
    run_until_idle(Worker())
    assert set(WorkflowInstance.objects.values_list("status", flat=True)) == {"failed"}
    assert run("fork", "--attr", "tenant=globex", "--dry-run") == (
        "would fork run-y1\nfork: would act on 1 instance(s)\n"
    )
    out = run("resume", "--attr", "tenant=acme", "--reason", "fixed")
    assert out.splitlines()[-1] == "resume: acted on 2 instance(s)"
    statuses = dict(WorkflowInstance.objects.values_list("instance_id", "status"))
    assert statuses == {"run-x1": "running", "run-x2": "running", "run-y1": "failed"}
    out = run("terminate", "--attr", "tenant=acme", "--reason", "offboarded")
    assert out.splitlines()[-1] == "terminate: acted on 2 instance(s)"
    out = run("fork", "--attr", "tenant=globex")
    assert out.splitlines()[0] == "forked run-y1 as run-y1/fork-1"
    assert sv.describe("run-y1/fork-1").attributes == {"tenant": "globex", "stage": "one"}
    # The selection the bulk operations share (and a pause can reuse).
    batches = list(select_instances(status="failed", attributes={"tenant": "acme"}))
    assert batches == [["run-x1", "run-x2"]]
    with pytest.raises(ValueError):
        list(select_instances(status="failed", attributes={"tenant__like": "a"}))
