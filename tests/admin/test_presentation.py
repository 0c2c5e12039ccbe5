"""How the admin's own pages look: styles from a static file (a content security policy of
``style-src 'self'`` keeps them), statuses as badges, one time format, readable errors."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import selvedge_django as sv
from selvedge_django.admin.display import error_html, format_time
from selvedge_django.engine.codec import error_to_envelope
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/selvedge_django/workflowinstance/"
STARTED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
STYLESHEET = re.compile(r'<link rel="stylesheet" href="[^"]*selvedge_django/admin\.css">')


def page(client: Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return str(response.content.decode())


def instance_url(instance_id: str) -> str:
    return reverse("admin:selvedge_django_workflowinstance_change", args=(quote(instance_id),))


def make(instance_id: str, status: str = "running", **fields: Any) -> WorkflowInstance:
    return WorkflowInstance.objects.create(
        instance_id=instance_id,
        workflow_name="test.sum3",
        status=status,
        input={"a": 1},
        started_at=STARTED,
        updated_at=STARTED,
        closed_at=None if status == "running" else STARTED + timedelta(seconds=90),
        **fields,
    )


def failed_envelope() -> str:
    """A failed run's stored error, with the engine's real traceback of a raised exception."""

    def charge() -> None:
        raise ValueError("card <b>declined</b>")

    try:
        charge()
    except ValueError as error:
        return json.dumps(error_to_envelope(error))
    raise AssertionError("unreachable")


def with_steps(instance_id: str, status: str = "running") -> WorkflowInstance:
    """An instance with two steps in its history (a timeline) and one activity task."""
    inst = make(instance_id, status=status)
    for seq, key in ((1, "#1:test.add"), (2, "#2:test.add")):
        row = HistoryEvent.objects.create(
            instance=inst,
            key=key,
            seq=seq,
            command="activity",
            event_type="ActivityCompleted",
            data="3",
        )
        HistoryEvent.objects.filter(pk=row.pk).update(
            created_at=STARTED + timedelta(seconds=seq),
            arrived_at=STARTED + timedelta(seconds=seq + 1),
        )
    ActivityTask.objects.create(
        instance=inst,
        key="#1:test.add",
        seq=1,
        name="test.add",
        status="completed",
        input="{}",
        attempts=1,
    )
    return inst


def selvedge_pages(client: Client) -> dict[str, str]:
    with_steps("styled-1", status="failed")
    WorkflowInstance.objects.filter(instance_id="styled-1").update(error=failed_envelope())
    sv.create_schedule("nightly", "test.sum3", interval=60)
    paths = {
        "changelist": CHANGELIST,
        "instance": instance_url("styled-1"),
        "dashboard": f"{CHANGELIST}dashboard/",
        "schedule add": "/admin/selvedge_django/schedule/add/",
        "schedule": reverse("admin:selvedge_django_schedule_change", args=("nightly",)),
    }
    return {name: page(client, path) for name, path in paths.items()}


def test_the_pages_take_their_styles_from_a_static_file_not_inline(admin_client: Client) -> None:
    """Under SECURE_CSP with style-src 'self' and script-src 'self', nothing is blocked."""
    for name, html in selvedge_pages(admin_client).items():
        assert STYLESHEET.search(html), name
        assert "<style" not in html, name
        assert not re.search(r"<[^>]+\sstyle=", html), name
        for tag in re.findall(r"<script\b[^>]*>", html):
            # Only scripts from files (the admin's own), or JSON data that never runs.
            assert "src=" in tag or 'type="application/json"' in tag, (name, tag)


def test_the_stylesheet_ships_with_the_package() -> None:
    from django.contrib.staticfiles import finders

    found = finders.find("selvedge_django/admin.css")
    assert found, "selvedge_django/static/selvedge_django/admin.css"
    css = Path(found).read_text(encoding="utf-8")
    for rule in (".selvedge-badge-failed", ".selvedge-timeline", ".selvedge-meter-fill"):
        assert rule in css, rule


def test_statuses_are_badges_on_the_changelist_and_the_instance_page(admin_client: Client) -> None:
    make("badge-running")
    make("badge-failed", status="failed")
    child = make("badge-child", status="completed", parent_instance_id="badge-parent")
    WorkflowInstance.objects.filter(pk=child.pk).update(parent_key="#1:child")
    with_steps("badge-parent")
    listing = page(admin_client, CHANGELIST)
    assert (
        '<span class="selvedge-badge selvedge-badge-running" data-status="running">Running</span>'
    ) in listing
    assert 'class="selvedge-badge selvedge-badge-failed" data-status="failed">Failed<' in listing
    detail = page(admin_client, instance_url("badge-parent"))
    description = detail.split('id="selvedge-timeline"')[1].split('id="selvedge-history"')[0]
    assert 'data-status="running">Running</span>' in description
    tasks = detail.split('id="selvedge-tasks"')[1].split('id="selvedge-timers"')[0]
    assert 'class="selvedge-badge selvedge-badge-completed"' in tasks
    children = detail.split('id="selvedge-children"')[1]
    assert 'data-status="completed">Completed</span>' in children


def test_the_timeline_comes_before_the_description(admin_client: Client) -> None:
    with_steps("timeline-first")
    detail = page(admin_client, instance_url("timeline-first"))
    assert detail.index('id="selvedge-timeline"') < detail.index("<h2 ")
    assert detail.index('id="selvedge-timeline"') < detail.index("field-instance_id")


def test_one_time_format_with_the_zone_everywhere(admin_client: Client) -> None:
    with_steps("times-1", status="completed")
    moment = "2026-01-02 03:04:05 UTC"
    assert moment in page(admin_client, CHANGELIST)
    detail = page(admin_client, instance_url("times-1"))
    description = detail.split('id="selvedge-history"')[0]
    assert moment in description  # started at
    assert "2026-01-02 03:05:35 UTC" in description  # closed at
    history = detail.split('id="selvedge-history"')[1]
    assert "2026-01-02 03:04:06 UTC" in history
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d{6}", history)
    with timezone.override("Europe/Paris"):
        assert format_time(STARTED) == "2026-01-02 04:04:05 CET"
    assert format_time(None) == ""


def test_a_failed_runs_error_is_readable_text_with_its_traceback(admin_client: Client) -> None:
    make("failed-trace", status="failed", error=failed_envelope())
    detail = page(admin_client, instance_url("failed-trace"))
    error = detail.split('class="selvedge-error"')[1].split("</div></div>")[0]
    # Type and message, escaped.
    assert "ValueError: card &lt;b&gt;declined&lt;/b&gt;" in error
    assert "<b>declined" not in error
    # The traceback, pre-formatted, with real line breaks rather than JSON's escaped ones.
    trace = re.search(r'<pre class="selvedge-error-traceback">(.*?)</pre>', error, re.S)
    assert trace, error
    assert "Traceback (most recent call last):\n" in trace.group(1)
    assert "in charge\n    raise ValueError(&quot;card &lt;b&gt;declined" in trace.group(1)
    assert "\\n" not in error
    assert '"traceback"' not in error


def test_an_error_that_is_not_an_envelope_is_shown_as_it_is(admin_client: Client) -> None:
    make("failed-plain", status="failed", error="plain <text>\nsecond line")
    detail = page(admin_client, instance_url("failed-plain"))
    assert "<pre>plain &lt;text&gt;\nsecond line</pre>" in detail


def test_the_schedule_name_help_text_is_shown_escaped(admin_client: Client) -> None:
    form = page(admin_client, "/admin/selvedge_django/schedule/add/")
    assert "each run is &lt;name&gt;@&lt;slot as ISO 8601 UTC&gt;." in form
    assert "<name>" not in form and "each run is @." not in form


def test_an_errors_details_are_indented_json_without_the_engines_markers() -> None:
    envelope = {
        "type": "OrderRejected",
        "message": "no stock",
        "details": {"sku": "<mug>"},
        "fields": {"application_error": True},
        "traceback": "",
    }
    shown = str(error_html(json.dumps(envelope)))
    assert '<pre class="selvedge-error-details">{\n  &quot;details&quot;: {\n' in shown
    assert "&lt;mug&gt;" in shown
    assert "application_error" not in shown and "selvedge-error-traceback" not in shown
