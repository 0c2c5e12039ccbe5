"""The admin console with the test client: lists, detail pages, actions, permissions, escaping.

Most tests build instances straight through the ORM or ``sv.start_workflow``;
the detail-page tests run real workflows with an unstarted ``Worker`` driven by
``run_until_idle``, so their history, tasks, timers, signals and children are
the engine's own.
"""

from __future__ import annotations

import gettext as gettext_module
import io
import json
import re
import zipfile
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import quote_plus

import pytest
from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.html import escape
from django.utils.translation import trans_real

import selvedge_django as sv
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    SystemLock,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests.testapp.workflows.basics import add

CHANGELIST = "/admin/selvedge_django/workflowinstance/"
# Ids that need escaping in HTML, quoting in URLs, or both.
AWKWARD_IDS = ["<script>x</script>", "a/b/../c", "?x=1#y", "50%_off \"quoted\" & 'single'"]


# -- workflows of these tests -----------------------------------------------------------


class AdminBoom(Exception):
    """Raised by ``test.admin.boom``."""


@sv.activity(name="test.admin.boom", retry_policy=sv.RetryPolicy(max_attempts=1))
def boom(data: str) -> None:
    raise AdminBoom(f"<b>{data}</b> went wrong")


@sv.workflow(name="test.admin.child")
def admin_child(ctx: sv.WorkflowContext, data: Any) -> Any:
    return ctx.receive("release")


@sv.workflow(name="test.admin.parent")
def admin_parent(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    child = ctx.start_child("test.admin.child", {"from": "parent"}, child_id=data["child_id"])
    add.execute(ctx, {"a": 1, "b": 2})
    try:
        boom.execute(ctx, "<i>step</i>")
    except Exception:
        pass
    ctx.receive_with_timeout("go", 3600)
    return child.get(ctx)


# -- helpers ----------------------------------------------------------------------------


def url(name: str, instance_id: str) -> str:
    return reverse(f"admin:selvedge_django_workflowinstance_{name}", args=(quote(instance_id),))


def make(
    instance_id: str,
    *,
    status: str = "running",
    name: str = "test.sum3",
    age: timedelta = timedelta(0),
    **fields: Any,
) -> WorkflowInstance:
    when = timezone.now() - age
    fields.setdefault("input", {"a": 1})
    return WorkflowInstance.objects.create(
        instance_id=instance_id,
        workflow_name=name,
        status=status,
        started_at=when,
        updated_at=when,
        closed_at=None if status == "running" else when,
        **fields,
    )


def html(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return str(response.content.decode())


def logs(instance_id: str) -> list[LogEntry]:
    return list(LogEntry.objects.filter(object_id=instance_id).order_by("id"))


def escaped(text: str) -> str:
    return str(escape(text))


@pytest.fixture
def staff(django_user_model: Any) -> Callable[..., Client]:
    """Log in a new staff user with the given selvedge_django permission codenames."""
    made = 0

    def login(*codenames: str, csrf: bool = False) -> Client:
        nonlocal made
        made += 1
        # No password: hashing one costs more than the rest of most tests.
        user = django_user_model.objects.create_user(username=f"operator{made}", is_staff=True)
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
            )
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client

    return login


@pytest.fixture
def admin_client(django_user_model: Any) -> Client:
    """A logged-in superuser (without the password hashing of pytest-django's fixture)."""
    user = django_user_model.objects.create_superuser(username="root", email="", password=None)
    client = Client()
    client.force_login(user)
    return client


VIEW = "view_workflowinstance"
CANCEL = "cancel_workflowinstance"
SIGNAL = "signal_workflowinstance"
EXPORT = "export_history"
PAYLOADS = "view_payloads"
TERMINATE = "terminate_workflowinstance"
ALL = (VIEW, CANCEL, SIGNAL, EXPORT, TERMINATE)


# -- the changelist -----------------------------------------------------------------------


@pytest.mark.django_db
def test_changelist_shows_and_filters_code_versions(admin_client: Client) -> None:
    make("blue-1", code_version="v1")
    make("green-1", code_version="v2")
    make("plain-1")
    make("old-blue", status="completed", code_version="v0")

    def listed(query: str = "") -> set[str]:
        page = html(admin_client.get(CHANGELIST + query))
        return {i for i in ("blue-1", "green-1", "plain-1", "old-blue") if i in page}

    page = html(admin_client.get(CHANGELIST))
    # Offered: the running instances' versions, and none; v0 only runs no more.
    assert "?code_version=v1" in page and "?code_version=v2" in page
    assert "?code_version=-" in page and "?code_version=v0" not in page
    assert listed("?code_version=v1") == {"blue-1"}
    assert listed("?code_version=v0") == {"old-blue"}
    assert listed("?code_version=-") == {"plain-1"}
    detail = html(admin_client.get(f"{CHANGELIST}green-1/change/"))
    assert "v2" in detail


@pytest.mark.django_db
def test_changelist_filters_by_status_name_and_start_date_and_searches_ids(
    admin_client: Client,
) -> None:
    make("alpha-running", status="running", name="test.sum3")
    make("beta-completed", status="completed", name="test.ledger", age=timedelta(days=30))
    make("gamma-failed", status="failed", name="not.registered.here")

    def listed(query: str = "") -> set[str]:
        page = html(admin_client.get(CHANGELIST + query))
        return {i for i in ("alpha-running", "beta-completed", "gamma-failed") if i in page}

    assert listed() == {"alpha-running", "beta-completed", "gamma-failed"}
    assert listed("?status__exact=running") == {"alpha-running"}
    assert listed("?status__exact=completed") == {"beta-completed"}
    assert listed("?workflow_name=test.ledger") == {"beta-completed"}
    # A name this process has not registered still filters (it is just not offered).
    assert listed("?workflow_name=not.registered.here") == {"gamma-failed"}
    # As the filter's own "Past 7 days" link spells it: an aware datetime.
    since = quote_plus(str(timezone.now() - timedelta(days=7)))
    assert listed(f"?started_at__gte={since}") == {"alpha-running", "gamma-failed"}
    assert listed("?q=BETA") == {"beta-completed"}
    assert listed("?q=ing&status__exact=running") == {"alpha-running"}
    # A whole id is looked up by primary key: ids that merely contain it are left out.
    make("alpha-running-2")
    page = html(admin_client.get(CHANGELIST + "?q=alpha-running"))
    assert "alpha-running" in page and "alpha-running-2" not in page
    assert "alpha-running-2" in html(admin_client.get(CHANGELIST + "?q=alpha-RUNNING"))

    page = html(admin_client.get(CHANGELIST))
    # The name filter offers the registered workflows, the status filter every status.
    assert "?workflow_name=test.sum3" in page
    assert "?status__exact=cancelled" in page
    # No full-table count next to the filtered one.
    assert "total)" not in page


@pytest.mark.django_db
def test_changelist_query_count_does_not_grow_with_rows(
    admin_client: Client, staff: Callable[..., Client]
) -> None:
    viewer = staff(*ALL)

    def count(client: Client, query: str = "") -> int:
        with CaptureQueriesContext(connection) as ctx:
            html(client.get(CHANGELIST + query))
        return len(ctx.captured_queries)

    def populate(start: int, stop: int) -> None:
        for n in range(start, stop):
            make(
                f"row-{n}",
                status=("running", "completed", "failed")[n % 3],
                parent_instance_id=f"row-{n - 1}" if n % 2 else "",
                parent_key="child:1" if n % 2 else "",
            )

    populate(0, 5)
    few = {(c, q): count(c, q) for c in (admin_client, viewer) for q in ("", "?q=row")}
    populate(5, 50)
    many = {(c, q): count(c, q) for c in (admin_client, viewer) for q in ("", "?q=row")}
    assert few == many
    # The error type filter reads its choices in one bounded query (ERROR_TYPE_SAMPLE rows),
    # and the attribute filter box its name suggestions in one (ATTRIBUTE_NAME_SAMPLE).
    assert max(many.values()) <= 10


# -- the detail page ----------------------------------------------------------------------


@pytest.mark.usefixtures("tdb")
def test_detail_page_shows_history_tasks_timers_signals_and_family(
    admin_client: Client,
) -> None:
    parent_id, child_id = "<script>parent</script>", "kids/a/../b?x=1#frag"
    sv.start_workflow("test.admin.parent", {"child_id": child_id}, instance_id=parent_id)
    run_until_idle(Worker())
    secret = {"html": "<script>alert(1)</script>", "long": "z" * 5000}
    sv.signal(parent_id, "<i>elsewhere</i>", secret)

    page = html(admin_client.get(url("change", parent_id)))
    assert parent_id not in page and escaped(parent_id) in page

    # History: every recorded key, command and event type; values escaped and truncated.
    events = list(HistoryEvent.objects.filter(instance_id=parent_id))
    assert len(events) >= 4
    for event in events:
        assert escaped(event.key) in page
        assert f"<td>{event.command}</td>" in page
        assert f"<td>{event.event_type}</td>" in page
    assert f"History ({len(events)} events)" in page

    # Activity tasks with status, attempts, failures and the last error (escaped).
    tasks = {t.name: t for t in ActivityTask.objects.filter(instance_id=parent_id)}
    assert tasks["test.add"].status == "completed"
    assert tasks["test.admin.boom"].status == "failed"
    assert "test.admin.boom" in page
    assert "<td>1 / 1</td>" in page
    assert escaped("<b><i>step</i></b> went wrong") in page
    assert "AdminBoom" in page

    # The pending timer of the timed receive, and the signal's inbox position.
    (timer,) = TimerSubscription.objects.filter(instance_id=parent_id)
    assert escaped(timer.key) in page
    (message,) = SignalMessage.objects.filter(instance_id=parent_id)
    assert escaped("<i>elsewhere</i>") in page
    assert '<td><span class="selvedge-empty">-</span></td>' in page  # not consumed yet
    assert escaped('"html":"<script>alert(1)</script>"') in page
    assert "z" * 5000 not in page
    assert f"({len(message.payload)} characters)" in page

    # The child is linked from the parent, and the parent from the child.
    assert url("change", child_id) in page
    assert escaped(child_id) in page
    child_page = html(admin_client.get(url("change", child_id)))
    assert url("change", parent_id) in child_page
    assert "No activity tasks." in child_page

    # Buttons for the superuser: cancel and signal (running) and export.
    for name in ("cancel", "signal", "export"):
        assert url(name, parent_id) in page


@pytest.mark.django_db
def test_detail_page_warns_about_long_histories_and_truncates_values(
    admin_client: Client,
) -> None:
    inst = make("long-history", input={"blob": "x" * 10_000})
    HistoryEvent.objects.bulk_create(
        HistoryEvent(
            instance=inst,
            key=f"activity:{n}",
            seq=n,
            command="activity",
            event_type="activity",
            data=json.dumps("y" * 1000),
        )
        for n in range(1, 4)
    )
    raw = dict(settings.SELVEDGE)
    with override_settings(SELVEDGE={**raw, "HISTORY_WARNING_THRESHOLD": 2}):
        page = html(admin_client.get(url("change", "long-history")))
    assert "more than HISTORY_WARNING_THRESHOLD (2)" in page
    assert "y" * 1000 not in page and "y" * 150 in page
    assert "x" * 10_000 not in page and "x" * 1000 in page

    page = html(admin_client.get(url("change", "long-history")))
    assert "HISTORY_WARNING_THRESHOLD" not in page

    # The detail page's queries do not grow with the history either.
    with CaptureQueriesContext(connection) as before:
        html(admin_client.get(url("change", "long-history")))
    HistoryEvent.objects.bulk_create(
        HistoryEvent(instance=inst, key=f"sleep:{n}", seq=n, command="timer", event_type="timer")
        for n in range(4, 40)
    )
    with CaptureQueriesContext(connection) as after:
        page = html(admin_client.get(url("change", "long-history")))
    assert len(before.captured_queries) == len(after.captured_queries)
    assert '<td><span class="selvedge-empty">-</span></td>' in page  # a value not there yet


# -- permissions, CSRF and read-only --------------------------------------------------


@pytest.mark.django_db
def test_actions_are_denied_without_their_permission_and_change_nothing(
    staff: Callable[..., Client],
) -> None:
    make("guarded")
    viewer = staff(VIEW)
    page = html(viewer.get(url("change", "guarded")))
    for name in ("cancel", "signal", "export"):
        assert url(name, "guarded") not in page
    assert 'name="_selected_action"' not in html(viewer.get(CHANGELIST))

    for name in ("cancel", "signal"):
        assert viewer.get(url(name, "guarded")).status_code == 403
    assert viewer.post(url("cancel", "guarded"), {"reason": "no"}).status_code == 403
    assert viewer.post(url("signal", "guarded"), {"channel": "go"}).status_code == 403
    assert viewer.post(url("export", "guarded")).status_code == 403
    # A changelist action the user may not run is not offered, and a forged POST does nothing.
    canceller = staff(VIEW, CANCEL)
    for client in (viewer, canceller):
        for action in ("signal_instances", "export_instances"):
            response = client.post(
                CHANGELIST,
                {
                    "action": action,
                    "_selected_action": ["guarded"],
                    "index": "0",
                    "apply": "1",
                    "channel": "go",
                },
            )
            assert response.status_code in (200, 302)
            assert "Content-Disposition" not in response
    response = viewer.post(
        CHANGELIST,
        {"action": "cancel_instances", "_selected_action": ["guarded"], "apply": "1"},
    )
    assert response.status_code == 200

    inst = WorkflowInstance.objects.get(instance_id="guarded")
    assert not inst.cancel_requested
    assert not SignalMessage.objects.exists()
    assert logs("guarded") == []

    # The permission without view access is not enough either.
    blind = staff(CANCEL, SIGNAL, EXPORT)
    assert blind.get(CHANGELIST).status_code == 403
    assert blind.get(url("change", "guarded")).status_code == 403
    assert blind.post(url("cancel", "guarded"), {"reason": "no"}).status_code == 403
    assert blind.post(url("export", "guarded")).status_code == 403
    assert not WorkflowInstance.objects.get(instance_id="guarded").cancel_requested

    # An unknown id is a 404 for someone allowed to act.
    operator = staff(*ALL)
    assert operator.post(url("cancel", "missing"), {"reason": "x"}).status_code == 404


@pytest.mark.django_db
def test_nothing_is_editable_by_hand(admin_client: Client) -> None:
    make("fixed")
    assert admin_client.get(f"{CHANGELIST}add/").status_code == 403
    assert admin_client.post(url("change", "fixed"), {"status": "completed"}).status_code == 403
    assert admin_client.get(url("delete", "fixed")).status_code == 403
    assert admin_client.post(url("delete", "fixed"), {"post": "yes"}).status_code == 403
    page = html(admin_client.get(url("change", "fixed")))
    assert 'name="_save"' not in page and 'name="status"' not in page and "<textarea" not in page
    assert 'value="delete_selected"' not in html(admin_client.get(CHANGELIST))
    assert WorkflowInstance.objects.get(instance_id="fixed").status == "running"
    for model in (ActivityTask, SystemLock):
        meta = model._meta
        assert admin_client.get(f"/admin/{meta.app_label}/{meta.model_name}/").status_code == 200
        assert (
            admin_client.get(f"/admin/{meta.app_label}/{meta.model_name}/add/").status_code == 403
        )


@pytest.mark.django_db
def test_actions_need_a_csrf_token(staff: Callable[..., Client]) -> None:
    make("protected")
    client = staff(*ALL, csrf=True)
    assert client.post(url("cancel", "protected"), {"reason": "r"}).status_code == 403
    assert client.post(url("signal", "protected"), {"channel": "go"}).status_code == 403
    assert client.post(url("export", "protected")).status_code == 403
    response = client.post(
        CHANGELIST,
        {"action": "cancel_instances", "_selected_action": ["protected"], "apply": "1"},
    )
    assert response.status_code == 403
    assert not WorkflowInstance.objects.get(instance_id="protected").cancel_requested
    assert not SignalMessage.objects.exists()
    assert logs("protected") == []

    html(client.get(url("cancel", "protected")))
    token = client.cookies["csrftoken"].value
    response = client.post(
        url("cancel", "protected"), {"reason": "r", "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302
    assert WorkflowInstance.objects.get(instance_id="protected").cancel_requested


# -- the instance page's actions ----------------------------------------------------------


@pytest.mark.django_db
def test_cancel_from_the_instance_page_goes_through_the_operations_layer_and_is_logged(
    staff: Callable[..., Client],
) -> None:
    make("to-cancel")
    make("done", status="completed")
    operator = staff(VIEW, CANCEL)
    page = html(operator.get(url("cancel", "to-cancel")))
    assert 'name="reason"' in page and "csrfmiddlewaretoken" in page

    response = operator.post(url("cancel", "to-cancel"), {"reason": "customer asked <b>"})
    assert response.status_code == 302 and response["Location"] == url("change", "to-cancel")
    described = sv.describe("to-cancel")
    assert described.cancel_requested and described.cancel_reason == "customer asked <b>"
    (entry,) = logs("to-cancel")
    assert entry.action_flag == CHANGE and "customer asked <b>" in entry.change_message
    assert entry.user.username.startswith("operator")

    # A completed instance: the error is shown on the form, nothing is written.
    page = html(operator.post(url("cancel", "done"), {"reason": "late"}))
    assert "already completed" in page
    assert not WorkflowInstance.objects.get(instance_id="done").cancel_requested
    assert logs("done") == []


@pytest.mark.django_db
def test_terminate_from_the_instance_page_asks_for_a_reason_and_is_logged(
    staff: Callable[..., Client],
) -> None:
    make("to-end")
    make("ended", status="completed")
    viewer = staff(VIEW)
    assert url("terminate", "to-end") not in html(viewer.get(url("change", "to-end")))
    assert viewer.get(url("terminate", "to-end")).status_code == 403
    assert viewer.post(url("terminate", "to-end"), {"reason": "no"}).status_code == 403
    assert sv.describe("to-end").status == "running"

    operator = staff(VIEW, TERMINATE)
    assert url("terminate", "to-end") in html(operator.get(url("change", "to-end")))
    assert url("terminate", "ended") not in html(operator.get(url("change", "ended")))
    page = html(operator.get(url("terminate", "to-end")))
    assert 'name="reason"' in page and "csrfmiddlewaretoken" in page
    assert "cannot be undone" in page
    response = operator.post(url("terminate", "to-end"), {"reason": "stuck <b>"})
    assert response.status_code == 302 and response["Location"] == url("change", "to-end")
    error = sv.get_workflow_result("to-end").error
    assert isinstance(error, sv.WorkflowTerminated) and error.reason == "stuck <b>"
    (entry,) = logs("to-end")
    assert entry.action_flag == CHANGE and "Terminated" in entry.change_message
    assert "stuck <b>" in entry.change_message

    # A closed instance: the error is shown on the form, nothing is written.
    page = html(operator.post(url("terminate", "ended"), {"reason": "late"}))
    assert "already completed" in page
    assert logs("ended") == []
    page = html(operator.post(url("terminate", "to-end"), {"reason": "again"}))
    assert "already failed" in page
    assert len(logs("to-end")) == 1


@pytest.mark.django_db
def test_the_instance_page_shows_storage_errors_and_the_hold_back(
    staff: Callable[..., Client],
) -> None:
    held_until = int((timezone.now() + timedelta(minutes=5)).timestamp() * 1000)
    make(
        "held",
        execution_errors=3,
        execution_error="OperationalError: <b>server closed the connection</b>",
        ready_ms=held_until,
    )
    page = html(staff(VIEW, PAYLOADS).get(url("change", "held")))
    assert "held back until" in page.lower() and "last storage error" in page.lower()
    assert escaped("OperationalError: <b>server closed the connection</b>") in page
    hidden = html(staff(VIEW).get(url("change", "held")))
    assert "server closed the connection" not in hidden and "held back until" in hidden.lower()


@pytest.mark.django_db
def test_the_instance_page_shows_progress_heartbeat_details_and_signal_keys(
    staff: Callable[..., Client],
) -> None:
    make("busy", progress='{"step":"<b>packing</b>","done":3}')
    ActivityTask.objects.create(
        instance_id="busy",
        workflow_name="test.sum3",
        key="a:1",
        seq=1,
        name="test.add",
        input="[1]",
        status="running",
        heartbeat_details='{"row":"<i>41</i>"}',
    )
    sv.signal("busy", "go", 1, idempotency_key="<key>-7")
    page = html(staff(VIEW, PAYLOADS).get(url("change", "busy")))
    assert "progress" in page.lower() and "heartbeat details" in page.lower()
    assert escaped('{"step":"<b>packing</b>","done":3}') in page
    assert escaped('{"row":"<i>41</i>"}') in page
    assert escaped("<key>-7") in page
    hidden = html(staff(VIEW).get(url("change", "busy")))
    assert "packing" not in hidden and "<i>41" not in hidden
    details = '{"row":"<i>41</i>"}'
    assert f"(hidden: {len(details)} characters)" in hidden  # the details' size only
    task = ActivityTask.objects.get(instance_id="busy")
    task_url = reverse("admin:selvedge_django_activitytask_change", args=(task.pk,))
    assert escaped('{"row":"<i>41</i>"}') in html(
        staff("view_activitytask", PAYLOADS).get(task_url)
    )
    assert "&lt;i&gt;41" not in html(staff("view_activitytask").get(task_url))


@pytest.mark.django_db
def test_changelist_terminate_asks_for_a_reason_then_terminates_each_instance(
    staff: Callable[..., Client],
) -> None:
    for iid in ("end-1", "end-2", "keep-3"):
        make(iid)
    make("end-done", status="completed")
    selected = ["end-1", "end-2", "end-done"]
    # Without the permission the action is not offered and a forged POST does nothing.
    canceller = staff(VIEW, CANCEL)
    assert 'value="terminate_instances"' not in html(canceller.get(CHANGELIST))
    canceller.post(
        CHANGELIST,
        {"action": "terminate_instances", "_selected_action": selected, "apply": "1"},
    )
    assert not WorkflowInstance.objects.filter(status="failed").exists()

    operator = staff(VIEW, TERMINATE)
    assert 'value="terminate_instances"' in html(operator.get(CHANGELIST))
    page = html(
        operator.post(
            CHANGELIST,
            {"action": "terminate_instances", "_selected_action": selected, "index": "0"},
        )
    )
    assert 'name="reason"' in page and 'name="apply"' in page
    assert not WorkflowInstance.objects.filter(status="failed").exists()
    response = operator.post(
        CHANGELIST,
        {
            "action": "terminate_instances",
            "_selected_action": selected,
            "select_across": "0",
            "apply": "1",
            "reason": "bulk end",
        },
        follow=True,
    )
    page = html(response)
    assert "Terminated 2 instances." in page
    assert "1 instance skipped" in page and "already completed" in page
    failed = set(
        WorkflowInstance.objects.filter(status="failed").values_list("instance_id", flat=True)
    )
    assert failed == {"end-1", "end-2"}
    assert [len(logs(i)) for i in ("end-1", "end-2", "end-done", "keep-3")] == [1, 1, 0, 0]


@pytest.mark.django_db
def test_signal_from_the_instance_page_validates_the_form(staff: Callable[..., Client]) -> None:
    make("listener")
    make("closed", status="completed")
    operator = staff(VIEW, SIGNAL)
    html(operator.get(url("signal", "listener")))

    bad = [
        ({"channel": "go", "payload": '{"x": '}, "not valid JSON"),
        ({"channel": "go", "payload": "[" * 100_000}, "not valid JSON"),
        ({"channel": "go", "payload": "NaN"}, "JSON"),
        ({"channel": "\u00e9" * 128, "payload": "1"}, "1 to 255 UTF-8 bytes"),
        ({"channel": "c" * 300, "payload": "1"}, "at most 255 characters"),
        ({"channel": "", "payload": "1"}, "This field is required"),
        ({"channel": "nul\x00", "payload": "1"}, "Null characters are not allowed"),
    ]
    for data, error in bad:
        page = html(operator.post(url("signal", "listener"), data))
        assert error in page, data["channel"][:10]
    page = html(operator.post(url("signal", "closed"), {"channel": "go", "payload": "1"}))
    assert "already completed" in page
    assert not SignalMessage.objects.exists()
    assert logs("listener") == [] and logs("closed") == []

    payload = {"items": [1, 2], "note": "<b>hi</b>"}
    response = operator.post(
        url("signal", "listener"), {"channel": "\u00e9" * 127, "payload": json.dumps(payload)}
    )
    assert response.status_code == 302
    (message,) = SignalMessage.objects.filter(instance_id="listener")
    assert message.channel == "\u00e9" * 127 and json.loads(message.payload) == payload
    (entry,) = logs("listener")
    assert "\u00e9" * 127 in entry.change_message and "hi" not in entry.change_message

    # An empty payload sends JSON null.
    operator.post(url("signal", "listener"), {"channel": "go", "payload": ""})
    assert SignalMessage.objects.get(instance_id="listener", channel="go").payload == "null"

    # A payload over MAX_PAYLOAD_BYTES is the operations layer's error, shown on the form.
    raw = dict(settings.SELVEDGE)
    with override_settings(SELVEDGE={**raw, "MAX_PAYLOAD_BYTES": 64}):
        page = html(
            operator.post(
                url("signal", "listener"), {"channel": "big", "payload": json.dumps("b" * 100)}
            )
        )
    assert "MAX_PAYLOAD_BYTES" in page
    assert not SignalMessage.objects.filter(channel="big").exists()


@pytest.mark.django_db
def test_export_downloads_a_parseable_history_and_is_logged(
    staff: Callable[..., Client],
) -> None:
    sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="exported")
    operator = staff(VIEW, EXPORT, PAYLOADS)
    assert operator.get(url("export", "exported")).status_code == 405
    response = operator.post(url("export", "exported"))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == (
        'attachment; filename="selvedge-history-exported.json"'
    )
    history = sv.parse_history(response.content)
    assert json.loads(response.content)["format"] == "selvedge.history/v1"
    assert history.instance.instance_id == "exported"
    assert history.instance.input == {"a": 1, "b": 2, "c": 3}
    (entry,) = logs("exported")
    assert "Exported" in entry.change_message


# -- changelist actions -------------------------------------------------------------------


@pytest.mark.django_db
def test_changelist_cancel_asks_for_a_reason_then_cancels_each_instance(
    staff: Callable[..., Client],
) -> None:
    for iid in ("bulk-1", "bulk-2", "other-3"):
        make(iid)
    make("bulk-done", status="completed")
    operator = staff(VIEW, CANCEL)
    selected = ["bulk-1", "bulk-2", "bulk-done"]
    page = html(
        operator.post(
            CHANGELIST, {"action": "cancel_instances", "_selected_action": selected, "index": "0"}
        )
    )
    assert 'name="reason"' in page and 'name="apply"' in page
    for iid in selected:
        assert f'name="_selected_action" value="{iid}"' in page
    assert not WorkflowInstance.objects.filter(cancel_requested=True).exists()

    response = operator.post(
        CHANGELIST,
        {
            "action": "cancel_instances",
            "_selected_action": selected,
            "select_across": "0",
            "apply": "1",
            "reason": "bulk stop",
        },
        follow=True,
    )
    page = html(response)
    assert "Cancellation requested for 2 instances." in page
    assert "1 instance skipped" in page and "already completed" in page
    cancelled = set(
        WorkflowInstance.objects.filter(cancel_requested=True).values_list("instance_id", flat=True)
    )
    assert cancelled == {"bulk-1", "bulk-2"}
    assert WorkflowInstance.objects.get(instance_id="bulk-1").cancel_reason == "bulk stop"
    assert [len(logs(i)) for i in ("bulk-1", "bulk-2", "bulk-done", "other-3")] == [1, 1, 0, 0]


@pytest.mark.django_db
def test_changelist_cancel_across_a_filtered_selection(staff: Callable[..., Client]) -> None:
    for n in range(3):
        make(f"run-{n}")
    make("fin-0", status="completed")
    operator = staff(VIEW, CANCEL)
    response = operator.post(
        CHANGELIST + "?status__exact=running",
        {
            "action": "cancel_instances",
            "_selected_action": ["run-0"],
            "select_across": "1",
            "apply": "1",
            "reason": "all of them",
        },
    )
    assert response.status_code == 302
    assert WorkflowInstance.objects.filter(cancel_requested=True).count() == 3
    assert not WorkflowInstance.objects.get(instance_id="fin-0").cancel_requested


@pytest.mark.django_db
def test_changelist_signal_validates_on_its_intermediate_page(
    staff: Callable[..., Client],
) -> None:
    make("sig-1")
    make("sig-2")
    operator = staff(VIEW, SIGNAL)
    base = {"action": "signal_instances", "_selected_action": ["sig-1", "sig-2"]}
    page = html(operator.post(CHANGELIST, {**base, "index": "0"}))
    assert 'name="channel"' in page and 'name="payload"' in page

    for data, error in (
        ({"channel": "go", "payload": "{oops"}, "not valid JSON"),
        ({"channel": "x" * 256, "payload": "1"}, "at most 255 characters"),
    ):
        page = html(operator.post(CHANGELIST, {**base, "apply": "1", **data}))
        assert error in page
    assert not SignalMessage.objects.exists()

    response = operator.post(
        CHANGELIST, {**base, "apply": "1", "channel": "go", "payload": '{"n": 1}'}, follow=True
    )
    assert "Signal sent to 2 instances." in html(response)
    assert sorted(SignalMessage.objects.values_list("instance_id", "payload")) == [
        ("sig-1", '{"n":1}'),
        ("sig-2", '{"n":1}'),
    ]
    assert len(logs("sig-1")) == len(logs("sig-2")) == 1


@pytest.mark.django_db
def test_changelist_export_downloads_one_file_or_a_zip(staff: Callable[..., Client]) -> None:
    for iid in ("exp-1", "exp/2"):
        sv.start_workflow("test.sum3", {"a": 1, "b": 1, "c": 1}, instance_id=iid)
    operator = staff(VIEW, EXPORT)
    one = operator.post(
        CHANGELIST, {"action": "export_instances", "_selected_action": ["exp-1"], "index": "0"}
    )
    assert one["Content-Type"].startswith("application/json")
    assert sv.parse_history(one.content).instance.instance_id == "exp-1"

    both = operator.post(
        CHANGELIST,
        {"action": "export_instances", "_selected_action": ["exp-1", "exp/2"], "index": "0"},
    )
    assert both["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(b"".join(both.streaming_content))) as archive:
        names = archive.namelist()
        ids = {sv.parse_history(archive.read(n)).instance.instance_id for n in names}
    assert ids == {"exp-1", "exp/2"}
    assert all("/" not in name for name in names)
    assert len(logs("exp-1")) == 2 and len(logs("exp/2")) == 1


# -- awkward ids --------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("instance_id", AWKWARD_IDS)
def test_ids_with_html_and_path_characters_are_escaped_and_their_pages_work(
    admin_client: Client, instance_id: str
) -> None:
    sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id=instance_id)
    make("child-of-awkward", parent_instance_id=instance_id, parent_key="child:1")

    href = escaped(url("change", instance_id))
    page = html(admin_client.get(CHANGELIST))
    assert escaped(instance_id) in page and href in page
    if instance_id.startswith("<"):
        assert instance_id not in page
    assert href in html(admin_client.get(url("change", "child-of-awkward")))

    page = html(admin_client.get(url("change", instance_id)))
    assert escaped(instance_id) in page
    if instance_id.startswith("<"):
        assert instance_id not in page
    assert url("change", "child-of-awkward") in page
    for name in ("cancel", "signal", "export"):
        assert escaped(url(name, instance_id)) in page
    html(admin_client.get(url("history", instance_id)))

    assert escaped(instance_id) in html(admin_client.get(url("signal", instance_id)))
    page = html(
        admin_client.post(
            CHANGELIST,
            {"action": "signal_instances", "_selected_action": [instance_id], "index": "0"},
        )
    )
    assert f'name="_selected_action" value="{escaped(instance_id)}"' in page
    if instance_id.startswith("<"):
        assert instance_id not in page
    response = admin_client.post(url("signal", instance_id), {"channel": "go", "payload": "1"})
    assert response.status_code == 302 and response["Location"] == url("change", instance_id)
    assert admin_client.post(url("cancel", instance_id), {"reason": "r"}).status_code == 302
    assert sv.describe(instance_id).cancel_requested

    response = admin_client.post(url("export", instance_id))
    assert sv.parse_history(response.content).instance.instance_id == instance_id
    disposition = response["Content-Disposition"]
    assert re.fullmatch(
        r'attachment; filename="selvedge-history-[A-Za-z0-9._-]+\.json"', disposition
    )

    assert {e.change_message.split(" ")[0] for e in logs(instance_id)} == {
        "Sent",
        "Requested",
        "Exported",
    }
    assert escaped(instance_id) in html(admin_client.get(url("history", instance_id)))


# -- the other admins ---------------------------------------------------------------------


@pytest.mark.django_db
def test_activity_task_admin_is_read_only_and_searches_exact_instance_ids(
    admin_client: Client,
) -> None:
    inst = make("tasks-of")
    make("tasks-of-other")
    ActivityTask.objects.create(
        instance=inst,
        workflow_name="test.sum3",
        key="activity:1",
        seq=1,
        name="test.add",
        input=json.dumps({"blob": "<b>" + "q" * 5000}),
        status="failed",
        attempts=3,
        failures=3,
        last_error=json.dumps({"type": "KeyError", "message": "<i>missing</i>"}),
    )
    base = "/admin/selvedge_django/activitytask/"
    page = html(admin_client.get(base))
    assert "test.add" in page and url("change", "tasks-of") in page
    assert "test.add" in html(admin_client.get(base + "?q=tasks-of"))
    assert "test.add" not in html(admin_client.get(base + "?q=tasks"))

    task = ActivityTask.objects.get()
    page = html(admin_client.get(f"{base}{task.pk}/change/"))
    assert escaped("KeyError: <i>missing</i>") in page
    assert "q" * 5000 not in page and escaped("<b>") in page
    assert admin_client.post(f"{base}{task.pk}/change/", {"status": "queued"}).status_code == 403

    SystemLock.objects.create(name="leader", owner="<w>", epoch=2, expires_ms=1)
    assert escaped("<w>") in html(admin_client.get("/admin/selvedge_django/systemlock/"))


# -- payload disclosure -------------------------------------------------------------------

CARD = "4111-1111-1111-1111"
APPROVER = "approved-by-alice@example.com"


def secret_instance(instance_id: str) -> str:
    iid = sv.start_workflow("disclosure.order", {"card": CARD}, instance_id=instance_id)
    sv.signal(iid, "approve", APPROVER)
    run_until_idle(Worker())
    return iid


@pytest.mark.django_db(transaction=True)
def test_values_stay_hidden_on_the_detail_page_without_view_payloads(
    staff: Callable[..., Client],
) -> None:
    iid = secret_instance("secret-detail")
    page = html(staff(VIEW).get(url("change", iid)))
    assert CARD not in page and APPROVER not in page
    assert "view_payloads" in page  # says why and what would show them
    shown = html(staff(VIEW, PAYLOADS).get(url("change", iid)))
    assert CARD in shown and APPROVER in shown


@pytest.mark.django_db(transaction=True)
def test_activity_task_values_stay_hidden_without_view_payloads(
    staff: Callable[..., Client],
) -> None:
    iid = secret_instance("secret-task")
    task = ActivityTask.objects.get(instance_id=iid)
    task_url = reverse("admin:selvedge_django_activitytask_change", args=(task.pk,))
    viewer = staff(VIEW, "view_activitytask")
    page = html(viewer.get(task_url))
    assert "<code>19</code>" not in page  # the input of limits.text: the card's length
    assert "<code>19</code>" in html(staff(VIEW, "view_activitytask", PAYLOADS).get(task_url))


@pytest.mark.django_db(transaction=True)
def test_export_is_redacted_without_view_payloads(staff: Callable[..., Client]) -> None:
    iid = secret_instance("secret-export")
    redacted = staff(VIEW, EXPORT).post(url("export", iid))
    assert redacted.status_code == 200
    body = b"".join(redacted.streaming_content) if redacted.streaming else redacted.content
    assert CARD.encode() not in body and APPROVER.encode() not in body
    assert b'"$redacted"' in body
    full = staff(VIEW, EXPORT, PAYLOADS).post(url("export", iid))
    body = b"".join(full.streaming_content) if full.streaming else full.content
    assert APPROVER.encode() in body
    assert "redacted" in logs(iid)[0].change_message


@pytest.mark.django_db
def test_a_multi_instance_export_streams_and_refuses_past_its_byte_cap(
    staff: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    from selvedge_django.admin import actions

    ids = [f"stream-{n}" for n in range(5)]
    for iid in ids:
        make(iid, input={"pad": "p" * 1000})
    operator = staff(VIEW, EXPORT, PAYLOADS)
    data = {"action": "export_instances", "_selected_action": ids, "index": "0"}
    response = operator.post(CHANGELIST, data)
    assert response.streaming, "the zip is built in memory"
    with zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content))) as archive:
        assert len(archive.namelist()) == 5
    # Past the cap: refused up front, with a message, no download.
    monkeypatch.setattr(actions, "MAX_EXPORT_BYTES", 3000)
    refused = operator.post(CHANGELIST, data, follow=True)
    assert "at most 3000 bytes" in html(refused)
    assert not refused.get("Content-Disposition")


@pytest.mark.django_db
def test_a_bulk_signal_is_refused_when_payload_times_targets_passes_the_cap(
    staff: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    from selvedge_django.admin import actions

    ids = [f"fan-{n}" for n in range(10)]
    for iid in ids:
        make(iid)
    monkeypatch.setattr(actions, "MAX_BULK_SIGNAL_BYTES", 50_000)
    operator = staff(VIEW, SIGNAL)
    base = {"action": "signal_instances", "_selected_action": ids, "apply": "1", "channel": "go"}
    page = html(operator.post(CHANGELIST, {**base, "payload": json.dumps("x" * 6000)}))
    assert "10 instances" in page and "50000 bytes" in page
    assert not SignalMessage.objects.exists()
    operator.post(CHANGELIST, {**base, "payload": json.dumps("x" * 4000)})
    assert SignalMessage.objects.count() == 10


# -- what the pages show: times, durations, empty values, flags, translations -------------


class _Marking(gettext_module.NullTranslations):
    """A "language" that marks every string it translates: ⟦text⟧."""

    def gettext(self, message: str) -> str:
        return f"\u27e6{message}\u27e7" if message else message

    def ngettext(self, singular: str, plural: str, n: int) -> str:
        return self.gettext(singular if n == 1 else plural)

    def pgettext(self, context: str, message: str) -> str:
        return self.gettext(message)

    def to_language(self) -> str:
        return "xx-marked"


@pytest.fixture
def marked_language() -> Any:
    trans_real._translations["xx-marked"] = _Marking()  # type: ignore[assignment]
    try:
        with translation.override("xx-marked"):
            yield
    finally:
        trans_real._translations.pop("xx-marked", None)


def test_history_shows_when_each_step_was_recorded_and_how_long_it_took(
    admin_client: Client,
) -> None:
    sv.start_workflow("test.admin.parent", {"child_id": "timing-child"}, instance_id="timing")
    run_until_idle(Worker())
    sv.signal("timing", "elsewhere", 1)
    add_row = HistoryEvent.objects.get(instance_id="timing", key="#2:test.add")
    HistoryEvent.objects.filter(id=add_row.id).update(
        arrived_at=add_row.created_at + timedelta(seconds=1.5)
    )
    page = html(admin_client.get(url("change", "timing")))
    headers = re.findall(r"<th>([^<]*)</th>", page.split('id="selvedge-history"')[1])[:9]
    assert "Recorded at" in headers and "Took" in headers
    assert "Delivered at position" in headers and "Delivered at" not in headers
    assert "<td>1.5 s</td>" in page
    signals = page.split('id="selvedge-signals"')[1]
    assert "Delivered at position" in signals and "Consumed at position" in signals


def test_closing_an_instance_clears_its_current_step(tdb: None) -> None:
    instance_id = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    worker = Worker()
    run_until_idle(worker)
    inst = WorkflowInstance.objects.get(instance_id=instance_id)
    assert inst.status == "completed"
    assert inst.current_step == ""


@pytest.mark.django_db
def test_empty_values_are_shown_one_way(admin_client: Client) -> None:
    make("empty-1", input=None)
    HistoryEvent.objects.create(
        instance_id="empty-1", key="#1:x", seq=1, command="activity", event_type="ActivityScheduled"
    )
    SignalMessage.objects.create(instance_id="empty-1", channel="c", payload="1")
    page = html(admin_client.get(url("change", "empty-1")))
    empty = '<span class="selvedge-empty">-</span>'
    sections = page.split('id="selvedge-history"')[1]
    assert "(no value yet)" not in sections and ">pending<" not in sections
    assert "<td></td>" not in sections
    assert sections.count(empty) >= 5  # value, reservation, delivery, took; signal positions
    # The description's empty fields use the admin's own rendering of the same mark.
    assert admin_client.get(url("change", "empty-1")).context["selvedge"]["empty"] == "-"


@pytest.mark.django_db
def test_changelist_shows_error_summaries_durations_and_unregistered_workflows(
    admin_client: Client,
) -> None:
    error = json.dumps({"type": "OrderRejected", "message": "no <stock>", "details": None})
    failed = make("failed-1", status="failed", error=error, age=timedelta(minutes=5))
    WorkflowInstance.objects.filter(instance_id="failed-1").update(
        closed_at=failed.started_at + timedelta(seconds=90)
    )
    make("orphan-1", name="not.registered.here")
    make("known-1", name="test.sum3")
    make("closed-unknown", status="completed", name="also.unknown")
    page = html(admin_client.get(CHANGELIST))
    assert escaped("OrderRejected: no <stock>") in page
    assert "1 min 30 s" in page
    assert page.count("not registered here") == 1  # running and unknown to this process


def test_admin_pages_are_translatable(admin_client: Client, marked_language: None) -> None:
    sv.start_workflow("test.admin.parent", {"child_id": "tr-child"}, instance_id="tr")
    run_until_idle(Worker())
    page = html(admin_client.get(url("change", "tr")))
    for text in ("Activity tasks", "Pending timers", "Signal inbox", "Children", "Took"):
        assert f"\u27e6{text}\u27e7" in page, text
    assert "\u27e6Export history\u27e7" in page
    changelist = html(admin_client.get(CHANGELIST))
    for text in ("instance id", "workflow name", "duration", "error"):
        assert f"\u27e6{text}\u27e7" in changelist, text
    form = html(admin_client.get(url("cancel", "tr")))
    assert "\u27e6Request cancellation\u27e7" in form
