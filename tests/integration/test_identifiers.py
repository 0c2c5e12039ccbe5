"""One rule for instance ids and one for workflow names, on every path that takes them.

Instance ids are 1 to 255 characters without control characters or lone
surrogates; workflow names are the same and not blank. A start (top-level,
child, from ``runselvedge start``) refuses anything else with
``WorkflowStartRejected`` and writes nothing; a lookup of an id that no
instance can have raises ``WorkflowNotFound`` without a query. Either way the
answer is the same on SQLite and PostgreSQL (which refuses NUL in text).
"""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.models import HistoryEvent, WorkflowInstance
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker

BAD_IDS = {
    "empty": "",
    "too-long": "x" * 256,
    "nul": "a\x00b",
    "newline": "a\nb",
    "delete": "a\x7fb",
    "lone-surrogate": "a\ud800b",
}
BAD_NAMES = {
    "empty": "",
    "blank": "   ",
    "too-long": "w" * 256,
    "nul": "wf\x00name",
    "tab": "wf\tname",
    "lone-surrogate": "wf\udfffname",
}


@sv.workflow(name="ident.echo")
def echo(ctx: sv.WorkflowContext, value: Any) -> Any:
    return value


@sv.workflow(name="ident.parent")
def parent(ctx: sv.WorkflowContext, args: dict[str, Any]) -> Any:
    """Start a child with the given name and id; report how the start was refused."""
    try:
        ctx.start_child(args["name"], None, child_id=args["child_id"])
    except sv.WorkflowStartRejected as error:
        return ["rejected", str(error)]
    return ["started"]


@pytest.fixture
def stepper(tdb: None) -> Worker:
    return Worker()


@pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_start_workflow_refuses_a_bad_instance_id(tdb: None, bad: str) -> None:
    with pytest.raises(sv.WorkflowStartRejected):
        sv.start_workflow(echo, 1, instance_id=bad)
    assert not WorkflowInstance.objects.exists()


@pytest.mark.parametrize("bad", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_start_workflow_refuses_a_bad_workflow_name(tdb: None, bad: str) -> None:
    with pytest.raises(sv.WorkflowStartRejected):
        sv.start_workflow(bad, 1)
    assert not WorkflowInstance.objects.exists()


@sv.workflow(name="ident.parent.raw")
def parent_raw(ctx: sv.WorkflowContext, which: dict[str, str]) -> Any:
    """Like ident.parent, with the bad name or id looked up here (not JSON-encodable)."""
    name = BAD_NAMES.get(which.get("name", ""), "ident.echo")
    child_id = BAD_IDS.get(which.get("child_id", ""), which.get("good_id"))
    try:
        ctx.start_child(name, None, child_id=child_id)
    except sv.WorkflowStartRejected as error:
        return ["rejected", str(error)]
    return ["started"]


@pytest.mark.parametrize("which", BAD_IDS, ids=BAD_IDS.keys())
def test_start_child_refuses_a_bad_child_id_like_start_workflow(
    stepper: Worker, which: str
) -> None:
    iid = sv.start_workflow(parent_raw, {"child_id": which}, instance_id=f"p-id-{which}")
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    assert result.status == "completed", result.error
    assert result.output[0] == "rejected"
    assert list(WorkflowInstance.objects.values_list("instance_id", flat=True)) == [iid]
    assert not HistoryEvent.objects.filter(instance_id=iid, command="child").exists()


@pytest.mark.parametrize("which", BAD_NAMES, ids=BAD_NAMES.keys())
def test_start_child_refuses_a_bad_workflow_name_like_start_workflow(
    stepper: Worker, which: str
) -> None:
    # An explicit, valid child id: the name alone must be refused.
    args = {"name": which, "good_id": f"child-{which}"}
    iid = sv.start_workflow(parent_raw, args, instance_id=f"p-name-{which}")
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    assert result.status == "completed", result.error
    assert result.output[0] == "rejected"
    assert list(WorkflowInstance.objects.values_list("instance_id", flat=True)) == [iid]


def test_a_default_child_id_longer_than_an_id_may_be_is_refused(stepper: Worker) -> None:
    iid = sv.start_workflow(parent, {"name": "ident.echo", "child_id": None}, instance_id="p" * 250)
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    assert result.status == "completed", result.error
    assert result.output[0] == "rejected" and "255" in result.output[1]


LOOKUPS: dict[str, Callable[[str], Any]] = {
    "describe": sv.describe,
    "get_workflow_result": sv.get_workflow_result,
    "wait_workflow": lambda i: sv.wait_workflow(i, timeout=5),
    "cancel_workflow": sv.cancel_workflow,
    "signal": lambda i: sv.signal(i, "go", 1),
    "list_activity_tasks": sv.list_activity_tasks,
    "export_history": sv.export_history,
    "replay_instance": sv.replay_instance,
    "query": lambda i: sv.query(i, "anything"),
}


@pytest.mark.parametrize("call", LOOKUPS.values(), ids=LOOKUPS.keys())
@pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_a_lookup_of_an_id_no_instance_can_have_is_not_found_without_a_query(
    tdb: None, bad: str, call: Callable[[str], Any]
) -> None:
    with CaptureQueriesContext(connection) as queries, pytest.raises(sv.WorkflowNotFound):
        call(bad)
    assert len(queries) == 0


def _run_command(*args: str) -> str:
    out = StringIO()
    call_command("runselvedge", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.parametrize(
    "args",
    [
        ("start", "ident.echo", "1", "--id", "a\x01b"),
        ("start", "ident.echo", "1", "--id", "x" * 256),
        ("start", "bad\x00name", "1"),
        ("start", " ", "1"),
    ],
    ids=["control-id", "long-id", "nul-name", "blank-name"],
)
def test_runselvedge_start_refuses_what_start_workflow_refuses(
    tdb: None, args: tuple[str, ...]
) -> None:
    with pytest.raises(CommandError):
        _run_command(*args)
    assert not WorkflowInstance.objects.exists()


@pytest.mark.parametrize("sub", ["describe", "result", "export-history", "cancel"])
def test_runselvedge_lookups_of_a_bad_id_are_not_found(tdb: None, sub: str) -> None:
    with pytest.raises(CommandError) as caught:
        _run_command(sub, "a\x00b")
    assert isinstance(caught.value.__cause__, sv.WorkflowNotFound)


@pytest.mark.parametrize("kind", ["workflow", "activity"])
@pytest.mark.parametrize("bad", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_registration_refuses_names_that_no_start_would_accept(kind: str, bad: str) -> None:
    decorator = sv.workflow if kind == "workflow" else sv.activity
    with pytest.raises(ValueError):
        decorator(name=bad)(lambda *args: None)
    lookup = registry.get_workflow if kind == "workflow" else registry.get_activity
    assert lookup(bad) is None
