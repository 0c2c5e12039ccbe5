"""Show the query plans of the hot queries with 1,000,000 instances on PostgreSQL.

    python bench/explain_plans.py [--instances 1000000]

Fills a throwaway database (``selvedge_plans``) with instances, history, tasks,
timers and signals in bulk, runs ANALYZE, then captures the SQL that the
dispatcher, activity claims, timer poller, leader sweep, ``prune`` and admin-style
listing actually execute and prints ``EXPLAIN`` for each statement. Every plan should be
an index scan (or a bitmap over partial indexes); a "Seq Scan" on a big table is
a regression. The database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_database


def fill(instances: int) -> None:
    from django.db import connection

    running = max(1000, instances // 100)
    tasks = instances // 5
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO selvedge_django_workflowinstance
              (instance_id, workflow_name, status, input, lease_owner, lease_epoch,
               lease_expires_ms, runnable, cancel_requested, cancel_reason,
               parent_instance_id, parent_key, service_name, current_step,
               started_at, updated_at, closed_at, output, ready_ms)
            SELECT 'wf-' || g,
                   'plans.wf' || (g %% 20),
                   CASE WHEN g <= %s THEN 'running' ELSE 'completed' END,
                   jsonb_build_object('customer', g %% 1000),
                   CASE WHEN g <= %s AND g %% 3 = 0 THEN 'some-worker' ELSE '' END,
                   1,
                   CASE WHEN g <= %s AND g %% 3 = 0 THEN 9999999999999 ELSE NULL END,
                   g <= %s AND g %% 10 = 1,
                   false, '', '', '', '', '',
                   now() - (g || ' seconds')::interval,
                   now(),
                   CASE WHEN g <= %s THEN NULL ELSE now() END,
                   CASE WHEN g <= %s THEN NULL ELSE '1' END,
                   (EXTRACT(EPOCH FROM now()) * 1000)::bigint - g
            FROM generate_series(1, %s) AS g
            """,
            [running, running, running, running, running, running, instances],
        )
        cur.execute(
            """
            INSERT INTO selvedge_django_historyevent
              (instance_id, key, seq, command, event_type, data, reservation,
               delivered_seq, created_at)
            SELECT 'wf-' || ((g %% %s) + 1), '#' || g || ':a', 1, 'activity',
                   'ActivityCompleted', '1', '{"name":"a"}', NULL, now()
            FROM generate_series(1, %s) AS g
            """,
            [instances, instances],
        )
        cur.execute(
            """
            INSERT INTO selvedge_django_activitytask
              (instance_id, workflow_name, key, seq, name, input, queue, options,
               max_attempts, status, attempts, failures, not_before_ms, claim_owner,
               claim_epoch, claim_expires_ms, created_at, updated_at)
            SELECT 'wf-' || ((g %% %s) + 1), 'plans.wf', 't' || g, 1, 'plans.act', '1',
                   '', '{}', 5,
                   CASE WHEN g %% 40 = 0 THEN 'queued'
                        WHEN g %% 40 = 1 THEN 'running' ELSE 'completed' END,
                   1, 0,
                   CASE WHEN g %% 40 = 0 THEN 9999999999999 ELSE 0 END,
                   CASE WHEN g %% 40 = 1 THEN 'some-worker' ELSE '' END,
                   1,
                   CASE WHEN g %% 40 = 1 THEN 9999999999999 ELSE NULL END,
                   now(), now()
            FROM generate_series(1, %s) AS g
            """,
            [running, tasks],
        )
        cur.execute(
            """
            INSERT INTO selvedge_django_timersubscription
              (instance_id, key, expires_at, fire_at_ms, fired, created_at)
            SELECT 'wf-' || g, '#9:sleep', now() + interval '1 day',
                   (EXTRACT(EPOCH FROM now() + interval '1 day') * 1000)::bigint, false, now()
            FROM generate_series(1, %s) AS g
            """,
            [running],
        )
        cur.execute(
            """
            INSERT INTO selvedge_django_signalmessage
              (instance_id, channel, payload, sent_at, consumed_key)
            SELECT 'wf-' || ((g %% %s) + 1), 'go', '1', now(), ''
            FROM generate_series(1, %s) AS g
            """,
            [running, running * 5],
        )
        cur.execute("ANALYZE")


def explain_all() -> None:
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from selvedge_django.engine.codec import Codec
    from selvedge_django.operations import find_instances
    from selvedge_django.storage import store_for

    store = store_for("default", Codec())
    names = [f"plans.wf{i}" for i in range(20)]
    operations = [
        ("dispatch: lease_batch", lambda: store.instances.lease_batch("w1", 30, 100, names)),
        ("claims: claim_tasks", lambda: store.tasks.claim_tasks("w1", 10, ["plans.act"])),
        ("claims: next_task_due_ms", lambda: store.tasks.next_task_due_ms(["plans.act"])),
        (
            "timers: fire_due_timers",
            lambda: store.waits.fire_due_timers(100),
        ),
        ("timers: next_timer_due_ms", store.waits.next_timer_due_ms),
        (
            "leader: sweep_activity_timeouts",
            lambda: store.task_timeouts.sweep_activity_timeouts(100),
        ),
        (
            # The oldest closed, with no running parent (a lookup of each one's parent).
            "retention: prune_closed",
            lambda: store.instances.prune_closed(
                {"completed"}, timezone.now() + timedelta(days=1), None, 500
            ),
        ),
        ("receive: arrivals", lambda: store.arrivals("wf-7")),
        ("receive: next_signal", lambda: store.next_signal("wf-7", "go")),
        ("execution: load_snapshot", lambda: store.instances.load_snapshot("wf-7")),
        ("list: find_instances(status=running)", lambda: find_instances(status="running")),
        (
            "list: find_instances(workflow_name=)",
            lambda: find_instances(workflow_name="plans.wf3"),
        ),
    ]
    for title, op in operations:
        with CaptureQueriesContext(connection) as captured:
            op()
        print(f"\n=== {title}")
        for query in captured.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE", "WITH")):
                continue
            if "pg_notify" in sql or ("clock_timestamp" in sql and "FROM" not in sql):
                continue
            print(f"--- {sql[:160]}{'...' if len(sql) > 160 else ''}")
            with connection.cursor() as cur:
                cur.execute("EXPLAIN " + sql)
                for (line,) in cur.fetchall():
                    print("    " + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1_000_000)
    args = parser.parse_args()
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", "selvedge_plans")
    # The captured SQL is explained again as text: bound on the client, not prepared
    # (a server-bound statement is captured with $1 marks that EXPLAIN cannot fill).
    os.environ.setdefault("SELVEDGE_BENCH_PREPARED", "0")
    with bench_database("postgres") as info:
        print(f"{info['version']}: filling {args.instances:,} instances ...", flush=True)
        fill(args.instances)
        explain_all()


if __name__ == "__main__":
    main()
