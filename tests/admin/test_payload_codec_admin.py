"""The admin with SELVEDGE["PAYLOAD_CODEC"]: decoded values for ``view_payloads``, sizes for others.

The instance carries a secret through its input, an activity's input, heartbeat
details, result and error, a signal and its progress; the pages are fetched with
the test client, as an operator would see them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.urls import reverse

import selvedge_django as sv
from selvedge_django.codecs import FernetCodec, fernet_key_id
from selvedge_django.models import ActivityTask
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests import codec_workflows

SECRET = "qx-ADMIN-SECRET-9051"
KEY = FernetCodec.generate_key()
OTHER_KEY = FernetCodec.generate_key()
FERNET = "selvedge_django.codecs.FernetCodec"
VIEW = "view_workflowinstance"
PAYLOADS = "view_payloads"


def with_keys(*keys: str) -> Any:
    return override_settings(
        SELVEDGE={**settings.SELVEDGE, "PAYLOAD_CODEC": FERNET, "PAYLOAD_KEYS": list(keys)}
    )


@pytest.fixture
def encrypted(transactional_db: None) -> Iterator[None]:
    with with_keys(KEY):
        yield


@pytest.fixture
def staff(django_user_model: Any) -> Callable[..., Client]:
    made = 0

    def login(*codenames: str) -> Client:
        nonlocal made
        made += 1
        user = django_user_model.objects.create_user(username=f"codec{made}", is_staff=True)
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
            )
        client = Client()
        client.force_login(user)
        return client

    return login


def page(client: Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, response.status_code
    return str(response.content.decode())


def carried(instance_id: str) -> str:
    data = {"secret": SECRET, "id": instance_id}
    sv.start_workflow(codec_workflows.carry, data, instance_id=instance_id)
    run_until_idle(Worker())
    sv.signal(instance_id, "go", {"approved_by": SECRET})
    run_until_idle(Worker())
    assert sv.get_workflow_result(instance_id).status == "completed"
    return reverse("admin:selvedge_django_workflowinstance_change", args=(quote(instance_id),))


def test_only_view_payloads_shows_decoded_values_others_see_sizes(
    encrypted: None, staff: Callable[..., Client]
) -> None:
    path = carried("adm-1")
    shown = page(staff(VIEW, PAYLOADS), path)
    assert SECRET in shown  # input, history values, signal payloads, progress, output
    assert "$codec" not in shown  # no envelope reaches the page
    hidden = page(staff(VIEW), path)
    assert SECRET not in hidden and "$codec" not in hidden
    assert "view_payloads" in hidden  # the size, and what would show the value


def test_activity_task_pages_decode_inputs_details_and_errors(
    encrypted: None, staff: Callable[..., Client]
) -> None:
    carried("adm-2")
    for name in ("codec.echo", "codec.refuse"):
        task = ActivityTask.objects.get(instance_id="adm-2", name=name)
        path = reverse("admin:selvedge_django_activitytask_change", args=(task.pk,))
        shown = page(staff(VIEW, "view_activitytask", PAYLOADS), path)
        assert SECRET in shown and "$codec" not in shown
        hidden = page(staff(VIEW, "view_activitytask"), path)
        assert SECRET not in hidden
    assert "Refused" in hidden  # the error's type name stays clear


def test_a_server_without_the_key_names_it_instead_of_failing(
    transactional_db: None, staff: Callable[..., Client]
) -> None:
    with with_keys(KEY):
        path = carried("adm-3")
    with with_keys(OTHER_KEY):
        shown = page(staff(VIEW, PAYLOADS), path)
    assert SECRET not in shown
    assert fernet_key_id(KEY) in shown  # the key it would need
