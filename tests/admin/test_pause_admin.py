"""The admin's pause and unpause of instances (page buttons, changelist actions, the
"paused" filter) and its queue page, each needing ``pause_workflowinstance`` and logged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

import selvedge_django as sv
from selvedge_django.models import ActivityQueue
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker

from .test_admin import CHANGELIST, VIEW, html, logs, url

PAUSE = "pause_workflowinstance"
QUEUES = reverse("admin:selvedge_django_workflowinstance_queues")


@pytest.fixture
def staff(django_user_model: Any) -> Callable[..., Client]:
    """Log in a new staff user with the given selvedge_django permission codenames."""
    made = 0

    def login(*codenames: str) -> Client:
        nonlocal made
        made += 1
        user = django_user_model.objects.create_user(username=f"pauser{made}", is_staff=True)
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
            )
        client = Client()
        client.force_login(user)
        return client

    return login


def parked(instance_id: str) -> str:
    iid = sv.start_workflow("pause.receive", None, instance_id=instance_id)
    run_until_idle(Worker())
    return iid


def test_pause_and_unpause_from_the_instance_page_need_the_permission_and_are_logged(
    tdb: None, staff: Callable[..., Client]
) -> None:
    iid = parked("adm-pause-1")
    viewer = staff(VIEW)
    assert url("pause", iid) not in html(viewer.get(url("change", iid)))
    assert viewer.get(url("pause", iid)).status_code == 403
    assert viewer.post(url("pause", iid), {"reason": "no"}).status_code == 403
    assert not sv.describe(iid).paused

    operator = staff(VIEW, PAUSE)
    page = html(operator.get(url("change", iid)))
    assert url("pause", iid) in page and url("unpause", iid) not in page
    form = html(operator.get(url("pause", iid)))
    assert 'name="reason"' in form and "csrfmiddlewaretoken" in form
    response = operator.post(url("pause", iid), {"reason": "provider down"})
    assert response.status_code == 302 and response["Location"] == url("change", iid)
    assert sv.describe(iid).paused_reason == "provider down"
    (entry,) = logs(iid)
    assert entry.action_flag == CHANGE and "provider down" in entry.change_message
    page = html(operator.get(url("change", iid)))
    assert url("unpause", iid) in page and url("pause", iid) not in page
    # A second pause (a stale page) is refused on the form, nothing logged.
    assert "paused already" in html(operator.post(url("pause", iid), {"reason": "x"}))
    assert len(logs(iid)) == 1
    response = operator.post(url("unpause", iid), {})
    assert response.status_code == 302
    assert not sv.describe(iid).paused
    assert "Unpaused" in logs(iid)[-1].change_message


def test_bulk_pause_and_unpause_actions_and_the_paused_filter(
    tdb: None, staff: Callable[..., Client]
) -> None:
    ids = [parked(f"adm-bulk-{n}") for n in range(3)]
    operator = staff(VIEW, PAUSE)
    confirm = html(
        operator.post(CHANGELIST, {"action": "pause_instances", "_selected_action": ids[:2]})
    )
    assert 'name="reason"' in confirm
    operator.post(
        CHANGELIST,
        {
            "action": "pause_instances",
            "_selected_action": ids[:2],
            "apply": "1",
            "reason": "bulk",
        },
    )
    assert [sv.describe(i).paused for i in ids] == [True, True, False]
    assert all(len(logs(i)) == 1 for i in ids[:2])
    listed = html(operator.get(CHANGELIST + "?paused=yes"))
    assert ids[0] in listed and ids[1] in listed and ids[2] not in listed
    assert listed.count('data-status="paused"') == 2 and "Running (paused)" in listed
    assert ids[2] in html(operator.get(CHANGELIST + "?paused=no"))
    operator.post(
        CHANGELIST, {"action": "unpause_instances", "_selected_action": ids, "apply": "1"}
    )
    assert not any(sv.describe(i).paused for i in ids)
    # The instance that was not paused is skipped, and has no log entry.
    assert len(logs(ids[2])) == 0
    viewer = staff(VIEW)
    actions = html(viewer.get(CHANGELIST))
    assert "pause_instances" not in actions


def test_the_queue_page_lists_pauses_and_unpauses_queues(
    tdb: None, staff: Callable[..., Client]
) -> None:
    sv.start_workflow("pause.activity", 1)
    run_until_idle(Worker(activity_queues=["other"]))
    viewer = staff(VIEW)
    page = html(viewer.get(QUEUES))
    assert "pq" in page and 'name="action"' not in page
    assert viewer.post(QUEUES, {"queue": "pq", "action": "pause"}).status_code == 403
    assert not ActivityQueue.objects.exists()
    assert QUEUES in html(viewer.get(CHANGELIST))

    operator = staff(VIEW, PAUSE)
    response = operator.post(QUEUES, {"queue": "pq", "action": "pause"})
    assert response.status_code == 302
    assert ActivityQueue.objects.get(name="pq").paused
    (entry,) = LogEntry.objects.filter(object_id="pq")
    assert entry.change_message == "Paused."
    page = html(operator.get(QUEUES))
    assert "paused" in page and 'value="unpause"' in page
    operator.post(QUEUES, {"queue": "pq", "action": "unpause"})
    assert not ActivityQueue.objects.get(name="pq").paused
    assert LogEntry.objects.filter(object_id="pq").count() == 2
    assert operator.post(QUEUES, {"queue": "x", "action": "drop"}).status_code == 302
    assert not ActivityQueue.objects.filter(name="x").exists()
    assert operator.get(QUEUES).status_code == 200
    assert Client().get(QUEUES).status_code == 302  # to the login page
