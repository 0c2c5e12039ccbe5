"""The admin's console pages: "Start workflow", "Run query", "Replay check", and the
changelist's filter by error type, each with its permissions and admin log entry.

Runs are real: a worker driven by ``run_until_idle`` executes them."""

from __future__ import annotations

import importlib
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.contrib.admin.models import ADDITION, CHANGE
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import selvedge_django as sv
from selvedge_django.admin.filters import ERROR_TYPE_SAMPLE
from selvedge_django.models import WorkflowInstance
from tests.integration.test_resume import drive, failed_order
from tests.testapp.workflows import recovery as resume_flows
from tests.testapp.workflows.basics import add

from .test_admin import CHANGELIST, VIEW, escaped, html, logs, make, staff, url

__all__ = ["staff"]  # the fixture, shared with test_admin

START = "start_workflowinstance"
BUILTIN = "start_builtin_workflows"
DELETE = "delete_workflowinstance"
PAYLOADS = "view_payloads"
EXPORT = "export_history"
START_URL = reverse("admin:selvedge_django_workflowinstance_start")


@sv.workflow(name="test.console.tally")
def tally(ctx: sv.WorkflowContext, data: dict[str, Any]) -> int:
    """Add up what arrives on "n" until a 0; queries "total" and "broken" answer meanwhile."""
    state = {"total": data.get("start", 0)}
    ctx.set_query_handler("total", lambda: state["total"])
    ctx.set_query_handler("broken", lambda: 1 / 0)
    ctx.set_query_handler("spin", spin)
    while True:
        n = ctx.receive("n")
        if not n:
            return add.execute(ctx, {"a": state["total"], "b": 0})
        state["total"] += n


def spin() -> int:
    """A query handler that never returns."""
    while True:
        pass


@pytest.fixture(autouse=True)
def fixed() -> None:
    resume_flows.BROKEN.clear()
    resume_flows.RUNS.clear()


def instance_ids() -> list[str]:
    return sorted(WorkflowInstance.objects.values_list("instance_id", flat=True))


# -- start workflow -------------------------------------------------------------------------


def test_start_page_needs_its_permission_and_the_changelist_links_it(
    tdb: None, staff: Callable[..., Client]
) -> None:
    viewer = staff(VIEW)
    assert START_URL not in html(viewer.get(CHANGELIST))
    assert viewer.get(START_URL).status_code == 403
    forged = viewer.post(START_URL, {"workflow": "test.sum3", "input": '{"a": 1, "b": 2, "c": 3}'})
    assert forged.status_code == 403
    assert instance_ids() == []

    starter = staff(VIEW, START)
    assert START_URL in html(starter.get(CHANGELIST))
    page = html(starter.get(START_URL))
    # The registered workflows are the choices; the form is a CSRF-protected POST.
    assert '<option value="test.sum3">' in page and 'value="test.console.tally"' in page
    assert 'name="input"' in page and 'name="instance_id"' in page
    assert "csrfmiddlewaretoken" in page


def test_start_page_starts_a_run_that_a_worker_completes_and_logs_it(
    tdb: None, staff: Callable[..., Client]
) -> None:
    starter = staff(VIEW, START)
    response = starter.post(
        START_URL,
        {"workflow": "test.sum3", "input": '{"a": 1, "b": 2, "c": 3}', "instance_id": "from-admin"},
    )
    assert response.status_code == 302 and response["Location"] == url("change", "from-admin")
    assert sv.describe("from-admin").workflow_name == "test.sum3"
    assert drive("from-admin") == "completed"
    assert sv.get_workflow_result("from-admin").output == 6
    (entry,) = logs("from-admin")
    assert entry.action_flag == ADDITION
    assert entry.change_message == "Started workflow 'test.sum3' with a 19-byte input."
    assert "Started test.sum3 as from-admin." in html(starter.get(response["Location"]))

    # With an execution timeout: the run carries it (the leader terminates it when overdue).
    response = starter.post(
        START_URL,
        {"workflow": "test.console.tally", "input": "{}", "execution_timeout": "3600"},
    )
    assert response.status_code == 302
    timed = response["Location"].rstrip("/").split("/")[-2]
    assert sv.describe(timed).execution_timeout == timedelta(hours=1)
    page = html(starter.get(response["Location"]))
    assert "Execution timeout:" in page and "1:00:00" in page
    assert "Terminated if still running at:" in page
    sv.terminate_workflow(timed)
    closed = html(starter.get(response["Location"]))
    deadline = closed[closed.index("field-execution_deadline") :]
    assert deadline[: deadline.index("</div>\n")].endswith('<div class="readonly">-')

    # Without an id, a new one is made.
    response = starter.post(START_URL, {"workflow": "test.sum3", "input": '{"a":0,"b":0,"c":0}'})
    assert response.status_code == 302
    assert len(instance_ids()) == 3


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"input": "{not json"}, "The input is not valid JSON"),
        ({"input": "1", "instance_id": "taken"}, "WorkflowAlreadyStarted"),
        ({"input": "1", "instance_id": "bad\tid"}, "WorkflowStartRejected"),
        ({"input": "1", "instance_id": "bad\x00id"}, "Null characters are not allowed"),
        ({"input": '"\\u0000"'}, "WorkflowStartRejected"),
        ({"workflow": "not.registered", "input": "1"}, "Select a valid choice"),
        ({"input": "1", "execution_timeout": "0"}, "greater than or equal to 0.001"),
        ({"input": "1", "execution_timeout": "1e12"}, "WorkflowStartRejected"),
    ],
    ids=[
        "bad-json",
        "taken-id",
        "control-in-id",
        "nul-in-id",
        "nul-in-input",
        "unregistered",
        "zero-timeout",
        "timeout-too-long",
    ],
)
def test_a_refused_start_shows_the_error_on_the_form_and_writes_nothing(
    tdb: None, staff: Callable[..., Client], fields: dict[str, str], shown: str
) -> None:
    make("taken", status="completed")
    starter = staff(VIEW, START)
    response = starter.post(START_URL, {"workflow": "test.sum3", **fields})
    page = html(response)
    assert escaped(shown) in page, page
    assert instance_ids() == ["taken"]
    assert logs("taken") == []


def test_builtin_workflows_are_offered_and_started_only_with_their_permissions(
    tdb: None, staff: Callable[..., Client]
) -> None:
    make("old-closed", status="completed", age=timedelta(days=400))
    prune_fields = {"workflow": "selvedge.prune", "input": '{"older_than": 0}'}
    task_fields = {"workflow": "selvedge.task", "input": '{"task": "os.system"}'}

    def options(client: Client) -> set[str]:
        return set(re.findall(r'<option value="([^"]*)"', html(client.get(START_URL))))

    # Start alone (even with delete, or with the builtin permission without delete): no
    # built-in is offered, and a forged POST naming one is refused on the form.
    for codenames in [(VIEW, START), (VIEW, START, DELETE), (VIEW, START, BUILTIN)]:
        starter = staff(*codenames)
        offered = options(starter)
        assert "test.sum3" in offered
        assert not {"selvedge.prune", "selvedge.task"} & offered, codenames
        for fields in (prune_fields, task_fields):
            page = html(starter.post(START_URL, fields))
            assert "Select a valid choice" in page, codenames
    assert instance_ids() == ["old-closed"]
    assert drive("old-closed") == "completed"  # nothing pruned it

    # Pruning is deleting: the builtin permission and the delete permission start it.
    # selvedge.task is never started by name: django.tasks enqueues its tasks.
    pruner = staff(VIEW, START, BUILTIN, DELETE)
    offered = options(pruner)
    assert "selvedge.prune" in offered and "selvedge.task" not in offered
    assert "Select a valid choice" in html(pruner.post(START_URL, task_fields))
    response = pruner.post(START_URL, {**prune_fields, "instance_id": "prune-now"})
    assert response.status_code == 302
    assert sv.describe("prune-now").workflow_name == "selvedge.prune"
    (entry,) = logs("prune-now")
    assert entry.change_message == "Started workflow 'selvedge.prune' with a 16-byte input."


# -- run query -------------------------------------------------------------------------------


def test_run_query_lists_the_handlers_and_shows_the_answer_or_the_typed_error(
    tdb: None, staff: Callable[..., Client]
) -> None:
    iid = sv.start_workflow(tally, {"start": 1}, instance_id="tally-1")
    sv.signal(iid, "n", 4)
    assert drive(iid, status="running") == "running"
    query_url = url("query", iid)

    viewer = staff(VIEW)
    assert query_url not in html(viewer.get(url("change", iid)))
    assert viewer.get(query_url).status_code == 403
    assert viewer.post(query_url, {"name": "total"}).status_code == 403

    reader = staff(VIEW, PAYLOADS)
    assert query_url in html(reader.get(url("change", iid)))
    page = html(reader.get(query_url))
    # The handlers registered where the replay stops are offered.
    assert '<option value="broken">' in page and '<option value="total">' in page
    page = html(reader.post(query_url, {"name": "total"}))
    assert 'id="selvedge-result"' in page and "<code>5</code>" in page
    page = html(reader.post(query_url, {"name": "missing"}))
    assert "QueryNotFound: no query handler named &#x27;missing&#x27;" in page
    page = html(reader.post(query_url, {"name": "broken"}))
    assert "QueryFailed: query &#x27;broken&#x27; failed: division by zero" in page
    assert [entry.change_message for entry in logs(iid)] == [
        "Ran query 'total': answered.",
        "Ran query 'missing': failed: QueryNotFound.",
        "Ran query 'broken': failed: QueryFailed.",
    ]
    # A query writes nothing else: the run goes on where it was.
    sv.signal(iid, "n", 0)
    assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == 5


def test_state_here_on_each_history_row_answers_as_of_that_step(
    tdb: None, staff: Callable[..., Client]
) -> None:
    iid = sv.start_workflow(tally, {"start": 1}, instance_id="tally-steps")
    for n in (4, 10):
        sv.signal(iid, "n", n)
    assert drive(iid, status="running") == "running"
    query_url = url("query", iid)

    # Only for users who may see values: the answers are computed from them.
    assert "State here" not in html(staff(VIEW).get(url("change", iid)))
    reader = staff(VIEW, PAYLOADS)
    page = html(reader.get(url("change", iid)))
    assert page.count("State here") == 2  # one per recorded command: the two receives
    assert f'href="{query_url}?at=1"' in page and f'href="{query_url}?at=2"' in page

    # The link fills in the step and offers the handlers registered there.
    page = html(reader.get(f"{query_url}?at=1"))
    assert 'name="at" value="1"' in page and '<option value="total">' in page
    before = WorkflowInstance.objects.values().get(instance_id=iid)
    page = html(reader.post(f"{query_url}?at=1", {"name": "total", "at": "1"}))
    assert "<code>5</code>" in page  # 1, then 4 received at step 1
    page = html(reader.post(query_url, {"name": "total", "at": "#2:receive:n"}))
    assert "<code>15</code>" in page
    page = html(reader.post(query_url, {"name": "total", "at": "#9:receive:n"}))
    assert "HistoryKeyNotFound" in page and "records no command at" in page
    assert [entry.change_message for entry in logs(iid)] == [
        "Ran query 'total' at 1: answered.",
        "Ran query 'total' at '#2:receive:n': answered.",
        "Ran query 'total' at '#9:receive:n': failed: HistoryKeyNotFound.",
    ]
    assert WorkflowInstance.objects.values().get(instance_id=iid) == before


def test_run_query_is_bounded_by_the_query_timeout(
    tdb: None, staff: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    iid = sv.start_workflow(tally, {}, instance_id="tally-slow")
    assert drive(iid, status="running") == "running"
    monkeypatch.setattr("selvedge_django.admin.console.QUERY_TIMEOUT", 1e-9)
    page = html(staff(VIEW, PAYLOADS).post(url("query", iid), {"name": "total"}))
    assert "QueryTimeout" in page and "did not answer within 1e-09 seconds" in page


@pytest.mark.timeout(60)
def test_run_query_interrupts_a_handler_that_never_returns(
    tdb: None, staff: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    iid = sv.start_workflow(tally, {}, instance_id="tally-spin")
    assert drive(iid, status="running") == "running"
    monkeypatch.setattr("selvedge_django.admin.console.QUERY_TIMEOUT", 0.5)
    reader = staff(VIEW, PAYLOADS)
    pages: list[str] = []
    tracers: list[Any] = []

    def ask() -> None:
        tracers.append(sys.gettrace())
        try:
            pages.append(html(reader.post(url("query", iid), {"name": "spin"})))
            tracers.append(sys.gettrace())  # whatever traced the thread before is back
        finally:
            connections.close_all()

    request = threading.Thread(target=ask, daemon=True)
    started = time.monotonic()
    request.start()
    deadline = started + 15
    while request.is_alive() and time.monotonic() < deadline:
        request.join(0.05)
    assert not request.is_alive(), "the query page is still running the handler"
    (page,) = pages
    assert "QueryTimeout" in page and "did not answer within 0.5 seconds" in page
    assert [entry.change_message for entry in logs(iid)] == [
        "Ran query 'spin': failed: QueryTimeout."
    ]
    assert len(tracers) == 2 and tracers[0] is tracers[1]
    # The page still answers a handler that returns.
    assert "<code>0</code>" in html(reader.post(url("query", iid), {"name": "total"}))


# -- replay check ----------------------------------------------------------------------------


def test_replay_check_passes_then_shows_the_divergence_after_a_code_change(
    tdb: None, staff: Callable[..., Client], redefine: Callable[[str, Callable[..., Any]], None]
) -> None:
    iid = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="checked")
    assert drive(iid) == "completed"
    check_url = url("replay_check", iid)

    viewer = staff(VIEW)
    assert check_url not in html(viewer.get(url("change", iid)))
    assert viewer.post(check_url).status_code == 403

    checker = staff(VIEW, EXPORT)
    assert check_url in html(checker.get(url("change", iid)))
    assert checker.get(check_url).status_code == 405
    page = html(checker.post(check_url, follow=True))
    assert "Replay check of checked passed" in page

    def changed(ctx: sv.WorkflowContext, data: dict[str, int]) -> int:
        return add.execute(ctx, {"a": data["c"], "b": data["b"] + data["a"]})

    redefine("test.sum3", changed)
    page = html(checker.post(check_url, follow=True))
    assert "Replay check of checked failed: NondeterminismError" in page
    assert [entry.change_message for entry in logs(iid)] == [
        "Replay check passed.",
        "Replay check failed: NondeterminismError.",
    ]
    assert all(entry.action_flag == CHANGE for entry in logs(iid))


# -- the error type filter -------------------------------------------------------------------


def test_error_type_is_stored_on_failure_and_cleared_by_resume(tdb: None) -> None:
    iid = failed_order("typed-1")
    row = WorkflowInstance.objects.get(instance_id=iid)
    assert row.error_type and row.error_type == json.loads(row.error or "")["type"]
    resume_flows.BROKEN.clear()
    sv.resume_workflow(iid)
    assert WorkflowInstance.objects.get(instance_id=iid).error_type == ""
    assert drive(iid) == "completed"
    assert WorkflowInstance.objects.get(instance_id=iid).error_type == ""

    running = sv.start_workflow(tally, {}, instance_id="typed-2")
    sv.terminate_workflow(running, reason="stop")
    assert WorkflowInstance.objects.get(instance_id=running).error_type == "WorkflowTerminated"


def test_changelist_filters_failed_runs_by_error_type(
    tdb: None, staff: Callable[..., Client]
) -> None:
    failed = failed_order("typed-3")
    kind = WorkflowInstance.objects.get(instance_id=failed).error_type
    terminated = sv.start_workflow(tally, {}, instance_id="typed-4")
    sv.terminate_workflow(terminated, reason="stop")
    done = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="typed-5")
    assert drive(done) == "completed"

    viewer = staff(VIEW)
    page = html(viewer.get(CHANGELIST))
    assert f"?error_type={kind}" in page and "?error_type=WorkflowTerminated" in page
    page = html(viewer.get(CHANGELIST, {"error_type": "WorkflowTerminated"}))
    assert url("change", terminated) in page
    assert url("change", failed) not in page and url("change", done) not in page
    page = html(viewer.get(CHANGELIST, {"error_type": kind}))
    assert url("change", failed) in page and url("change", terminated) not in page
    # A type outside the sample still filters (and is offered while selected).
    page = html(viewer.get(CHANGELIST, {"error_type": "NeverSeen"}))
    assert "?error_type=NeverSeen" in page and url("change", failed) not in page


def test_error_type_choices_read_a_bounded_sample(tdb: None, staff: Callable[..., Client]) -> None:
    make("old-failure", status="failed", error_type="OldError")
    viewer = staff(VIEW)
    with CaptureQueriesContext(connection) as queries:
        page = html(viewer.get(CHANGELIST))
    assert "?error_type=OldError" in page
    only_types = re.compile(r'^SELECT \S*"error_type"( AS "error_type")? FROM')
    sampled = [q["sql"] for q in queries.captured_queries if only_types.match(q["sql"])]
    assert sampled and all(f"LIMIT {ERROR_TYPE_SAMPLE}" in sql for sql in sampled), sampled


def test_the_migration_fills_in_the_error_type_of_older_failed_runs(tdb: None) -> None:
    migration = importlib.import_module(
        "selvedge_django.migrations.0011_error_type_and_start_permission"
    )
    envelope = json.dumps({"kind": "application", "type": "billing.Declined", "message": "no"})
    make("before-1", status="failed", error=envelope)
    make("before-2", status="failed", error="not an envelope")
    make("before-3", status="completed", output="1")
    migration.backfill_error_types(django_apps, SimpleNamespace(connection=connection))
    types = dict(WorkflowInstance.objects.values_list("instance_id", "error_type"))
    assert types == {"before-1": "billing.Declined", "before-2": "", "before-3": ""}
