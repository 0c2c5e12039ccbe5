"""The admin's resume and fork: per-instance pages and changelist actions, each with its
own permission, a confirmation page and an admin log entry."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE
from django.contrib.auth.models import Permission
from django.test import Client

import selvedge_django as sv
from selvedge_django.models import WorkflowInstance
from tests.integration.test_resume import closed_in_every_way, drive, failed_order
from tests.testapp.workflows import recovery as resume_flows

from .test_admin import CHANGELIST, VIEW, html, logs, url

RESUME = "resume_workflowinstance"
FORK = "fork_workflowinstance"


@pytest.fixture
def staff(django_user_model: Any) -> Callable[..., Client]:
    """Log in a new staff user with the given selvedge_django permission codenames."""
    made = 0

    def login(*codenames: str) -> Client:
        nonlocal made
        made += 1
        user = django_user_model.objects.create_user(username=f"recovery{made}", is_staff=True)
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
            )
        client = Client()
        client.force_login(user)
        return client

    return login


@pytest.fixture(autouse=True)
def broken() -> None:
    resume_flows.BROKEN.clear()
    resume_flows.RUNS.clear()


def test_resume_from_the_instance_page_asks_for_reason_and_key_and_is_logged(
    tdb: None, staff: Callable[..., Client]
) -> None:
    iid = failed_order("adm-1")
    resume_flows.BROKEN.clear()
    viewer = staff(VIEW)
    assert url("resume", iid) not in html(viewer.get(url("change", iid)))
    assert viewer.get(url("resume", iid)).status_code == 403
    assert viewer.post(url("resume", iid), {"reason": "no"}).status_code == 403
    assert sv.describe(iid).status == "failed"

    operator = staff(VIEW, RESUME)
    assert url("resume", iid) in html(operator.get(url("change", iid)))
    assert url("fork", iid) not in html(operator.get(url("change", iid)))
    page = html(operator.get(url("resume", iid)))
    assert 'name="reason"' in page and 'name="from_key"' in page
    assert "csrfmiddlewaretoken" in page
    page = html(operator.post(url("resume", iid), {"from_key": "nope", "reason": "x"}))
    assert "not in the current history" in page
    assert sv.describe(iid).status == "failed" and logs(iid) == []
    response = operator.post(url("resume", iid), {"reason": "card fixed"})
    assert response.status_code == 302 and response["Location"] == url("change", iid)
    assert sv.describe(iid).generation == 2
    (entry,) = logs(iid)
    assert entry.action_flag == CHANGE and "Resumed as generation 2" in entry.change_message
    assert "card fixed" in entry.change_message
    page = html(operator.get(url("change", iid)))
    assert "Archived history" in page and "ActivityFailed" in page
    # Running now: no resume button, and a forged POST is refused on the form.
    assert url("resume", iid) not in html(operator.get(url("change", iid)))
    assert "is running" in html(operator.post(url("resume", iid), {"reason": "again"}))
    assert drive(iid) == "completed"


def test_fork_from_the_instance_page_redirects_to_the_new_instance(
    tdb: None, staff: Callable[..., Client]
) -> None:
    iid = failed_order("adm-2")
    assert staff(VIEW).get(url("fork", iid)).status_code == 403
    operator = staff(VIEW, FORK)
    assert url("fork", iid) in html(operator.get(url("change", iid)))
    response = operator.post(url("fork", iid), {"new_instance_id": "adm-2-copy"})
    assert response.status_code == 302 and response["Location"] == url("change", "adm-2-copy")
    assert sv.describe("adm-2-copy").forked_from == iid
    (entry,) = logs(iid)
    assert "Forked as 'adm-2-copy'" in entry.change_message
    page = html(operator.post(url("fork", iid), {"new_instance_id": "adm-2-copy"}))
    assert "already exists" in page


def test_changelist_resume_resumes_every_selected_failed_run(
    tdb: None, staff: Callable[..., Client]
) -> None:
    failed = [failed_order(f"bulk-{n}") for n in range(3)]
    running = sv.start_workflow("resume.signals", None, instance_id="bulk-running")
    resume_flows.BROKEN.clear()
    selected = [*failed, running]
    forker = staff(VIEW, FORK)
    assert 'value="resume_instances"' not in html(forker.get(CHANGELIST))
    forker.post(
        CHANGELIST, {"action": "resume_instances", "_selected_action": selected, "apply": "1"}
    )
    assert not WorkflowInstance.objects.filter(generation=2).exists()

    operator = staff(VIEW, RESUME)
    assert 'value="resume_instances"' in html(operator.get(CHANGELIST))
    page = html(
        operator.post(
            CHANGELIST, {"action": "resume_instances", "_selected_action": selected, "index": "0"}
        )
    )
    assert 'name="reason"' in page and 'name="from_key"' in page and 'name="apply"' in page
    response = operator.post(
        CHANGELIST,
        {
            "action": "resume_instances",
            "_selected_action": selected,
            "select_across": "0",
            "apply": "1",
            "reason": "provider fixed",
        },
        follow=True,
    )
    page = html(response)
    assert "Resumed 3 instances." in page
    assert "1 instance skipped" in page and "is running" in page
    assert [sv.describe(i).generation for i in failed] == [2, 2, 2]
    assert [len(logs(i)) for i in selected] == [1, 1, 1, 0]
    for iid in failed:
        assert drive(iid) == "completed"


def test_changelist_fork_forks_each_selected_instance(
    tdb: None, staff: Callable[..., Client]
) -> None:
    failed = [failed_order(f"fk-{n}") for n in range(2)]
    operator = staff(VIEW, FORK)
    response = operator.post(
        CHANGELIST,
        {
            "action": "fork_instances",
            "_selected_action": failed,
            "select_across": "0",
            "apply": "1",
        },
        follow=True,
    )
    assert "Forked 2 instances." in html(response)
    assert {sv.describe(f"{i}/fork-1").forked_from for i in failed} == set(failed)


def plan(page: str) -> dict[str, tuple[str, str]]:
    """The confirmation page's plan: each selected instance's status and what happens to it."""
    table = re.search(r'<table id="selvedge-plan".*?</table>', page, re.S)
    assert table is not None, "no plan table on the page"
    rows: dict[str, tuple[str, str]] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table.group(0), re.S):
        cells = [
            " ".join(re.sub(r"<[^>]+>", " ", cell).split())
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        if cells:
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_changelist_resume_resumes_only_the_failed_runs_unless_told_to_include_the_others(
    tdb: None, staff: Callable[..., Client]
) -> None:
    runs = closed_in_every_way()
    selected = list(runs.values())
    operator = staff(VIEW, RESUME)
    page = html(
        operator.post(
            CHANGELIST, {"action": "resume_instances", "_selected_action": selected, "index": "0"}
        )
    )
    rows = plan(page)
    assert rows["mix-failed"] == ("Failed", "Resumed")
    assert rows["mix-running"] == ("Running", "Skipped: it is running")
    for kind, status in (
        ("completed", "Completed"),
        ("cancelled", "Cancelled"),
        ("terminated", "Failed (terminated)"),
    ):
        assert rows[f"mix-{kind}"][0] == status
        assert rows[f"mix-{kind}"][1].startswith(f"Skipped: {kind}, not failed")
    assert 'name="include_closed"' in page
    assert "1 will be resumed, 4 skipped" in page

    response = operator.post(
        CHANGELIST,
        {"action": "resume_instances", "_selected_action": selected, "apply": "1"},
        follow=True,
    )
    page = html(response)
    assert "Resumed 1 instance." in page
    assert "4 instances skipped" in page and "mix-completed: completed, not failed" in page
    statuses = {kind: sv.describe(iid).status for kind, iid in runs.items()}
    assert statuses == {
        "failed": "running",
        "completed": "completed",
        "cancelled": "cancelled",
        "terminated": "failed",
        "running": "running",
    }
    assert [len(logs(iid)) for iid in selected] == [1, 0, 0, 0, 0]

    # With the option, the closed runs that did not fail are resumed too.
    page = html(
        operator.post(
            CHANGELIST,
            {
                "action": "resume_instances",
                "_selected_action": selected,
                "apply": "1",
                "include_closed": "on",
            },
            follow=True,
        )
    )
    assert "Resumed 3 instances." in page
    assert "2 instances skipped" in page
    assert {iid: sv.describe(iid).generation for iid in selected} == {
        "mix-failed": 2,
        "mix-completed": 2,
        "mix-cancelled": 2,
        "mix-terminated": 2,
        "mix-running": 1,
    }
    sv.signal(runs["cancelled"], "go", "now")
    sv.signal(runs["terminated"], "go", "now")
    for iid in selected[:4]:
        assert drive(iid) == "completed"
