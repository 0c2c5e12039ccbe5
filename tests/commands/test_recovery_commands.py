"""runselvedge resume, fork and terminate: one instance, or a selection in batches."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

import selvedge_django as sv
from selvedge_django.engine.codec import error_to_envelope
from selvedge_django.models import ArchivedHistoryEvent, HistoryEvent, WorkflowInstance
from selvedge_django.operations.recovery import MAX_SELECTION_BATCH
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests.integration.test_resume import closed_in_every_way, drive, failed_order
from tests.testapp.workflows import recovery as resume_flows


@pytest.fixture(autouse=True)
def broken() -> None:
    resume_flows.BROKEN.clear()
    resume_flows.RUNS.clear()


def run(*args: str) -> str:
    out = StringIO()
    call_command("runselvedge", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def fails(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        call_command("runselvedge", *args, stdout=StringIO(), stderr=StringIO())
    return str(caught.value)


def test_resume_and_fork_one_instance(tdb: None) -> None:
    iid = failed_order("cli-1")
    resume_flows.BROKEN.clear()
    assert run("fork", iid, "--id", "cli-1-copy") == f"forked {iid} as cli-1-copy\n"
    assert sv.describe("cli-1-copy").forked_from == iid
    assert run("resume", iid, "--reason", "fixed") == f"resumed {iid} (generation 2)\n"
    assert fails("resume", iid) == f"workflow instance {iid!r} is running"
    assert drive(iid) == "completed"
    assert "not in the current history" in fails("fork", iid, "--from", "nope")
    assert fails("resume", "cli-missing") == "workflow instance 'cli-missing' not found"
    assert "not both" in fails("resume", iid, "--status", "failed")
    assert "not both" in fails("resume")
    assert "one instance" in fails("fork", "--status", "failed", "--id", "x")
    assert "unknown status" in fails("resume", "--status", "broken")


def test_bulk_terminate_with_dry_run(tdb: None) -> None:
    ids = [sv.start_workflow("resume.signals", None, instance_id=f"t-{n}") for n in range(3)]
    sv.start_workflow("resume.order", "other", instance_id="t-other")
    run_until_idle(Worker(run_local_starts=False))
    out = run("terminate", "--workflow", "resume.signals", "--dry-run")
    assert out.splitlines() == [
        *(f"would terminate {i}" for i in ids),
        "terminate: would act on 3 instance(s)",
    ]
    assert {sv.describe(i).status for i in ids} == {"running"}
    out = run("terminate", "--workflow", "resume.signals", "--since", "1h", "--reason", "bulk")
    assert out.splitlines()[-1] == "terminate: acted on 3 instance(s)"
    assert {sv.describe(i).status for i in ids} == {"failed"}
    assert sv.describe("t-other").status == "running"


def closed_instances(count: int) -> list[str]:
    """``count`` failed ops.echo instances with their close rows, written in bulk."""
    now = timezone.now()
    # Failed on their own (a terminated run is left alone by a bulk resume).
    error = json.dumps(error_to_envelope(sv.ApplicationError("seeded"), with_traceback=False))
    ids = [f"bulk-{n:04d}" for n in range(count)]
    WorkflowInstance.objects.bulk_create(
        WorkflowInstance(
            instance_id=i,
            workflow_name="ops.echo",
            status="failed",
            input=n,
            error=error,
            runnable=False,
            lease_epoch=1,
            started_at=now,
            updated_at=now,
            closed_at=now,
        )
        for n, i in enumerate(ids)
    )
    HistoryEvent.objects.bulk_create(
        HistoryEvent(
            instance_id=i, key="$close", command="close", event_type="WorkflowFailed", data=error
        )
        for i in ids
    )
    return ids


def test_bulk_resume_of_a_thousand_failed_instances_is_batched_and_idempotent(
    tdb: None,
) -> None:
    ids = closed_instances(1000)
    selections: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if f"LIMIT {MAX_SELECTION_BATCH}" in sql:
            selections.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        out = run("resume", "--status", "failed", "--workflow", "ops.echo", "--since", "1h")
    assert out.splitlines()[-1] == "resume: acted on 1000 instance(s)"
    # Ten full batches of ids, then one empty read: each read bounded.
    assert len(selections) == 1000 // MAX_SELECTION_BATCH + 1
    assert set(
        WorkflowInstance.objects.filter(instance_id__in=ids).values_list("status", "generation")
    ) == {("running", 2)}
    assert ArchivedHistoryEvent.objects.count() == 1000
    # Again: nothing is failed any more, nothing changes.
    assert run("resume", "--status", "failed", "--workflow", "ops.echo").splitlines() == [
        "resume: acted on 0 instance(s)"
    ]
    assert ArchivedHistoryEvent.objects.count() == 1000


def test_bulk_resume_resumes_only_failed_runs_unless_told_to_include_the_others(
    tdb: None,
) -> None:
    runs = closed_in_every_way()
    out = run("resume", "--workflow", "resume.order", "--dry-run")
    assert out.splitlines() == ["would resume mix-failed", "resume: would act on 1 instance(s)"]
    out = run("resume", "--workflow", "resume.order")
    assert out.splitlines() == [
        "resumed mix-failed (generation 2)",
        "resume: acted on 1 instance(s)",
    ]
    assert sv.describe(runs["terminated"]).generation == 1
    for status in ("completed", "cancelled"):
        assert "--include-closed" in fails("resume", "--status", status)
        assert sv.describe(runs[status]).generation == 1

    out = run("resume", "--workflow", "resume.order", "--include-closed")
    assert out.splitlines() == [
        "resumed mix-terminated (generation 2)",
        "resume: acted on 1 instance(s)",
    ]
    out = run("resume", "--status", "cancelled", "--include-closed")
    assert out.splitlines()[-1] == "resume: acted on 1 instance(s)"
    assert [sv.describe(runs[k]).status for k in ("cancelled", "completed")] == [
        "running",
        "completed",
    ]
    assert "--include-closed applies to a selection" in fails(
        "resume", runs["completed"], "--include-closed"
    )
