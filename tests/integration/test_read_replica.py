"""SELVEDGE["READ_DATABASE"] on a real PostgreSQL streaming replica that lags.

The test makes its own pair of clusters (``tests/pgcluster.py``): a throwaway primary
and a hot standby of it built with ``pg_basebackup -R``. The engine's database is the
primary, the read database the standby. Pausing the standby's WAL replay makes it
stale on purpose (no timing involved): an operator's list then shows what the replica
has, while the reads that must see a write just made (the admin's page after the
action, ``describe``) show the primary's.

It runs on the PostgreSQL passes. Without the server binaries (``initdb``, ``pg_ctl``,
``pg_basebackup``) it is skipped with that reason, or fails when
``SELVEDGE_REPLICA_REQUIRED=1`` (CI sets it, so a missing binary cannot pass unnoticed).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import DatabaseError, connections
from django.test import Client, override_settings
from django.urls import reverse

import selvedge_django as sv
from selvedge_django.operations import status_report
from selvedge_django.operations.base import primary_reads
from tests.conftest import extra_database, wait_until
from tests.pgcluster import PrivateCluster, private_cluster, server_bin_dir, streaming_replica

ON_POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
PRIMARY, REPLICA = "replica_test_primary", "replica_test_standby"
NAME = "selvedge_replica"
CHANGELIST = "/admin/selvedge_django/workflowinstance/"
BIN_DIR = server_bin_dir()

pytestmark = pytest.mark.skipif(
    not ON_POSTGRES, reason="a PostgreSQL streaming replica: the PostgreSQL passes run it"
)


def require_server_binaries() -> None:
    """Skip (fail with SELVEDGE_REPLICA_REQUIRED=1) without the binaries a replica needs."""
    if BIN_DIR is not None and (BIN_DIR / "pg_basebackup").exists():
        return
    reason = "needs the PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup)"
    if os.environ.get("SELVEDGE_REPLICA_REQUIRED") == "1":
        pytest.fail(f"SELVEDGE_REPLICA_REQUIRED is set, but the test {reason}")
    pytest.skip(reason)


@sv.workflow(name="test.read_replica.waiter")
def waiter(ctx: sv.WorkflowContext, data: Any) -> Any:
    return ctx.receive("go")


def sql(cluster: PrivateCluster, statement: str, *params: Any) -> Any:
    """One statement on ``cluster`` (the selvedge database), outside Django; its first value."""
    import psycopg

    with psycopg.connect(autocommit=True, **cluster.connect_params(NAME)) as conn:
        row = conn.execute(statement, params or None).fetchone()
    return None if row is None else row[0]


def caught_up(primary: PrivateCluster, standby: PrivateCluster) -> None:
    """Wait until the standby has replayed everything the primary wrote so far."""
    lsn = str(sql(primary, "SELECT pg_current_wal_lsn()"))
    wait_until(
        lambda: sql(standby, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn), timeout=60
    )


def alias_settings(cluster: PrivateCluster) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": NAME,
        "USER": "postgres",
        "HOST": cluster.host,
        "PORT": str(cluster.port),
    }


@pytest.fixture
def replicated(tdb: None) -> Iterator[tuple[PrivateCluster, PrivateCluster]]:
    """The engine's database on a primary of the test's own, READ_DATABASE its standby."""
    require_server_binaries()
    with private_cluster() as primary:
        import psycopg

        with psycopg.connect(autocommit=True, **primary.connect_params()) as conn:
            conn.execute(f'CREATE DATABASE "{NAME}"')
        with (
            streaming_replica(primary) as standby,
            extra_database(PRIMARY, alias_settings(primary)),
            extra_database(REPLICA, alias_settings(standby)),
        ):
            call_command("migrate", database=PRIMARY, verbosity=0, interactive=False)
            engine = {**settings.SELVEDGE, "DATABASE": PRIMARY, "READ_DATABASE": REPLICA}
            with override_settings(SELVEDGE=engine):
                yield primary, standby


@pytest.fixture
def operator(django_user_model: Any) -> Callable[[], Client]:
    """A new logged-in staff user (a session of its own) who may view and terminate."""
    made = 0

    def login() -> Client:
        nonlocal made
        made += 1
        user = django_user_model.objects.create_user(username=f"replica{made}", is_staff=True)
        for codename in ("view_workflowinstance", "terminate_workflowinstance"):
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="selvedge_django", codename=codename)
            )
        client = Client()
        client.force_login(user)
        return client

    return login


@pytest.mark.timeout(300)
def test_operators_read_the_replica_and_the_page_after_an_action_reads_the_primary(
    replicated: tuple[PrivateCluster, PrivateCluster], operator: Callable[[], Client]
) -> None:
    primary, standby = replicated
    # A standby: in recovery, and read-only for whatever would write there by mistake.
    assert sql(standby, "SELECT pg_is_in_recovery()") is True
    with pytest.raises(DatabaseError, match="read-only"):
        connections[REPLICA].cursor().execute("DELETE FROM selvedge_django_workflowinstance")
    iid = sv.start_workflow("test.read_replica.waiter", {})
    caught_up(primary, standby)

    def listed_status() -> list[str]:
        return [d.status for d in sv.find_instances(instance_id=iid).instances]

    # Replicated: the operator's list on the replica finds the new instance.
    assert listed_status() == ["running"]
    assert status_report()["database"] == REPLICA

    # The replica stops replaying: from now on it lags behind every write.
    sql(standby, "SELECT pg_wal_replay_pause()")
    wait_until(
        lambda: sql(standby, "SELECT pg_get_wal_replay_pause_state()") == "paused", timeout=60
    )
    acting = operator()
    page = reverse("admin:selvedge_django_workflowinstance_change", args=(quote(iid),))
    terminate = reverse("admin:selvedge_django_workflowinstance_terminate", args=(quote(iid),))
    response = acting.post(terminate, {"reason": "lagging replica"}, follow=True)
    assert response.redirect_chain == [(page, 302)]
    # The page after the action shows the terminate: it read the primary.
    assert 'data-status="failed"' in response.content.decode()
    assert sql(primary, "SELECT status FROM selvedge_django_workflowinstance") == "failed"

    # The replica has not seen it, and the operator's reads that may lag show that.
    assert sql(standby, "SELECT status FROM selvedge_django_workflowinstance") == "running"
    assert listed_status() == ["running"]
    others = operator().get(CHANGELIST, {"q": iid}).content.decode()
    assert 'data-status="running"' in others and 'data-status="failed"' not in others
    # Reads that must see the write read the primary.
    assert sv.describe(iid).status == "failed"
    with primary_reads():
        assert listed_status() == ["failed"]

    # Replay resumes, and the replica catches up.
    sql(standby, "SELECT pg_wal_replay_resume()")
    caught_up(primary, standby)
    # Replayed up to the primary's position; the operator's list shows it (polled: a
    # standby's new snapshot may trail its replay position for a moment under load).
    wait_until(lambda: listed_status() == ["failed"], timeout=30)
    others = operator().get(CHANGELIST, {"q": iid}).content.decode()
    assert 'data-status="failed"' in others
