"""The health view (``selvedge_django.urls``): up or down for anyone, details for staff.

Through Django's test client, with real worker threads on the test database, and a
database that does not answer (a file that is not one, or a port nobody listens on).
"""

from __future__ import annotations

import json
import socket
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.db.utils import load_backend
from django.test import Client, override_settings
from django.urls import reverse

from selvedge_django.worker import Worker
from tests.conftest import wait_until

from .test_admin import VIEW, staff

__all__ = ["staff"]

HEALTH = reverse("selvedge:health")


def body(response: Any) -> dict[str, Any]:
    assert response["Content-Type"] == "application/json"
    return dict(json.loads(response.content))


def test_the_url_is_the_documented_one() -> None:
    assert HEALTH == "/selvedge/health/"


def test_anonymous_callers_get_up_and_nothing_else(
    make_worker: Callable[..., Worker],
) -> None:
    make_worker(worker_id="health-w1")
    response = Client().get(HEALTH)
    assert response.status_code == 200
    assert body(response) == {"status": "ok"}
    # Probes must not be served from a cache.
    assert "no-cache" in response["Cache-Control"] or "no-store" in response["Cache-Control"]
    assert Client().head(HEALTH).status_code == 200
    assert Client().post(HEALTH).status_code == 405


def test_staff_with_view_permission_get_the_status_report(
    make_worker: Callable[..., Worker], staff: Callable[..., Client]
) -> None:
    make_worker(worker_id="health-w1")
    make_worker(worker_id="health-w2", activity_queues=["mail"])
    operator = staff(VIEW)

    def report() -> dict[str, Any]:
        data = body(operator.get(HEALTH))
        ids = [w["worker_id"] for w in data["workers"]]
        return data if ids == ["health-w1", "health-w2"] and data["leader"] else {}

    data = wait_until(report)
    assert data["status"] == "ok"
    assert data["leader"] in ("health-w1", "health-w2")
    assert {"queues", "runnable_instances", "due_timers", "stuck", "hot_loops"} <= set(data)
    # Staff without the permission, or a user who is not staff, see only the status.
    assert body(staff().get(HEALTH)) == {"status": "ok"}


def test_a_user_with_the_permission_who_is_not_staff_sees_only_the_status(
    tdb: None, django_user_model: Any
) -> None:
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="probe", is_staff=False)
    user.user_permissions.add(Permission.objects.get(codename=VIEW))
    client = Client()
    client.force_login(user)
    assert body(client.get(HEALTH)) == {"status": "ok"}


@pytest.fixture
def broken_database(tdb: None, tmp_path: Path) -> Iterator[str]:
    """A database alias that does not answer, and SELVEDGE["DATABASE"] set to it."""
    alias = "unanswering"
    if connection.vendor == "postgresql":
        with socket.socket() as sock:  # a port nobody listens on once it is closed
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        config = {**settings.DATABASES["default"], "HOST": "127.0.0.1", "PORT": str(port)}
        config["OPTIONS"] = {"connect_timeout": 2}
    else:
        path = tmp_path / "not-a-database.sqlite3"
        path.write_bytes(b"this is not an SQLite database\n" * 200)
        config = {**settings.DATABASES["default"], "NAME": str(path)}
    # A connection made here, outside the handler's settings (a "dynamically created"
    # one, which the test case allows); DATABASES names it for SELVEDGE's validation.
    config = connections.configure_settings({"default": config})["default"]
    connections[alias] = load_backend(config["ENGINE"]).DatabaseWrapper(config, alias)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Overriding setting DATABASES", UserWarning)
            databases = override_settings(DATABASES={**settings.DATABASES, alias: config})
            databases.enable()
        try:
            with override_settings(SELVEDGE={**settings.SELVEDGE, "DATABASE": alias}):
                yield alias
        finally:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Overriding setting DATABASES", UserWarning)
                databases.disable()
    finally:
        connections[alias].close()
        del connections[alias]


def test_a_database_that_does_not_answer_is_a_503(
    broken_database: str, staff: Callable[..., Client]
) -> None:
    response = Client().get(HEALTH)
    assert response.status_code == 503
    assert body(response) == {"status": "unavailable"}
    detailed = body(staff(VIEW).get(HEALTH))
    assert detailed["status"] == "unavailable"
    assert detailed["database"] == broken_database
    assert detailed["error"]
