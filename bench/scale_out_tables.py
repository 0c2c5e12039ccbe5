"""The ``tables`` section of ``bench/scale_out.py``: the hot statements on big tables.

Fill (``--instances N``, default 10,000,000). A seed (``--seed``, default 500,000) is
made in chunks (``--chunk``) through the bulk starts: 80 % ``django.tasks`` tasks
(``enqueue_many``: the instance, its activity's history row and its queued task in
one statement) and 20 % three-activity workflows (``sv.start_workflows``). Most are
then closed as a retained table holds them: the rows a real run of each kind wrote
(two templates, run first by an in-process worker) are copied onto them (the
instance's closing columns, the task's and history's outcome, and for a workflow its
three activities' history and tasks), one set-based statement per table and chunk,
start times spread over 30 days; every 25th closed one failed. ``--live-share`` of
them (default 1 %) stay running: a tenth of those ready (a task queued, a workflow
runnable), the rest suspended (a workflow waiting on a signal, a task's attempt
running elsewhere). The rest of the N are copies of the seed's closed instances
with their history and tasks (new ids, new start times), made in SQL with the plain
indexes dropped and built again afterwards: ten million bulk starts alone would take
this machine half an hour.

Then, after ``VACUUM (ANALYZE)``, per operation the median and p95 of R runs: dispatch
(``lease_batch`` of 10), a claim of 10 tasks, ``find_instances`` pages, admin
changelist pages (Django's test client, as ``bench/bench_admin.py`` loads them) and
``prune`` batches of the oldest closed instances; the size of every table and index;
and the share of HOT updates on the instance, task and history tables while worker
processes run a live workload (new tasks and workflows; the ready backlog of the
fill is set aside first) there, first with the tables' fillfactor as the migrations
leave it (100) and then lowered to ``--fillfactor`` on the instance and task tables
(``ALTER TABLE ... SET``; rows written from then on get the room).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

INSTANCE = "selvedge_django_workflowinstance"
HISTORY = "selvedge_django_historyevent"
TASK = "selvedge_django_activitytask"
HOT_TABLES = (INSTANCE, TASK, HISTORY)
THREE = "bench.scale.three_steps"
TASK_SHARE = 0.8  # of the instances, django.tasks tasks; the rest three-step workflows
# Columns a closed copy keeps from its own start; the rest comes from the template.
KEEP = {
    INSTANCE: {
        "instance_id",
        "workflow_name",
        "input",
        "started_at",
        "created_seq",
        "code_version",
        "updated_at",
        "closed_at",
        "trace_context",
    },
    HISTORY: {"id", "instance_id", "created_at"},
    TASK: {"id", "instance_id", "input", "created_at", "workflow_name"},
}


def _columns(table: str) -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
            " ORDER BY ordinal_position",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def _templates() -> dict[str, str]:
    """Run one task and one three-step workflow to their close; return their ids."""
    import selvedge_django as sv
    from bench.tasks_bulk import bulk_noop
    from selvedge_django.models import WorkflowInstance
    from selvedge_django.tasks import enqueue_many
    from selvedge_django.worker import Worker

    worker = Worker(worker_id="bench-templates")  # never started: driven from this thread
    worker.resumptions.inline = True
    worker.activities.inline = True
    enqueue_many([(bulk_noop, [0], {})])
    (workflow,) = sv.start_workflows([(THREE, 0)])
    for _ in range(5):
        worker.dispatcher.run_once()
        worker.activity_poller.run_once()
    rows = dict(WorkflowInstance.objects.values_list("instance_id", "status"))
    if set(rows.values()) != {"completed"} or len(rows) != 2:
        raise RuntimeError(f"the template runs did not complete: {rows}")
    task = next(i for i in rows if i != workflow)
    return {"task": task, "workflow": workflow}


def _close_like(cursor: Any, ids: list[str], template: str, kind: str, fail: bool) -> None:
    """Make the instances ``ids`` look as ``template``'s run left it: closed."""
    cols = [c for c in _COLS[INSTANCE] if c not in KEEP[INSTANCE]]
    status = "'failed', error_type = 'ValueError'" if fail else "'completed'"
    cursor.execute(
        f"UPDATE {INSTANCE} i SET ({', '.join(cols)}) = (SELECT {', '.join(cols)} FROM"
        f" {INSTANCE} WHERE instance_id = %(template)s),"
        " started_at = x.s, updated_at = x.s + interval '2 seconds',"
        " closed_at = x.s + interval '2 seconds'"
        " FROM (SELECT id, now() - random() * interval '30 days' AS s"
        " FROM unnest(%(ids)s::text[]) id) x WHERE i.instance_id = x.id",
        {"template": template, "ids": ids},
    )
    if fail:
        cursor.execute(
            f"UPDATE {INSTANCE} SET status = {status}, output = NULL,"
            ' error = \'{"type": "ValueError", "message": "bench"}\''
            " WHERE instance_id = ANY(%(ids)s::text[])",
            {"ids": ids},
        )
    for table in (HISTORY, TASK):
        cols = [c for c in _COLS[table] if c not in KEEP[table]]
        if kind == "task":  # the start wrote the rows: give them the template's outcome
            cursor.execute(
                f"UPDATE {table} r SET ({', '.join(cols)}) = (SELECT {', '.join(cols)}"
                f" FROM {table} t WHERE t.instance_id = %(template)s AND t.key = r.key)"
                " WHERE r.instance_id = ANY(%(ids)s::text[])",
                {"template": template, "ids": ids},
            )
        else:  # a workflow start writes none: copy the run's rows
            insert = [c for c in _COLS[table] if c != "id"]
            select = ["x.id" if c == "instance_id" else f"t.{c}" for c in insert]
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(insert)}) SELECT {', '.join(select)}"
                f" FROM unnest(%(ids)s::text[]) x(id) CROSS JOIN {table} t"
                " WHERE t.instance_id = %(template)s",
                {"template": template, "ids": ids},
            )


def _suspend(cursor: Any, ids: list[str], kind: str) -> None:
    """Live but not ready: leased once, then suspended (waiting on a signal)."""
    cursor.execute(
        f"UPDATE {INSTANCE} SET runnable = false, lease_epoch = 1,"
        " current_step = 'receive go' WHERE instance_id = ANY(%(ids)s::text[])",
        {"ids": ids},
    )
    if kind == "task":
        cursor.execute(
            f"UPDATE {TASK} SET status = 'running', claim_owner = 'bench-elsewhere',"
            " claim_epoch = 1, attempts = 1, claim_expires_ms = 9999999999999"
            " WHERE instance_id = ANY(%(ids)s::text[])",
            {"ids": ids},
        )


_COLS: dict[str, list[str]] = {}


def seed(n: int, live_share: float, chunk: int) -> dict[str, Any]:
    """N instances through the bulk starts, the closed share closed after; the times."""
    from django.db import connection, transaction

    import selvedge_django as sv
    from bench.tasks_bulk import bulk_noop
    from selvedge_django.tasks import enqueue_many

    templates = _templates()
    live_every = max(1, round(1 / live_share)) if live_share > 0 else 0
    bulk_seconds, close_seconds = 0.0, 0.0
    made = 0
    while made < n:
        size = min(chunk, n - made)
        t = time.perf_counter()
        tasks = round(size * TASK_SHARE)
        task_ids = [r.id for r in enqueue_many([(bulk_noop, [made + i], {}) for i in range(tasks)])]
        flow_ids = sv.start_workflows([(THREE, made + i) for i in range(tasks, size)])
        bulk_seconds += time.perf_counter() - t
        t = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            for kind, ids in (("task", task_ids), ("workflow", flow_ids)):
                live = [i for k, i in enumerate(ids) if live_every and k % live_every == 0]
                live_set = set(live)
                closed = [i for i in ids if i not in live_set]
                failed = closed[::25]
                failed_set = set(failed)
                done = [i for i in closed if i not in failed_set]
                _close_like(cursor, done, templates[kind], kind, fail=False)
                _close_like(cursor, failed, templates[kind], kind, fail=True)
                waiting = [i for k, i in enumerate(live) if k % 10 != 0]
                _suspend(cursor, waiting, kind)
        close_seconds += time.perf_counter() - t
        made += size
    return {"seed": n, "bulk_start_seconds": bulk_seconds, "closing_seconds": close_seconds}


def _plain_indexes(table: str) -> list[tuple[str, str]]:
    """(name, definition) of the table's indexes that back no constraint."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x"
            " JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid"
            " WHERE t.relname = %s AND NOT EXISTS"
            " (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)",
            [table],
        )
        return [(r[0], r[1]) for r in cursor.fetchall()]


def copy_closed(target: int) -> dict[str, Any]:
    """Copy the closed instances (and their history and tasks) until ``target`` exist.

    Each round copies every closed instance made by the bulk starts under a new id
    (``<id>-c<round>``) and a new start time in the past 30 days. The indexes that back
    no constraint are dropped first and built again at the end (faster than keeping
    them up to date row by row; they come out unbloated).
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {INSTANCE}")
        have = int(cursor.fetchone()[0])
        cursor.execute(
            f"CREATE TEMP TABLE seed AS SELECT instance_id FROM {INSTANCE}"
            " WHERE status <> 'running' ORDER BY instance_id"
        )
        cursor.execute("SELECT count(*) FROM seed")
        closed = int(cursor.fetchone()[0])
    if have >= target or not closed:
        return {"copied": 0, "copy_seconds": 0.0, "index_seconds": 0.0}
    started = time.perf_counter()
    dropped = {table: _plain_indexes(table) for table in HOT_TABLES}
    with connection.cursor() as cursor:
        for indexes in dropped.values():
            for name, _ in indexes:
                cursor.execute(f'DROP INDEX "{name}"')
    inst_cols = _COLS[INSTANCE]
    inst_select = []
    for c in inst_cols:
        if c == "instance_id":
            inst_select.append("i.instance_id || %(suffix)s")
        elif c == "started_at":
            inst_select.append("s.started")
        elif c in ("closed_at", "updated_at"):
            inst_select.append("s.started + interval '2 seconds'")
        else:
            inst_select.append(f"i.{c}")
    copied, rnd = 0, 0
    last = time.perf_counter()
    while have + copied < target:
        rnd += 1
        m = min(closed, target - have - copied)
        params: dict[str, str | int] = {"suffix": f"-c{rnd}", "m": m}
        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit TO off")
            cursor.execute(
                f"INSERT INTO {INSTANCE} ({', '.join(inst_cols)}) SELECT {', '.join(inst_select)}"
                f" FROM {INSTANCE} i JOIN (SELECT instance_id, now() - random() *"
                " interval '30 days' AS started FROM seed LIMIT %(m)s) s USING (instance_id)",
                params,
            )
            for table in (HISTORY, TASK):
                cols = [c for c in _COLS[table] if c != "id"]
                select = [
                    "r.instance_id || %(suffix)s" if c == "instance_id" else f"r.{c}" for c in cols
                ]
                cursor.execute(
                    f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(select)}"
                    f" FROM {table} r JOIN (SELECT instance_id FROM seed LIMIT %(m)s) s"
                    " USING (instance_id)",
                    params,
                )
        copied += m
        if time.perf_counter() - last > 30:
            last = time.perf_counter()
            elapsed = last - started
            print(f"    {have + copied:,} instances after {elapsed:.0f} s of copying", flush=True)
    copy_seconds = time.perf_counter() - started
    t = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem TO '1GB'")
        for indexes in dropped.values():
            for _, definition in indexes:
                cursor.execute(definition)
        cursor.execute("DROP TABLE seed")
    return {
        "copied": copied,
        "copy_seconds": copy_seconds,
        "index_seconds": time.perf_counter() - t,
    }


def fill(n: int, live_share: float, chunk: int, seed_size: int) -> dict[str, Any]:
    """N instances: a seed through the bulk starts, the rest copies of its closed ones."""
    from django.db import connection

    for table in HOT_TABLES:
        _COLS[table] = _columns(table)
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO off")  # a throwaway database being filled
    started = time.perf_counter()
    seeded = min(n, seed_size)
    out = seed(seeded, live_share, chunk)
    out.update(copy_closed(n))
    t = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO on")
        for table in HOT_TABLES:
            cursor.execute(f"VACUUM (ANALYZE) {table}")
        cursor.execute("ANALYZE")
    out["vacuum_analyze_seconds"] = time.perf_counter() - t
    out["seconds"] = time.perf_counter() - started
    out["instances"] = n
    out["bulk_starts_per_s"] = seeded / out["bulk_start_seconds"]
    print(
        f"  {n:,} instances in {out['seconds']:.0f} s. {seeded:,} through the bulk starts"
        f" ({TASK_SHARE:.0%} enqueue_many, the rest start_workflows, {chunk:,} a call):"
        f" {out['bulk_start_seconds']:.0f} s ({out['bulk_starts_per_s']:,.0f} starts/s),"
        f" closing the closed ones {out['closing_seconds']:.0f} s; {out['copied']:,} copies"
        f" of closed ones {out['copy_seconds']:.0f} s, indexes built again"
        f" {out['index_seconds']:.0f} s; VACUUM (ANALYZE) {out['vacuum_analyze_seconds']:.0f} s",
        flush=True,
    )
    return out


def counts() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, count(*) FROM {INSTANCE} GROUP BY status")
        out = {f"instances {s}": int(c) for s, c in cursor.fetchall()}
        cursor.execute(
            f"SELECT count(*) FILTER (WHERE runnable), count(*) FILTER (WHERE NOT runnable)"
            f" FROM {INSTANCE} WHERE status = 'running'"
        )
        ready, waiting = cursor.fetchone()
        out.update({"running, runnable": int(ready), "running, not runnable": int(waiting)})
        cursor.execute(f"SELECT status, count(*) FROM {TASK} GROUP BY status")
        out.update({f"tasks {s}": int(c) for s, c in cursor.fetchall()})
        for table in (HISTORY, TASK):
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = %s", [table])
            out[table.removeprefix("selvedge_django_") + " rows"] = int(cursor.fetchone()[0])
    return out


def sizes() -> list[dict[str, Any]]:
    """Every selvedge table with its heap, index and total size, largest first."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.reltuples::bigint, pg_relation_size(c.oid),"
            " pg_indexes_size(c.oid), pg_total_relation_size(c.oid)"
            " FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE 'selvedge_django_%%'"
            " ORDER BY pg_total_relation_size(c.oid) DESC"
        )
        tables = [
            {"table": r[0], "rows": int(r[1]), "heap": r[2], "indexes": r[3], "total": r[4]}
            for r in cursor.fetchall()
        ]
        cursor.execute(
            "SELECT t.relname, i.relname, pg_relation_size(i.oid) FROM pg_index x"
            " JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid"
            " WHERE t.relname = ANY(%s) ORDER BY pg_relation_size(i.oid) DESC",
            [list(HOT_TABLES)],
        )
        indexes = cursor.fetchall()
    by_table: dict[str, list[tuple[str, int]]] = {}
    for table, index, size in indexes:
        by_table.setdefault(table, []).append((index, int(size)))
    for row in tables:
        row["index_sizes"] = by_table.get(row["table"], [])
    return tables


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} kB"


def print_sizes(tables: list[dict[str, Any]]) -> None:
    print(f"  {'table':<28}{'rows':>13}{'heap':>11}{'indexes':>11}{'total':>11}")
    for row in tables:
        if row["total"] < 2**20:
            continue
        name = row["table"].removeprefix("selvedge_django_")
        print(
            f"  {name:<28}{row['rows']:>13,}{mb(row['heap']):>11}{mb(row['indexes']):>11}"
            f"{mb(row['total']):>11}"
        )
    for row in tables:
        if row["index_sizes"]:
            name = row["table"].removeprefix("selvedge_django_")
            listed = ", ".join(f"{i} {mb(s)}" for i, s in row["index_sizes"])
            print(f"    {name} indexes: {listed}")


def timed(label: str, runs: int, op: Callable[[], Any], out: dict[str, Any]) -> None:
    """Median and p95 of ``runs`` calls after a warm one; a slow operation (over 2 s
    warm) runs twice more only."""
    t = time.perf_counter()
    op()  # warm: the connection, the plan, the pages
    if time.perf_counter() - t > 2.0:
        runs = min(runs, 2)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        op()
        times.append((time.perf_counter() - t) * 1000)
    ordered = sorted(times)
    row = {
        "median_ms": statistics.median(times),
        "p95_ms": ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)],
        "runs": runs,
    }
    out[label] = row
    print(f"  {label:<44}{row['median_ms']:>10.2f}{row['p95_ms']:>10.2f}{runs:>6}", flush=True)


def latencies(runs: int) -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.test import Client

    from bench.bench_admin import CHANGELIST
    from selvedge_django.engine.codec import Codec
    from selvedge_django.models import WorkflowInstance
    from selvedge_django.operations import find_instances, prune
    from selvedge_django.storage import store_for
    from selvedge_django.tasks.names import TASK_ACTIVITY

    store = store_for("default", Codec())
    out: dict[str, Any] = {}
    print(f"  (machine load average {os.getloadavg()[0]:.1f})")
    print(f"  {'operation':<44}{'median ms':>10}{'p95 ms':>10}{'runs':>6}")
    timed(
        "dispatch: lease_batch, 10 rows",
        runs,
        lambda: store.instances.lease_batch("bench-10m", 3600, 10, None),
        out,
    )
    timed(
        "claim: claim_tasks, 10 rows",
        runs,
        lambda: store.tasks.claim_tasks("bench-10m", 10, [TASK_ACTIVITY]),
        out,
    )
    closed = WorkflowInstance.objects.filter(status="completed").order_by("-started_at")
    sample = closed.values_list("instance_id", flat=True)[min(5000, closed.count() // 2)]
    page = find_instances(status="completed", limit=50)
    timed("find_instances(status=running)", runs, lambda: find_instances(status="running"), out)
    timed(
        "find_instances(status=completed), page 2",
        runs,
        lambda: find_instances(status="completed", limit=50, page_token=page.next_page_token),
        out,
    )
    timed(
        "find_instances(workflow_name=three_steps)",
        runs,
        lambda: find_instances(workflow_name="three_steps"),
        out,
    )
    timed(
        "find_instances(instance_id=<full id>)",
        runs,
        lambda: find_instances(instance_id=sample),
        out,
    )

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "", None
    )
    client = Client()
    client.force_login(user)

    def page_of(url: str) -> Callable[[], Any]:
        def load() -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        return load

    for label, url in (
        ("admin changelist", CHANGELIST),
        ("admin changelist, status = running", f"{CHANGELIST}?status__exact=running"),
        ("admin changelist, workflow name", f"{CHANGELIST}?workflow_name={THREE}"),
        ("admin changelist, search full id", f"{CHANGELIST}?q={sample}"),
    ):
        timed(label, max(3, runs // 5), page_of(url), out)

    # prune: batches of the oldest closed instances (30 days of starts: older than 29.9
    # days is about 1/300 of them), each batch with everything it owns.
    batches: list[float] = []
    last = [time.perf_counter()]

    def progress(total: int) -> None:
        now = time.perf_counter()
        batches.append((now - last[0]) * 1000)
        last[0] = now

    t = time.perf_counter()
    deleted = prune(timedelta(days=29.9), batch_size=500, progress=progress)
    took = time.perf_counter() - t
    ordered = sorted(batches) or [float("nan")]
    out["prune"] = {
        "deleted": deleted,
        "seconds": took,
        "per_s": deleted / took if took else 0.0,
        "batch_median_ms": statistics.median(ordered),
        "batch_p95_ms": ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)],
    }
    print(
        f"  {'prune, batches of 500 (older than 29.9 days)':<44}"
        f"{out['prune']['batch_median_ms']:>10.2f}{out['prune']['batch_p95_ms']:>10.2f}"
        f"{len(batches):>6}   {deleted:,} deleted, {out['prune']['per_s']:,.0f}/s",
        flush=True,
    )
    return out


def hot_stats() -> dict[str, tuple[int, int]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = ANY(%s)",
            [list(HOT_TABLES)],
        )
        return {r[0]: (int(r[1]), int(r[2])) for r in cursor.fetchall()}


def live_workload(n: int, processes: int) -> dict[str, Any]:
    """N tasks and N three-step workflows run by worker processes; HOT share per table."""
    import selvedge_django as sv
    from bench.scale_out import wait_for, worker_set
    from bench.tasks_bulk import bulk_noop
    from selvedge_django.models import WorkflowInstance
    from selvedge_django.tasks import enqueue_many

    before = hot_stats()
    with worker_set(processes, "hot", {}):
        t = time.perf_counter()
        tasks = [r.id for r in enqueue_many([(bulk_noop, [i], {}) for i in range(n)])]
        flows = sv.start_workflows([(THREE, i) for i in range(n)])
        ids = tasks + flows
        pending = WorkflowInstance.objects.filter(instance_id__in=ids, status="running")
        wait_for(lambda: not pending.exists(), timeout=3600, interval=0.25)
        took = time.perf_counter() - t
    time.sleep(1.0)  # the workers' backends flushed their statistics as they exited
    after = hot_stats()
    out: dict[str, Any] = {"instances": 2 * n, "seconds": took, "per_s": 2 * n / took}
    for table in HOT_TABLES:
        upd = after[table][0] - before[table][0]
        hot = after[table][1] - before[table][1]
        out[table] = {"updates": upd, "hot": hot, "hot_share": hot / upd if upd else 0.0}
    return out


def print_hot(label: str, row: dict[str, Any]) -> None:
    parts = []
    for table in HOT_TABLES:
        t = row[table]
        name = table.removeprefix("selvedge_django_")
        parts.append(f"{name} {t['hot_share'] * 100:5.1f}% of {t['updates']:,}")
    print(
        f"  {label:<20}{row['per_s']:>8.0f} instances/s   HOT: " + "; ".join(parts),
        flush=True,
    )


def measure_tables(args: argparse.Namespace, dbname: str) -> dict[str, Any]:
    from django.db import connection

    n = args.instances
    quick = args.quick
    chunk = args.chunk or (5_000 if quick else 50_000)
    runs = 10 if quick else 50
    live_n = 100 if quick else 5_000
    print(f"\n{n:,} instances in the tables ({args.live_share:.1%} running)", flush=True)
    seed_size = args.seed or (n if quick else 500_000)
    out: dict[str, Any] = {"fill": fill(n, args.live_share, chunk, seed_size)}
    out["counts"] = counts()
    print("  " + ", ".join(f"{k}: {v:,}" for k, v in out["counts"].items()))
    out["sizes"] = sizes()
    print_sizes(out["sizes"])
    print()
    out["latency"] = latencies(runs)
    print(
        f"\n  HOT updates under a live workload ({live_n:,} tasks and {live_n:,} three-step"
        " workflows, 2 worker processes)"
    )
    with connection.cursor() as cursor:  # the fill's ready backlog is not the workload
        cursor.execute(
            f"UPDATE {TASK} SET status = 'cancelled'"
            " WHERE status = 'queued' OR claim_owner = 'bench-10m'"
        )
        cursor.execute(
            f"UPDATE {INSTANCE} SET runnable = false WHERE status = 'running' AND runnable"
        )
    out["hot_before"] = live_workload(live_n, 2)
    print_hot("fillfactor 100", out["hot_before"])
    with connection.cursor() as cursor:
        for table in (INSTANCE, TASK):
            cursor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(args.fillfactor)})")
    out["hot_after"] = live_workload(live_n, 2)
    print_hot(f"fillfactor {args.fillfactor}", out["hot_after"])
    with connection.cursor() as cursor:
        for table in (INSTANCE, TASK):
            cursor.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    return out
