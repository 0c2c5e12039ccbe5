#!/usr/bin/env python
"""Admin benchmark: the workflow instance changelist on a large table.

    python bench/bench_admin.py [--db sqlite|postgres|all] [--instances N] [--repeat R]

Fills a throwaway database (``bench/harness.py``) with N workflow instances
(default 100,000) through ``bulk_create``, then loads admin pages with Django's
test client as a superuser and prints, per page, the SQL statements it ran and
its response time (median and best of R loads after one warm-up load):

* the plain changelist (newest first, 100 rows);
* filtered by status, by workflow name and by start date, and sorted by the
  other indexed columns (workflow name, close time);
* searched by a full instance id and by a fragment of one;
* the detail page of one instance (with its timeline);
* the dashboard, and the health view as staff (the status report).

The statement count must not depend on N; the times do, a little, through the
page's ``COUNT(*)`` and, for the search, the scan of the id column.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import bench_database, each_database  # noqa: E402 - the repository root goes on the path first

CHANGELIST = "/admin/selvedge_django/workflowinstance/"
NAMES = ["bench.order", "bench.payment", "bench.shipping", "bench.refund", "bench.report"]
# Roughly what a busy deployment accumulates: mostly closed, some running.
STATUSES = ["completed"] * 14 + ["running"] * 4 + ["failed"] + ["cancelled"]
BATCH = 5000


def populate(count: int) -> tuple[str, datetime]:
    """Insert ``count`` instances spread over 30 days; return one id and the newest start."""
    from django.db import connection

    from selvedge_django.models import WorkflowInstance

    rng = random.Random(42)
    now = datetime.now(UTC)
    rows = []
    for n in range(count):
        started = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
        status = rng.choice(STATUSES)
        closed = None if status == "running" else started + timedelta(seconds=rng.uniform(1, 60))
        rows.append(
            WorkflowInstance(
                instance_id=f"order-{n:07d}-{rng.getrandbits(32):08x}",
                workflow_name=rng.choice(NAMES),
                status=status,
                input={"order": n, "items": [1, 2, 3]},
                output="42" if status == "completed" else None,
                parent_instance_id=f"order-{n - 1:07d}" if n % 10 == 9 else "",
                parent_key="#1:child:bench.refund" if n % 10 == 9 else "",
                started_at=started,
                updated_at=closed or started,
                closed_at=closed,
                runnable=status == "running",
            )
        )
        if len(rows) == BATCH:
            WorkflowInstance.objects.bulk_create(rows)
            rows = []
    if rows:
        WorkflowInstance.objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    sample = WorkflowInstance.objects.order_by("instance_id").values_list("instance_id", flat=True)
    return str(sample[count // 2]), now


def register_workflows() -> None:
    """Register the workflow names, so the name filter offers them as a deployment's would."""
    import selvedge_django as sv

    for name in NAMES:
        sv.workflow(name=name)(lambda ctx, data: data)


def measure(client: Any, url: str, repeat: int) -> dict[str, Any]:
    """Load ``url`` once to warm up, then ``repeat`` times; return statements, times and rows."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times = []
    sql_times = []
    queries = set()
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        queries.add(len(ctx.captured_queries))
        sql_times.append(sum(float(q["time"]) for q in ctx.captured_queries) * 1000)
    body = response.content.decode()
    return {
        "queries": "/".join(str(q) for q in sorted(queries)),
        "median": statistics.median(times),
        "best": min(times),
        "sql_ms": statistics.median(sql_times),
        "rows": body.count('name="_selected_action"'),
        "sql": [(float(q["time"]) * 1000, q["sql"]) for q in ctx.captured_queries],
    }


def run_one(db: str, count: int, repeat: int, show_sql: bool) -> None:
    # A database of its own, so it never collides with another benchmark's run.
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_admin_{os.getpid()}")
    with bench_database(db, "bench.settings_admin") as info:
        import django
        from django.contrib.admin.utils import quote
        from django.contrib.auth.models import User
        from django.test import Client

        register_workflows()
        started = time.perf_counter()
        sample, now = populate(count)
        fill = time.perf_counter() - started
        user = User.objects.create_superuser("bench", "", None)
        client = Client()
        client.force_login(user)

        since = quote_plus(str((now - timedelta(days=7)).replace(microsecond=0)))
        pages = [
            ("changelist", CHANGELIST),
            ("status = running", f"{CHANGELIST}?status__exact=running"),
            ("workflow name", f"{CHANGELIST}?workflow_name=bench.payment"),
            ("started, past 7 days", f"{CHANGELIST}?started_at__gte={since}"),
            ("status + name", f"{CHANGELIST}?status__exact=failed&workflow_name=bench.refund"),
            ("sorted by name", f"{CHANGELIST}?o=2"),
            ("sorted by close time", f"{CHANGELIST}?o=-7"),
            ("search, full id", f"{CHANGELIST}?q={quote_plus(sample)}"),
            ("search, fragment", f"{CHANGELIST}?q={quote_plus(sample[6:12])}"),
            ("detail page", f"{CHANGELIST}{quote(sample)}/change/"),
            ("dashboard", f"{CHANGELIST}dashboard/"),
            ("health view, staff", "/selvedge/health/"),
        ]
        print(
            f"\n== {info['version']}: {count:,} instances (inserted in {fill:.1f} s), "
            f"Django {django.get_version()}, Python {platform.python_version()}"
        )
        print(f"{'page':<24}{'queries':>8}{'median ms':>11}{'best ms':>9}{'SQL ms':>8}{'rows':>6}")
        for label, url in pages:
            result = measure(client, url, repeat)
            print(
                f"{label:<24}{result['queries']:>8}{result['median']:>11.1f}"
                f"{result['best']:>9.1f}{result['sql_ms']:>8.1f}{result['rows']:>6}"
            )
            if show_sql:
                for ms, sql in result["sql"]:
                    print(f"    {ms:7.1f} ms  {sql[:300]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--instances", type=int, default=100_000, metavar="N")
    parser.add_argument("--repeat", type=int, default=5, metavar="R")
    parser.add_argument("--sql", action="store_true", help="print each page's statements")
    args = parser.parse_args(argv)
    if args.instances < 1 or args.repeat < 1:
        parser.error("--instances and --repeat must be at least 1")
    if args.db != "all":
        run_one(args.db, args.instances, args.repeat, args.sql)
        return 0
    options = ["--instances", str(args.instances), "--repeat", str(args.repeat)]
    return each_database(__file__, options + (["--sql"] if args.sql else []))


if __name__ == "__main__":
    sys.exit(main())
