"""The instance table leaves room on each page for HOT updates (migration 0024)."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="fillfactor is a PostgreSQL storage parameter"
)


def test_the_instance_table_keeps_a_fifth_of_each_page_free(db: None) -> None:
    """What a DBA reads in pg_class: 80 on the instance table, the default (none set) on
    the task and history tables, whose every update changes an indexed column."""
    tables = [
        "selvedge_django_workflowinstance",
        "selvedge_django_activitytask",
        "selvedge_django_historyevent",
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)", [tables])
        options = dict(cursor.fetchall())
    assert options == {
        "selvedge_django_workflowinstance": ["fillfactor=80"],
        "selvedge_django_activitytask": None,
        "selvedge_django_historyevent": None,
    }
