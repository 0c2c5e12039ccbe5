"""The schedule admin with the test client: list, add, change, delete, pause, trigger, log."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

import selvedge_django as sv
from selvedge_django.models import Schedule, WorkflowInstance

CHANGELIST = "/admin/selvedge_django/schedule/"
ADD = f"{CHANGELIST}add/"


def url(name: str, schedule: str) -> str:
    return reverse(f"admin:selvedge_django_schedule_{name}", args=(quote(schedule),))


def errors(response: Any) -> list[str]:
    """The form errors of an admin page that did not redirect."""
    page = response.content.decode()
    return re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)


def logs(name: str) -> list[tuple[int, str]]:
    return [
        (entry.action_flag, entry.change_message)
        for entry in LogEntry.objects.filter(object_id=name).order_by("id")
    ]


@pytest.fixture
def staff(tdb: None, django_user_model: Any) -> Callable[..., Client]:
    """Log in a staff user with the given selvedge_django permission codenames."""
    made = 0

    def login(*codenames: str, csrf: bool = False) -> Client:
        nonlocal made
        made += 1
        user = django_user_model.objects.create_user(username=f"scheduler{made}", is_staff=True)
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
            )
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client

    return login


FORM = {
    "name": "nightly",
    "workflow": "sched.echo",
    "cron": "0 3 * * *",
    "interval": "",
    "timezone": "Europe/Paris",
    "input": '{"report": "sales"}',
    "overlap": "skip",
    "catchup_window": "60",
    "jitter": "0",
    "start_at": "",
    "end_at": "",
}


def test_the_changelist_shows_next_and_last_run(staff: Callable[..., Client]) -> None:
    sv.create_schedule("listed", "sched.echo", interval=3600)
    run_id = sv.trigger_schedule("listed")
    page = staff("view_schedule").get(CHANGELIST).content.decode()
    assert "listed" in page and "every 3600 s" in page
    assert (
        escape(reverse("admin:selvedge_django_workflowinstance_change", args=(quote(run_id),)))
        in page
    )


def test_add_change_and_delete_go_through_the_operations_layer_and_are_logged(
    staff: Callable[..., Client],
) -> None:
    client = staff(
        "add_schedule", "change_schedule", "delete_schedule", "view_schedule", "view_payloads"
    )
    response = client.post(ADD, FORM)
    assert response.status_code == 302, errors(response)
    described = sv.describe_schedule("nightly")
    assert described.cron == "0 3 * * *" and described.timezone == "Europe/Paris"
    assert described.input == {"report": "sales"} and described.next_run_at is not None

    changed = {**FORM, "cron": "", "interval": "600", "overlap": "allow_all"}
    response = client.post(url("change", "nightly"), changed)
    assert response.status_code == 302, errors(response)
    described = sv.describe_schedule("nightly")
    assert described.cron is None and described.interval is not None
    assert described.interval.total_seconds() == 600 and described.overlap == "allow_all"

    response = client.post(url("delete", "nightly"), {"post": "yes"})
    assert response.status_code == 302
    assert not Schedule.objects.exists()
    flags = [flag for flag, _ in logs("nightly")]
    assert flags == [ADDITION, CHANGE, DELETION]


def test_invalid_definitions_are_form_errors_and_write_nothing(
    staff: Callable[..., Client],
) -> None:
    client = staff("add_schedule", "view_schedule", "view_payloads")
    page = client.post(ADD, {**FORM, "cron": "every night"}).content.decode()
    assert "five fields" in page
    page = client.post(ADD, {**FORM, "interval": "60"}).content.decode()
    assert "exactly one of cron and interval" in page
    page = client.post(ADD, {**FORM, "timezone": "Mars/Base"}).content.decode()
    assert "unknown timezone" in page
    page = client.post(ADD, {**FORM, "timezone": "localtime"}).content.decode()
    assert "IANA" in page and "localtime" in page
    sv.create_schedule("nightly", "sched.echo", interval=60)
    page = client.post(ADD, FORM).content.decode()
    assert "already exists" in page
    assert Schedule.objects.count() == 1


def test_the_detail_page_shows_state_and_recent_runs(staff: Callable[..., Client]) -> None:
    sv.create_schedule("detailed", "sched.echo", interval=3600, input="<b>x</b>")
    run_id = sv.trigger_schedule("detailed")
    page = (
        staff("view_schedule", "trigger_schedule", "change_schedule")
        .get(url("change", "detailed"))
        .content.decode()
    )
    assert "Recent runs" in page and escape(run_id) in page and "running" in page
    assert url("trigger", "detailed") in page and url("pause", "detailed") in page
    assert "<b>x</b>" not in page  # no view_payloads: the input is neither shown nor editable
    view_only = staff("view_schedule").get(url("change", "detailed")).content.decode()
    assert url("trigger", "detailed") not in view_only
    assert url("pause", "detailed") not in view_only


def test_trigger_now_needs_the_trigger_permission_and_a_post(staff: Callable[..., Client]) -> None:
    sv.create_schedule("button", "sched.echo", interval=3600)
    assert staff("view_schedule").post(url("trigger", "button")).status_code == 403
    allowed = staff("view_schedule", "trigger_schedule")
    assert allowed.get(url("trigger", "button")).status_code == 405
    assert not WorkflowInstance.objects.exists()
    assert allowed.post(url("trigger", "button")).status_code == 302
    (run,) = WorkflowInstance.objects.all()
    assert run.instance_id.startswith("button@")
    assert logs("button") == [(CHANGE, f"Triggered a run: {run.instance_id}")]


def test_trigger_now_is_protected_against_csrf(staff: Callable[..., Client]) -> None:
    sv.create_schedule("csrf", "sched.echo", interval=3600)
    client = staff("view_schedule", "trigger_schedule", csrf=True)
    assert client.post(url("trigger", "csrf")).status_code == 403
    assert not WorkflowInstance.objects.exists()


def test_pause_and_unpause_buttons_and_actions(staff: Callable[..., Client]) -> None:
    sv.create_schedule("p1", "sched.echo", interval=3600)
    sv.create_schedule("p2", "sched.echo", interval=3600)
    assert staff("view_schedule").post(url("pause", "p1")).status_code == 403
    client = staff("view_schedule", "change_schedule")
    assert client.post(url("pause", "p1")).status_code == 302
    assert sv.describe_schedule("p1").paused
    assert client.post(url("unpause", "p1")).status_code == 302
    assert not sv.describe_schedule("p1").paused
    response = client.post(
        CHANGELIST, {"action": "pause_schedules", "_selected_action": ["p1", "p2"]}
    )
    assert response.status_code == 302
    assert all(s.paused for s in sv.list_schedules())
    assert [flag for flag, _ in logs("p1")] == [CHANGE, CHANGE, CHANGE]
    denied = staff("view_schedule", "change_schedule").post(
        CHANGELIST, {"action": "trigger_schedules", "_selected_action": ["p1"]}
    )
    assert not WorkflowInstance.objects.exists()  # trigger_schedule missing: no such action
    assert denied.status_code in (200, 302)


def test_the_schedule_pages_are_translatable(admin_client: Client) -> None:
    from django.utils import translation
    from django.utils.translation import trans_real

    from .test_admin import _Marking

    sv.create_schedule("tr", "sched.echo", interval=3600)
    sv.trigger_schedule("tr")
    trans_real._translations["xx-marked"] = _Marking()  # type: ignore[assignment]
    try:
        with translation.override("xx-marked"):
            page = admin_client.get(url("change", "tr")).content.decode()
            listed = admin_client.get(CHANGELIST).content.decode()
    finally:
        trans_real._translations.pop("xx-marked", None)
    for text in ("Trigger now", "Pause", "Recent runs", "Runs started", "Policies"):
        assert f"\u27e6{text}\u27e7" in page, text
    for text in ("next run", "last run", "when"):
        assert f"\u27e6{text}\u27e7" in listed, text


def test_built_in_workflows_are_scheduled_and_triggered_only_with_their_permissions(
    staff: Callable[..., Client],
) -> None:
    # A schedule runs its workflow with the stored input as often as it says: scheduling
    # selvedge.prune is starting it, so it needs what starting it from the admin needs.
    editor = staff("add_schedule", "change_schedule", "view_schedule", "view_payloads")
    prune = {**FORM, "name": "purge", "workflow": "selvedge.prune", "input": '{"older_than": 0}'}
    page = editor.post(ADD, prune).content.decode()
    assert "built-in workflow" in page
    task = {**FORM, "name": "task", "workflow": "selvedge.task", "input": "{}"}
    assert "built-in workflow" in editor.post(ADD, task).content.decode()
    assert not Schedule.objects.exists()

    # One made in code (as a project schedules its pruning) is left alone, but a user
    # without the permissions changes or triggers it only as far as any other schedule.
    sv.create_schedule("prune-weekly", "selvedge.prune", cron="0 4 * * SUN", input={})
    page = editor.post(url("change", "prune-weekly"), {**prune, "name": "prune-weekly"})
    assert "built-in workflow" in page.content.decode()
    assert sv.describe_schedule("prune-weekly").input == {}
    trigger = staff("view_schedule", "trigger_schedule")
    assert trigger.post(url("trigger", "prune-weekly")).status_code == 403
    assert not WorkflowInstance.objects.exists()

    allowed = staff(
        "add_schedule",
        "change_schedule",
        "view_schedule",
        "view_payloads",
        "trigger_schedule",
        "start_builtin_workflows",
        "delete_workflowinstance",
    )
    response = allowed.post(ADD, prune)
    assert response.status_code == 302, errors(response)
    assert sv.describe_schedule("purge").workflow_name == "selvedge.prune"
    assert allowed.post(url("trigger", "prune-weekly")).status_code == 302
    assert WorkflowInstance.objects.filter(workflow_name="selvedge.prune").count() == 1
    # selvedge.task is never scheduled by name, whatever the permissions.
    assert "built-in workflow" in allowed.post(ADD, task).content.decode()
