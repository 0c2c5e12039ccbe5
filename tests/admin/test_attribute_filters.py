"""The changelist's search attribute filter, the instance page's attributes, bulk actions.

Instances are started through ``sv.start_workflow`` with attributes (the rows the
filter reads are the store's own); the pages are fetched with the test client.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

import selvedge_django as sv
from selvedge_django.models import WorkflowInstance

CHANGELIST = "/admin/selvedge_django/workflowinstance/"
IDS = ("acme-eu", "acme-us", "globex-eu", "plain")

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_superuser(username="root", email="", password=None)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def started() -> None:
    sv.start_workflow(
        "test.sum3",
        None,
        instance_id="acme-eu",
        attributes={"tenant": "acme", "region": "eu", "order": 7},
    )
    sv.start_workflow(
        "test.sum3",
        None,
        instance_id="acme-us",
        attributes={"tenant": "acme", "region": "us", "order": 8},
    )
    sv.start_workflow(
        "test.sum3",
        None,
        instance_id="globex-eu",
        attributes={"tenant": "globex", "region": "eu", "due": datetime(2026, 5, 1, tzinfo=UTC)},
    )
    sv.start_workflow("test.sum3", None, instance_id="plain")


def listed(client: Client, query: str = "") -> set[str]:
    response = client.get(CHANGELIST + query)
    assert response.status_code == 200
    page = response.content.decode()
    return {i for i in IDS if f"{i}/change/" in page}


def test_the_changelist_filters_by_attributes(admin_client: Client, started: None) -> None:
    assert listed(admin_client) == set(IDS)
    assert listed(admin_client, "?attr=tenant:acme") == {"acme-eu", "acme-us"}
    # Repeated: all must match; combined with the other filters.
    assert listed(admin_client, "?attr=tenant:acme&attr=region:eu") == {"acme-eu"}
    assert listed(admin_client, "?attr=region:eu&status__exact=running") == {"acme-eu", "globex-eu"}
    assert listed(admin_client, "?attr=region:eu&status__exact=completed") == set()
    # The text matches the number (or datetime) it spells too.
    assert listed(admin_client, "?attr=order:7") == {"acme-eu"}
    assert listed(admin_client, "?attr=due:" + quote("2026-05-01T00:00:00+00:00")) == {"globex-eu"}
    assert listed(admin_client, "?attr=tenant:nobody") == set()


def test_the_filter_box_suggests_names_and_lists_what_is_applied(
    admin_client: Client, started: None
) -> None:
    page = admin_client.get(CHANGELIST + "?attr=tenant:acme&attr=region:eu").content.decode()
    assert 'name="attr"' in page and 'placeholder="name:value"' in page
    for name in ("tenant", "region", "order", "due"):
        assert f'<option value="{name}:">' in page
    # The applied filters ride along in the box's form, and each has a link removing it.
    assert '<input type="hidden" name="attr" value="tenant:acme">' in page
    assert "?attr=region%3Aeu" in page and "?attr=tenant%3Aacme" in page


@pytest.mark.parametrize("query", ["?attr=tenant", "?attr=Tenant:acme", "?attr=:x"])
def test_a_malformed_attribute_filter_is_refused(
    admin_client: Client, started: None, query: str
) -> None:
    response = admin_client.get(CHANGELIST + query)
    # The admin's answer to bad lookup parameters: a redirect flagged with ?e=1.
    assert response.status_code == 302 and response["Location"].endswith("?e=1")


def test_the_instance_page_shows_its_attributes(admin_client: Client, started: None) -> None:
    page = admin_client.get(f"{CHANGELIST}globex-eu/change/").content.decode()
    assert "Search attributes" in page
    assert "<code>tenant</code>: <code>&quot;globex&quot;</code>" in page
    assert "<code>due</code>: <code>2026-05-01T00:00:00+00:00</code>" in page
    sv.start_workflow("test.sum3", None, instance_id="esc", attributes={"note": "<b>x</b>"})
    page = admin_client.get(f"{CHANGELIST}esc/change/").content.decode()
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page


def test_a_bulk_terminate_acts_on_the_attribute_filtered_selection(
    django_user_model: Any, started: None
) -> None:
    user = django_user_model.objects.create_user(username="op", is_staff=True)
    for codename in ("view_workflowinstance", "terminate_workflowinstance"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
        )
    client = Client()
    client.force_login(user)
    response = client.post(
        CHANGELIST + "?attr=tenant:acme",
        {
            "action": "terminate_instances",
            "_selected_action": ["acme-eu"],
            "select_across": "1",
            "apply": "1",
            "reason": "tenant offboarded",
        },
    )
    assert response.status_code == 302
    statuses = dict(WorkflowInstance.objects.values_list("instance_id", "status"))
    assert statuses == {
        "acme-eu": "failed",
        "acme-us": "failed",
        "globex-eu": "running",
        "plain": "running",
    }


def test_the_page_of_a_run_that_set_attributes_shows_the_command(admin_client: Client) -> None:
    from selvedge_django.testing import run_until_idle
    from selvedge_django.worker import Worker
    from tests.integration.test_attributes import bad

    iid = sv.start_workflow(bad, "name")
    run_until_idle(Worker())
    page = admin_client.get(f"{CHANGELIST}{iid}/change/").content.decode()
    # The history lists the command, the timeline draws it, the attributes are shown.
    assert "AttributesSet" in page
    assert 'class="selvedge-timeline"' in page
    assert "<code>outcome</code>: <code>&quot;caught&quot;</code>" in page
