"""The instance page's streams section: each stream, and the last entries with their attempt."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

import selvedge_django as sv
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests.testapp.workflows.streams import run_once, steps


def page_of(client: Client, instance_id: str) -> str:
    url = reverse("admin:selvedge_django_workflowinstance_change", args=(quote(instance_id),))
    response = client.get(url)
    assert response.status_code == 200
    page = response.content.decode().split('id="selvedge-streams"')[1]
    return page.split('id="selvedge-children"')[0]


def login(django_user_model: Any, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(username="-".join(codenames), is_staff=True)
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
        )
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db(transaction=True)
def test_the_page_shows_streams_and_their_last_entries(django_user_model: Any) -> None:
    workflow = sv.start_workflow(steps, 2)
    activity = sv.start_workflow(run_once, "a secret token")
    run_until_idle(Worker())
    viewer = login(django_user_model, "view_workflowinstance", "view_payloads")
    section = page_of(viewer, workflow)
    assert "<code>steps</code></td><td>2</td><td>open</td>" in section
    entries = section.split("<h3>")[1]
    rows = re.findall(r"<tr>\s*<td><code>steps</code></td>\s*<td>(\d+)</td>", entries)
    assert rows == ["2", "1"]  # newest first
    assert "workflow" in section and "{&quot;step&quot;:1}" in section
    section = page_of(viewer, activity)
    assert re.search(r"<td>1</td>\s*<td>1</td>\s*<td><code>#1:test.streams.once</code>", section)
    assert "a secret token" in section
    # Without view_payloads: sizes, not values.
    hidden = page_of(login(django_user_model, "view_workflowinstance"), activity)
    assert "a secret token" not in hidden and "hidden" in hidden
    sv.signal(workflow, "go")
    run_until_idle(Worker())
    assert "<td>3</td><td>closed</td>" in page_of(viewer, workflow)


@pytest.mark.django_db(transaction=True)
def test_an_instance_without_streams_says_so(django_user_model: Any) -> None:
    iid = sv.start_workflow("test.add", {"a": 1, "b": 2})
    run_until_idle(Worker())
    assert "No streams." in page_of(login(django_user_model, "view_workflowinstance"), iid)


@pytest.mark.django_db(transaction=True)
def test_the_page_follows_open_streams_live_for_users_who_see_values(
    django_user_model: Any,
) -> None:
    iid = sv.start_workflow(steps, 2)
    run_until_idle(Worker())
    viewer = login(django_user_model, "view_workflowinstance", "view_payloads")
    section = page_of(viewer, iid)
    found = re.search(r'class="selvedge-live-stream" data-url="([^"]+)"', section)
    assert found is not None
    url = html.unescape(found.group(1))
    assert url.endswith("/stream-events/?key=steps&after=2")
    assert "selvedge_django/streams.js" in section
    # Without view_payloads: no live list, and the view refuses.
    other = login(django_user_model, "view_workflowinstance")
    assert "selvedge-live-stream" not in page_of(other, iid)
    assert other.get(url).status_code == 403
    # What the page's EventSource gets: the entries after the ones shown, once written.
    sv.signal(iid, "go")
    run_until_idle(Worker())  # writes entry 3 and closes the stream
    response = viewer.get(url)
    assert response["Content-Type"] == "text/event-stream"
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    assert "id: 3\n" in body and "id: 2\n" not in body and "event: end" in body
    missing = url.replace(quote(iid), "nobody")
    assert viewer.get(missing).status_code == 404
    assert viewer.get(url.replace("key=steps", "key=")).status_code == 400
