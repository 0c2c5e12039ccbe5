"""Search attributes at scale: the first page of a selective query, its plan, and the start cost.

    python bench/bench_attributes.py                      # both databases
    python bench/bench_attributes.py --db postgres        # 1,000,000 instances
    python bench/bench_attributes.py --db sqlite          # 200,000 instances
    python bench/bench_attributes.py --db postgres --instances 100000 --starts 500

Fills a fresh database in bulk with SQL (``generate_series`` on PostgreSQL, a
recursive CTE on SQLite): N instances, each with three attributes, ``customer``
(N / 10 values: a selective filter, 10 instances each), ``tenant`` (100 values,
1 %) and ``amount`` (an int, 10,000 values), and every tenth also ``due`` (a
datetime). Then, after VACUUM ANALYZE (SQLite: ANALYZE):

1. Each query below runs through ``sv.find_instances(attributes=..., limit=50)``
   (what a user calls: the page and its instances' attributes), 30 times; the
   median and best first-page times (after 5 warm-up calls) are printed with the
   median time of its instance query alone and the plan of that query
   (``EXPLAIN ANALYZE`` on PostgreSQL, ``EXPLAIN QUERY PLAN`` on SQLite) and
   whether that plan scans a whole table. The target: a selective query's
   first page under 20 ms, from an index.
2. ``sv.start_workflow`` with no attributes and with five, in interleaved rounds
   (so drift on a shared machine hits both alike), on the filled database: the
   median time per start of each and their ratio (target: under 1.20).

With ``--compare-json`` (PostgreSQL) the same attributes are also copied into
one ``jsonb`` document per instance with a GIN index (``jsonb_path_ops``), the
alternative to the side table, and the same filters are timed and explained
there, with both tables' sizes.

Nothing is asserted; the figures are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_database, each_database

DEFAULT_INSTANCES = {"postgres": 1_000_000, "sqlite": 200_000}
PAGE = 50
REPEATS = 30
T0 = datetime(2026, 1, 1, tzinfo=UTC)

FILL_POSTGRES = [
    """
    INSERT INTO selvedge_django_workflowinstance
      (instance_id, workflow_name, status, input, lease_owner, lease_epoch, runnable,
       cancel_requested, cancel_reason, parent_instance_id, parent_key, service_name,
       current_step, started_at, updated_at, closed_at, output, ready_ms)
    SELECT 'wf-' || g, 'bench.attr' || (g %% 20), 'completed', '1', '', 1, false, false,
           '', '', '', '', '', now() - (g || ' seconds')::interval, now(), now(), '1', 0
    FROM generate_series(1, %(n)s) AS g
    """,
    """
    INSERT INTO selvedge_django_workflowattribute
      (instance_id, name, kind, text_value, number_value, time_value)
    SELECT 'wf-' || g, 'customer', 's', 'c' || (g %% (%(n)s / 10)), NULL::float8,
           NULL::timestamptz
    FROM generate_series(1, %(n)s) AS g
    UNION ALL
    SELECT 'wf-' || g, 'tenant', 's', 't' || (g %% 100), NULL, NULL
    FROM generate_series(1, %(n)s) AS g
    UNION ALL
    SELECT 'wf-' || g, 'amount', 'i', (g %% 10000)::text, (g %% 10000)::float, NULL
    FROM generate_series(1, %(n)s) AS g
    UNION ALL
    SELECT 'wf-' || g, 'due', 't', NULL, NULL,
           TIMESTAMPTZ '2026-01-01 00:00:00+00' + (g || ' minutes')::interval
    FROM generate_series(10, %(n)s, 10) AS g
    """,
]

SERIES_SQLITE = "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < %(n)s)"
FILL_SQLITE = [
    SERIES_SQLITE
    + """
    INSERT INTO selvedge_django_workflowinstance
      (instance_id, workflow_name, status, input, lease_owner, lease_epoch, runnable,
       cancel_requested, cancel_reason, parent_instance_id, parent_key, service_name,
       current_step, started_at, updated_at, closed_at, output, ready_ms, error_type,
       priority, created_seq, execution_errors, execution_error, generation,
       resumed_count, history_generation, parent_generation, forked_from, parked_seq,
       parked_key, sticky_owner, sticky_until_ms)
    SELECT 'wf-' || g, 'bench.attr' || (g %% 20), 'completed', '1', '', 1, 0, 0, '', '',
           '', '', '', datetime('now', '-' || g || ' seconds'), datetime('now'),
           datetime('now'), '1', 0, '', 0, g, 0, '', 1, 0, 1, 1, '', 0, '', '', 0
    FROM s
    """,
    SERIES_SQLITE
    + """
    INSERT INTO selvedge_django_workflowattribute
      (instance_id, name, kind, text_value, number_value, time_value)
    SELECT 'wf-' || g, 'customer', 's', 'c' || (g %% (%(n)s / 10)), NULL, NULL FROM s
    UNION ALL
    SELECT 'wf-' || g, 'tenant', 's', 't' || (g %% 100), NULL, NULL FROM s
    UNION ALL
    SELECT 'wf-' || g, 'amount', 'i', CAST(g %% 10000 AS TEXT), CAST(g %% 10000 AS REAL),
           NULL FROM s
    UNION ALL
    SELECT 'wf-' || g, 'due', 't', NULL, NULL,
           strftime('%%Y-%%m-%%d %%H:%%M:%%S', '2026-01-01', '+' || g || ' minutes')
    FROM s WHERE g %% 10 = 0
    """,
]


def queries(n: int) -> list[tuple[str, dict[str, Any], bool]]:
    """(label, filters, selective) of each measured query."""
    return [
        ("customer = c123 (10 matches)", {"customer": "c123"}, True),
        ("customer in (3 values)", {"customer__in": ["c1", "c2", "c3"]}, True),
        ("customer and tenant", {"customer": "c123", "tenant": "t23"}, True),
        ("amount 500 <= x < 502", {"amount__gte": 500, "amount__lt": 502}, True),
        (
            "due in one hour",
            {"due__gte": T0.replace(hour=5), "due__lt": T0.replace(hour=6)},
            True,
        ),
        ("tenant = t7 (1 %, newest first)", {"tenant": "t7"}, False),
        ("amount >= 9990 and tenant = t7", {"amount__gte": 9990, "tenant": "t7"}, False),
    ]


def fill(db: str, n: int) -> float:
    from django.db import connection

    began = time.perf_counter()
    with connection.cursor() as cursor:
        for statement in FILL_POSTGRES if db == "postgres" else FILL_SQLITE:
            cursor.execute(statement, {"n": n})
        # PostgreSQL: VACUUM too, so that no autovacuum of the fresh rows runs during the
        # measurements (on a 2-CPU machine it would be measured with them).
        cursor.execute("VACUUM ANALYZE" if db == "postgres" else "ANALYZE")
    return time.perf_counter() - began


def statement_of(filters: dict[str, Any]) -> str:
    """The instance query ``find_instances`` runs for ``filters`` (parameters inlined)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import selvedge_django as sv

    with CaptureQueriesContext(connection) as captured:
        sv.find_instances(attributes=filters, limit=PAGE)
    return next(
        q["sql"]
        for q in captured.captured_queries
        if "ORDER BY" in q["sql"] and "LIMIT" in q["sql"]
    )


def statement_ms(statement: str) -> float:
    """The median time of the instance query alone, over REPEATS runs."""
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(REPEATS):
            began = time.perf_counter()
            cursor.execute(statement)
            cursor.fetchall()
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def plan_of(db: str, statement: str) -> str:
    """The plan of ``statement``."""
    from django.db import connection

    with connection.cursor() as cursor:
        if db == "postgres":
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + statement)
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + statement)
        rows = cursor.fetchall()
    return "\n".join("    " + " ".join(str(c) for c in row[-1:]) for row in rows)


def first_pages(filters: dict[str, Any]) -> tuple[float, float, int]:
    """(median ms, best ms, instances on the page) of REPEATS first pages."""
    import selvedge_django as sv

    times = []
    count = 0
    for _ in range(5):  # warm the caches first
        sv.find_instances(attributes=filters, limit=PAGE)
    for _ in range(REPEATS):
        began = time.perf_counter()
        page = sv.find_instances(attributes=filters, limit=PAGE)
        times.append((time.perf_counter() - began) * 1000)
        count = len(page.instances)
    return statistics.median(times), min(times), count


def starts(rounds: int, per_round: int) -> tuple[float, float]:
    """Median ms per start without attributes and with five, interleaved rounds."""
    import selvedge_django as sv

    five = {
        "tenant": "t1",
        "customer": "c-new",
        "amount": 125,
        "vip": True,
        "due": T0,
    }
    plain: list[float] = []
    tagged: list[float] = []
    for r in range(rounds):
        for attributes, into in (
            ((None, plain), (five, tagged))
            if r % 2
            else (
                (five, tagged),
                (None, plain),
            )
        ):
            began = time.perf_counter()
            for _ in range(per_round):
                sv.start_workflow("bench.attr.start", None, attributes=attributes)
            into.append((time.perf_counter() - began) * 1000 / per_round)
    return statistics.median(plain), statistics.median(tagged)


# The alternative that was measured against the side table (--compare-json, PostgreSQL):
# the same attributes as one jsonb document per instance, with a GIN index.
JSON_TABLE = [
    "CREATE TABLE bench_attr_json (instance_id varchar(255) PRIMARY KEY,"
    " started_at timestamptz NOT NULL, attrs jsonb NOT NULL)",
    """
    INSERT INTO bench_attr_json
    SELECT a.instance_id, i.started_at, jsonb_object_agg(a.name, CASE a.kind
        WHEN 's' THEN to_jsonb(a.text_value) WHEN 't' THEN to_jsonb(a.time_value)
        ELSE to_jsonb(a.number_value) END)
    FROM selvedge_django_workflowattribute a
    JOIN selvedge_django_workflowinstance i ON i.instance_id = a.instance_id
    GROUP BY a.instance_id, i.started_at
    """,
    "CREATE INDEX bench_attr_json_gin ON bench_attr_json USING gin (attrs jsonb_path_ops)",
    "CREATE INDEX bench_attr_json_started ON bench_attr_json (started_at DESC, instance_id DESC)",
    "VACUUM ANALYZE bench_attr_json",
]
JSON_QUERIES = [
    ("customer = c123", 'attrs @> \'{"customer": "c123"}\''),
    ("customer and tenant", 'attrs @> \'{"customer": "c123", "tenant": "t23"}\''),
    (
        "amount 500 <= x < 502",
        "(attrs->>'amount')::float8 >= 500 AND (attrs->>'amount')::float8 < 502",
    ),
]
JSON_PAGE = (
    "SELECT instance_id FROM bench_attr_json WHERE {condition}"
    " ORDER BY started_at DESC, instance_id DESC LIMIT 51"
)
SIZES = (
    "SELECT pg_total_relation_size('selvedge_django_workflowattribute'),"
    " pg_total_relation_size('bench_attr_json')"
)


def compare_json() -> None:
    """Time the jsonb + GIN alternative on the same data; print plans and sizes."""
    from django.db import connection

    with connection.cursor() as cursor:
        began = time.perf_counter()
        for statement in JSON_TABLE:
            cursor.execute(statement)
        print(f"jsonb alternative built in {time.perf_counter() - began:.1f} s")
        for label, condition in JSON_QUERIES:
            statement = JSON_PAGE.format(condition=condition)
            alone = statement_ms(statement)
            cursor.execute("EXPLAIN (COSTS OFF) " + statement)
            plan = "\n".join("    " + str(row[0]) for row in cursor.fetchall())
            print(f"  jsonb {label}: its query alone median {alone:.2f} ms")
            print(plan)
        cursor.execute(SIZES)
        side, document = cursor.fetchone()
        print(
            f"  sizes with indexes: side table {side / 2**20:.0f} MiB,"
            f" jsonb table {document / 2**20:.0f} MiB"
        )


def run_one(db: str, n: int, start_count: int, json: bool = False) -> None:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_attributes_{os.getpid()}")
    with bench_database(db) as info:
        print(f"== {db}: {info['version']}, {n:,} instances ==")
        # A shared machine: what else ran shows in the load average (CPUs: os.cpu_count()).
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        seconds = fill(db, n)
        print(f"filled in {seconds:.1f} s ({n:,} instances, {3 * n + n // 10:,} attribute rows)")
        print()
        print(f"First page ({PAGE}) of sv.find_instances, {REPEATS} runs:")
        for label, filters, selective in queries(n):
            median, best, count = first_pages(filters)
            statement = statement_of(filters)
            alone = statement_ms(statement)
            plan = plan_of(db, statement)
            scans = [
                line.strip()
                for line in plan.splitlines()
                if "Seq Scan" in line or line.strip().startswith("SCAN ")
            ]
            target = ""
            if selective:
                ok = median < 20 and not scans
                target = "  [target <20 ms, index: " + ("met" if ok else "MISSED") + "]"
            print(
                f"  {label}: median {median:.2f} ms, best {best:.2f} ms, {count} rows"
                f" (its instance query alone: median {alone:.2f} ms){target}"
            )
            print(plan)
            print(f"    whole-table scans: {', '.join(scans) if scans else 'none'}")
        print()
        if json and db == "postgres":
            compare_json()
            print()
        rounds = 10
        plain, tagged = starts(rounds, max(1, start_count // rounds))
        verdict = "met" if tagged / plain < 1.2 else "MISSED"
        print(
            f"sv.start_workflow, {start_count} of each in {rounds} interleaved rounds: "
            f"no attributes {plain:.3f} ms, five attributes {tagged:.3f} ms per start, "
            f"ratio {tagged / plain:.3f} [target <1.20: {verdict}]"
        )
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument(
        "--instances", type=int, default=None, help="default 1,000,000 (PostgreSQL), 200,000"
    )
    parser.add_argument("--starts", type=int, default=2000, help="starts of each kind (2000)")
    parser.add_argument(
        "--compare-json",
        action="store_true",
        help="PostgreSQL: also time the same filters on a jsonb column with a GIN index",
    )
    args = parser.parse_args(argv)
    if args.db != "all":
        run_one(
            args.db, args.instances or DEFAULT_INSTANCES[args.db], args.starts, args.compare_json
        )
        return 0
    options = ["--starts", str(args.starts)]
    if args.compare_json:
        options.append("--compare-json")
    if args.instances:
        options += ["--instances", str(args.instances)]
    return each_database(__file__, options)


if __name__ == "__main__":
    sys.exit(main())
