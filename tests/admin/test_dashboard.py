"""The admin's dashboard: counts by status and workflow, recent failures, slowest steps,
queue depths and workers, from bounded reads, for users with view permission.

Runs are real (worker threads on the test database); pages come from the test client.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import selvedge_django as sv
from selvedge_django.models import ActivityTask, WorkflowInstance
from selvedge_django.worker import Worker
from tests.conftest import wait_until

from .test_admin import CHANGELIST, VIEW, html, make, staff

__all__ = ["staff"]

DASHBOARD = reverse("admin:selvedge_django_workflowinstance_dashboard")


def section(page: str, name: str) -> str:
    match = re.search(rf'<div class="module" id="selvedge-{name}">(.*?)\n</div>', page, re.S)
    assert match, f"no {name} section"
    return match.group(1)


def status_count(page: str, status: str) -> str:
    match = re.search(
        rf'data-status="{status}">.*?<td class="num count">([^<]+)</td>',
        section(page, "by-status"),
        re.S,
    )
    assert match
    return match.group(1)


def test_the_dashboard_needs_view_permission_and_the_changelist_links_it(
    tdb: None, staff: Callable[..., Client]
) -> None:
    assert staff().get(DASHBOARD).status_code == 403
    viewer = staff(VIEW)
    assert DASHBOARD in html(viewer.get(CHANGELIST))
    assert viewer.post(DASHBOARD).status_code == 405
    page = html(viewer.get(DASHBOARD))
    assert "Workflow dashboard" in page
    assert "No worker is alive." in page


def test_counts_failures_slowest_steps_queues_and_workers(
    make_worker: Callable[..., Worker], staff: Callable[..., Client]
) -> None:
    make_worker(worker_id="dash-w", activity_queues=[""])  # not "status-parked"
    done = [sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": n}) for n in range(3)]
    toured = sv.start_workflow("status.tour", None)
    parked = sv.start_workflow("status.parked_flow", 1)
    for iid in done:
        assert sv.wait_workflow(iid, timeout=30).status == "completed"
    wait_until(lambda: "receive" in WorkflowInstance.objects.get(instance_id=toured).parked_key)
    sv.signal(toured, "go", None)
    assert sv.wait_workflow(toured, timeout=30).status == "completed"
    wait_until(lambda: ActivityTask.objects.filter(instance_id=parked).exists())
    # Failed runs: two in the last hour, one long before (not counted).
    make("failed-now-1", status="failed", error_type="shop.CardDeclined")
    make("failed-now-2", status="failed", error_type="shop.CardDeclined")
    make("<b>failed</b>-old", status="failed", error_type="Old", age=timedelta(hours=3))

    client = staff(VIEW)
    page = wait_until(lambda: (p := html(client.get(DASHBOARD))) and "(leader)" in p and p)
    # status.tour's child (child.echo) completed too.
    assert status_count(page, "completed") == "5"
    assert status_count(page, "running") == "1"
    assert status_count(page, "failed") == "3"
    assert status_count(page, "cancelled") == "0"

    by_workflow = section(page, "by-workflow")
    assert re.search(
        r"<td>test\.sum3</td><td class=\"num\">0</td><td class=\"num\">3</td>", by_workflow
    )

    failures = section(page, "failures")
    assert '<strong class="count">2</strong>' in failures
    assert "shop.CardDeclined" in failures and "Old" not in failures
    assert "failed-now-1" in failures and "&lt;b&gt;failed" not in failures

    slowest = section(page, "slowest")
    for name in ("test.add", "status.flaky", "child:child.echo"):
        assert f"<code>{name}</code>" in slowest

    queues = section(page, "queues")
    assert 'data-queue="status-parked"' in queues
    workers = section(page, "workers")
    assert "dash-w" in workers and "(leader)" in workers


def test_hostile_names_are_escaped_and_the_reads_do_not_grow_with_the_tables(
    tdb: None, staff: Callable[..., Client]
) -> None:
    client = staff(VIEW)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            html(client.get(DASHBOARD))
        return len(captured.captured_queries)

    hostile = '<script>alert("wf")</script>'
    make("h-1", name=hostile, status="failed", error_type="<img src=x onerror=alert(1)>")
    first = queries()
    page = html(client.get(DASHBOARD))
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&quot;wf&quot;)&lt;/script&gt;" in page
    for n in range(30):
        make(f"more-{n}", name=f"wf.{n % 7}", status=["running", "completed", "failed"][n % 3])
    assert queries() == first
