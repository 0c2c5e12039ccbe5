"""SELVEDGE["READ_DATABASE"]: which reads go to the read database, which stay on the engine's.

A second alias of the test database stands in for a replica here, so the tests run on
both databases and tell the two apart by the statements each connection ran;
``test_read_replica.py`` runs the same routes against a real streaming replica that lags.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.core.checks import run_checks
from django.db import connections, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import selvedge_django as sv
from selvedge_django import conf
from selvedge_django.operations import iter_instances, status_report
from selvedge_django.operations.base import primary_reads, read_alias
from selvedge_django.operations.versions import running_versions
from tests.conftest import extra_database
from tests.integration.test_settings import _check_in_subprocess as check_in_subprocess

CHANGELIST = "/admin/selvedge_django/workflowinstance/"
# The engine's tables, as both databases quote them (parameters are single-quoted).
ENGINE_TABLE = re.compile(r'"selvedge_django_\w+"')


@sv.workflow(name="test.read_database.waiter")
def waiter(ctx: sv.WorkflowContext, data: Any) -> Any:
    ctx.set_query_handler("stage", lambda: "waiting")
    return ctx.receive("go")


def engine_reads(alias: str) -> CaptureQueriesContext:
    """The statements ``alias``'s connection runs in the block."""
    return CaptureQueriesContext(connections[alias])


def on_engine_tables(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if ENGINE_TABLE.search(q["sql"])]


@pytest.fixture
def reader(tdb: None) -> Iterator[str]:
    """READ_DATABASE "reader": a second alias of the test database."""
    with (
        extra_database("reader", dict(connections["default"].settings_dict)),
        override_settings(SELVEDGE={**settings.SELVEDGE, "READ_DATABASE": "reader"}),
    ):
        yield "reader"


@pytest.fixture
def operator(django_user_model: Any) -> Callable[[], Client]:
    """A new logged-in staff user (a session of its own) who may view and terminate."""
    made = 0

    def login() -> Client:
        nonlocal made
        made += 1
        user = django_user_model.objects.create_user(username=f"reader{made}", is_staff=True)
        for codename in ("view_workflowinstance", "terminate_workflowinstance", "export_history"):
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
            )
        client = Client()
        client.force_login(user)
        return client

    return login


# -- the setting ---------------------------------------------------------------------------


def test_the_read_database_defaults_to_the_engine_s() -> None:
    assert conf.resolve_settings({}).read_database is None
    assert read_alias() == conf.get_settings().database


def test_an_unknown_read_database_is_error_e003() -> None:
    with override_settings(SELVEDGE={**settings.SELVEDGE, "READ_DATABASE": "no-such-alias"}):
        messages = [m for m in run_checks(tags=["selvedge"]) if m.id == "selvedge.E003"]
    assert len(messages) == 1
    assert "READ_DATABASE" in messages[0].msg and "no-such-alias" in messages[0].msg


# -- the operator's reads ----------------------------------------------------------------


def test_operator_reads_go_to_the_read_database(reader: str) -> None:
    iid = sv.start_workflow("test.read_database.waiter", {})
    reads: list[tuple[str, Callable[[], Any]]] = [
        ("find_instances", lambda: sv.find_instances(instance_id=iid).instances),
        ("iter_instances", lambda: list(iter_instances(limit=5))),
        ("status_report", status_report),
        ("export_history", lambda: sv.export_history(iid)),
        ("query", lambda: sv.query(iid, "stage")),
        ("running_versions", running_versions),
        ("list_queues", sv.list_queues),
    ]
    for what, read in reads:
        with engine_reads("default") as primary, engine_reads(reader) as replica:
            answer = read()
        assert answer is not None, what
        assert on_engine_tables(replica), what
        assert not on_engine_tables(primary), (what, on_engine_tables(primary))
    assert status_report()["database"] == reader
    assert [d.instance_id for d in sv.find_instances(instance_id=iid).instances] == [iid]
    assert sv.query(iid, "stage") == "waiting"


def test_reads_that_must_see_a_write_read_the_engine_s_database(reader: str) -> None:
    iid = sv.start_workflow("test.read_database.waiter", {})

    def find() -> list[str]:
        return [d.instance_id for d in sv.find_instances(instance_id=iid).instances]

    # describe() and the result follow the caller's own writes: always the engine's.
    with engine_reads(reader) as replica:
        assert sv.describe(iid).status == "running"
        assert sv.get_workflow_result(iid).status == "running"
    assert replica.captured_queries == []
    # What the caller marks as needing its writes, and what runs inside its transaction.
    with engine_reads(reader) as replica, primary_reads():
        assert read_alias() == "default"
        assert find() == [iid]
    assert replica.captured_queries == []
    with engine_reads(reader) as replica, transaction.atomic():
        assert read_alias() == "default"
        assert find() == [iid]
    assert replica.captured_queries == []
    assert read_alias() == reader


# -- the admin ---------------------------------------------------------------------------


def test_admin_pages_read_the_read_database_until_an_action(
    reader: str, operator: Callable[[], Client]
) -> None:
    iid = sv.start_workflow("test.read_database.waiter", {})
    page = reverse("admin:selvedge_django_workflowinstance_change", args=(quote(iid),))
    terminate = reverse("admin:selvedge_django_workflowinstance_terminate", args=(quote(iid),))
    dashboard = reverse("admin:selvedge_django_workflowinstance_dashboard")
    client = operator()
    for shown in (CHANGELIST, page, dashboard):
        with engine_reads("default") as primary, engine_reads(reader) as replica:
            assert client.get(shown).status_code == 200
        assert on_engine_tables(replica), shown
        assert not on_engine_tables(primary), (shown, on_engine_tables(primary))

    # An export is a POST that only reads: the read database, and the session is no fresher.
    export = reverse("admin:selvedge_django_workflowinstance_export", args=(quote(iid),))
    with engine_reads("default") as primary, engine_reads(reader) as replica:
        assert client.post(export).status_code == 200
    assert on_engine_tables(replica)
    assert not on_engine_tables(primary), on_engine_tables(primary)
    assert "selvedge_acted_at" not in client.session

    # The action reads and writes the engine's database; so does the page it lands on.
    with engine_reads("default") as primary, engine_reads(reader) as replica:
        response = client.post(terminate, {"reason": "by hand"}, follow=True)
    assert response.redirect_chain == [(page, 302)]
    assert 'data-status="failed"' in response.content.decode()
    assert on_engine_tables(primary)
    assert not on_engine_tables(replica), on_engine_tables(replica)
    # ... and the next pages of that session, for a while.
    with engine_reads(reader) as replica:
        assert client.get(CHANGELIST).status_code == 200
    assert not on_engine_tables(replica)
    # Another operator's session still reads the read database.
    with engine_reads(reader) as replica:
        assert operator().get(CHANGELIST).status_code == 200
    assert on_engine_tables(replica)


def test_without_a_read_database_the_admin_leaves_the_session_alone(
    tdb: None, operator: Callable[[], Client]
) -> None:
    iid = sv.start_workflow("test.read_database.waiter", {})
    client = operator()
    terminate = reverse("admin:selvedge_django_workflowinstance_terminate", args=(quote(iid),))
    assert client.post(terminate, {"reason": ""}).status_code == 302
    assert "selvedge_acted_at" not in client.session


# -- the system checks ---------------------------------------------------------------------

_SQLITE = '"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {"transaction_mode": "IMMEDIATE"}'
_PG = '"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "db"'


@pytest.mark.parametrize(
    ("databases", "expected"),
    [
        pytest.param(
            f'{{"default": {{{_SQLITE}, "NAME": Path("app.sqlite3")}},'
            f' "reader": {{{_SQLITE}, "NAME": "app.sqlite3"}}}}',
            None,
            id="sqlite-same-file",
        ),
        pytest.param(
            f'{{"default": {{{_SQLITE}, "NAME": "app.sqlite3"}},'
            f' "reader": {{{_SQLITE}, "NAME": "copy.sqlite3"}}}}',
            "selvedge.E010",
            id="sqlite-another-file",
        ),
        pytest.param(
            f'{{"default": {{{_SQLITE}, "NAME": "app.sqlite3"}},'
            f' "reader": {{{_PG}, "PORT": "5432"}}}}',
            "selvedge.E010",
            id="sqlite-with-a-postgresql-reader",
        ),
        pytest.param(
            f'{{"default": {{{_PG}, "PORT": "5432"}},'
            f' "reader": {{{_PG}, "HOST": "replica", "PORT": "5432"}}}}',
            None,
            id="postgresql-replica",
        ),
        pytest.param(
            f'{{"default": {{{_PG}, "PORT": "5432", "ATOMIC_REQUESTS": True}},'
            f' "reader": {{{_PG}, "HOST": "replica", "PORT": "5432"}}}}',
            "selvedge.W012",
            id="atomic-requests",
        ),
    ],
)
def test_read_database_checks(tmp_path: Path, databases: str, expected: str | None) -> None:
    """E010: READ_DATABASE is another kind of database, or another SQLite file; W012:
    ATOMIC_REQUESTS on the engine's database keeps every request's reads there."""
    result = check_in_subprocess(tmp_path, databases, '{"READ_DATABASE": "reader"}')
    output = result.stdout + result.stderr
    found = set(re.findall(r"selvedge\.[EW]\d{3}", output))
    assert found == ({expected} if expected else set()), output
    assert (result.returncode != 0) == (expected == "selvedge.E010"), output
    if expected == "selvedge.E010":
        assert "READ_DATABASE" in output and "not a copy" in output, output
    if expected == "selvedge.W012":
        assert "ATOMIC_REQUESTS" in output, output
