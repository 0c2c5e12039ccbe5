"""Every attribute lookup is answered from an attribute index, on both databases.

The statement ``find_instances`` runs is captured and explained. On PostgreSQL
sequential scans are switched off for the explain, so a plan that still scans the
attribute table would mean no index can serve the lookup (a handful of rows would
otherwise make a scan the cheapest plan); SQLite's plan names the index it searches.
The benchmark (bench/bench_attributes.py) shows the same plans over a million rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import selvedge_django as sv

WHEN = datetime(2026, 1, 1, tzinfo=UTC)
TABLE = "selvedge_django_workflowattribute"


def explain(filters: dict[str, Any]) -> str:
    with CaptureQueriesContext(connection) as captured:
        sv.find_instances(attributes=filters)
    (statement,) = [
        q["sql"]
        for q in captured.captured_queries
        if TABLE in q["sql"]
        and "ORDER BY" in q["sql"]
        and "workflowinstance" in q["sql"].split("FROM")[1]
    ]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET enable_seqscan = off")
            try:
                cursor.execute("EXPLAIN " + statement)
                rows = cursor.fetchall()
            finally:
                cursor.execute("RESET enable_seqscan")
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + statement)
            rows = cursor.fetchall()
        return "\n".join(" ".join(str(c) for c in row) for row in rows)


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"tenant": "acme"}, "sv_attr_text_idx"),
        ({"tenant__in": ["acme", "globex"]}, "sv_attr_text_idx"),
        ({"tenant__gte": "b"}, "sv_attr_text_idx"),
        ({"vip": True}, "sv_attr_text_idx"),
        ({"amount": 5}, "sv_attr_number_idx"),
        ({"amount__gt": 5}, "sv_attr_number_idx"),
        ({"amount__lte": 5.5}, "sv_attr_number_idx"),
        ({"amount__in": [1, 2, 3]}, "sv_attr_number_idx"),
        ({"due__lt": WHEN}, "sv_attr_time_idx"),
        ({"due__in": [WHEN]}, "sv_attr_time_idx"),
    ],
)
def test_each_lookup_uses_its_attribute_index(
    tdb: None, filters: dict[str, Any], index: str
) -> None:
    for n in range(20):
        sv.start_workflow(
            "test.sum3",
            None,
            attributes={"tenant": f"t{n}", "amount": n, "vip": n % 2 == 0, "due": WHEN},
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    plan = explain(filters)
    assert index in plan, plan
    assert f"Seq Scan on {TABLE}" not in plan and f"SCAN {TABLE}" not in plan, plan
