#!/usr/bin/env python
"""Scale-out limits of one PostgreSQL: worker processes, NOTIFY fan-out, pgbouncer, big tables.

    python bench/scale_out.py [--quick] [--only SECTION,...] [--processes 1,2,4,8,16,32]
                              [--seconds S] [--workflows N] [--via direct,pgbouncer]
                              [--pool-size N] [--listeners 1,4,16] [--notifications K]
                              [--instances N] [--seed N] [--chunk N] [--live-share F]
                              [--fillfactor N] [--shared] [--json PATH]

Sections (``--only`` picks some; ``--quick`` runs every one small, in under a minute):

workers   P ``runselvedge worker`` processes (1 to as many as the machine holds),
          directly and through a real pgbouncer in transaction mode (``--via``). Two
          windows each, with more ready work than the workers can take in the window
          so that a short answer can only be a ``SKIP LOCKED`` loss:
          dispatch (N one-line workflows started by one bulk start) and claims (N
          ``django.tasks`` tasks enqueued by one ``enqueue_many``). Per window: rows
          taken per second, the calls, the rows asked and got and the calls that got
          fewer than they asked (``SKIP LOCKED`` misses, from the probe in every
          worker, ``bench/scaleout_probe.py``), the statement's latency seen by the
          worker (p50/p95/p99) and by the server (``pg_stat_statements``), and the
          server connections per worker process (and, through pgbouncer, its clients).
notify    L idle worker processes listening; notifications of the ``runnable`` topic
          (what every start sends) at a steady pace: the sender's commit time against
          L, and per listening process the statements and CPU time each notification
          costs it (every dispatcher wakes and polls; one of them would win).
tables    N instances (default 10,000,000): a seed made through the bulk starts
          (``enqueue_many`` and ``sv.start_workflows``), mostly closed as a retained
          table holds them, with their history and tasks, and a share live; the rest
          copies of the seed's closed rows. Then the latency of dispatch, claims,
          ``find_instances``, the admin changelist and ``prune``; table and index
          sizes; the share of HOT updates on the hot tables under a live workload,
          with the tables' fillfactor as it is and then lowered (``--fillfactor``).
          See ``bench/scale_out_tables.py``.

By default the benchmark runs its own PostgreSQL cluster (``initdb`` on a free port,
``tests/pgcluster.py``), with ``pg_stat_statements`` loaded, autovacuum on, room for
as many connections as the workers open and the server's durability defaults
(``fsync``, ``synchronous_commit``), and removes it at the end; the database in it
is created and dropped as ``bench/harness.py`` does. ``--shared`` uses the server
of ``SELVEDGE_PG_HOST``/``_PORT`` instead (no server-side statement figures there
unless it preloads ``pg_stat_statements``). See bench/README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_scale import WorkerProcess  # noqa: E402 - the repository root goes first
from bench.harness import bench_database  # noqa: E402

SECTIONS = ("workers", "notify", "tables")
SETTINGS = "bench.scaleout_settings"
# The benchmark cluster's server settings (tests/pgcluster.py adds them to its own).
SERVER_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "1000",
    "shared_buffers": "2GB",
    "work_mem": "16MB",
    "maintenance_work_mem": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "15min",
    "autovacuum": "on",
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
}
NOOP = "bench.scaleout.noop"


# -- the server -------------------------------------------------------------------------


@contextmanager
def benchmark_server(shared: bool) -> Iterator[dict[str, Any]]:
    """A cluster of the benchmark's own (unless ``shared``), reached through SELVEDGE_PG_*."""
    if shared:
        yield {"own": False, "settings": "the shared server's"}
        return
    from tests.pgcluster import private_cluster

    with private_cluster(SERVER_SETTINGS) as cluster:
        os.environ["SELVEDGE_PG_HOST"] = cluster.host
        os.environ["SELVEDGE_PG_PORT"] = str(cluster.port)
        pid = int((cluster.data / "postmaster.pid").read_text().split()[0])
        yield {"own": True, "cluster": cluster, "postmaster": pid}


def server_cpu_seconds(server: dict[str, Any]) -> float:
    """CPU time of the benchmark cluster's processes so far (0 on a shared server)."""
    if not server.get("own"):
        return 0.0
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with suppress(OSError, IndexError, ValueError):
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == server["postmaster"] or int(proc.name) == server["postmaster"]:
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def statements_available() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'")
        if cursor.fetchone():
            return True
        cursor.execute("SHOW shared_preload_libraries")
        if "pg_stat_statements" not in cursor.fetchone()[0]:
            return False
        cursor.execute("CREATE EXTENSION pg_stat_statements")
    return True


def reset_statements(enabled: bool) -> None:
    if enabled:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_statements_reset()")


def read_statements(enabled: bool, dbname: str) -> list[dict[str, Any]]:
    """The database's statements since the last reset, the most time first."""
    if not enabled:
        return []
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query, calls, total_exec_time, mean_exec_time, rows"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = %s ORDER BY total_exec_time DESC",
            [dbname],
        )
        return [
            {"query": q, "calls": int(c), "total_ms": float(t), "mean_ms": float(m), "rows": r}
            for q, c, t, m, r in cursor.fetchall()
        ]


def statement_of(rows: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    """The dispatch or claim statement among ``rows`` (the one with the most calls)."""
    locking = [r for r in rows if "SKIP LOCKED" in r["query"]]
    if kind == "dispatch":  # storage/postgresql/sql.py LEASE_BATCH
        found = [r for r in locking if r["query"].startswith("WITH e AS")]
    else:  # the claim's pick, storage/sql.py CLAIM_PICK (not its probe, CLAIM_PROBE)
        found = [r for r in locking if r["query"].startswith("WITH n (name) AS")]
    return max(found, key=lambda r: r["calls"]) if found else None


def client_backends(dbname: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = %s AND backend_type = 'client backend'",
            [dbname],
        )
        return int(cursor.fetchone()[0])


# -- helpers ----------------------------------------------------------------------------


def memory_gb() -> float:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def wait_for(predicate: Any, timeout: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)


def read_probes(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


@contextmanager
def pgbouncer_for(dbname: str, pool_size: int) -> Iterator[Any]:
    from tests.pgbouncer import Bouncer

    bouncer = Bouncer(
        host=os.environ.get("SELVEDGE_PG_HOST", "127.0.0.1"),
        port=os.environ.get("SELVEDGE_PG_PORT", "5432"),
        user=os.environ.get("SELVEDGE_PG_USER", "postgres"),
        password=os.environ.get("SELVEDGE_PG_PASSWORD", ""),
        dbname=dbname,
        pool_size=pool_size,
        max_client_conn=5000,
    )
    try:
        yield bouncer
    finally:
        bouncer.stop()


@contextmanager
def worker_set(count: int, prefix: str, env: dict[str, str]) -> Iterator[list[WorkerProcess]]:
    procs: list[WorkerProcess] = []
    try:
        for index in range(count):
            procs.append(WorkerProcess("postgres", f"{prefix}-{index}", settings=SETTINGS, env=env))
        yield procs
    finally:
        # Every process finishes its in-flight work at once (one SIGTERM each; a second
        # would exit at once, without the probe's records), then each is reaped.
        for proc in procs:
            if proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGTERM)
        for proc in procs:
            with suppress(subprocess.TimeoutExpired):
                proc.proc.wait(60)
            proc.stop()


def clear_tables() -> None:
    """Empty the engine's tables between runs (a throwaway database)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename LIKE 'selvedge_django_%%'"
        )
        tables = [row[0] for row in cursor.fetchall()]
        cursor.execute(f"TRUNCATE {', '.join(tables)}")


# -- workers ----------------------------------------------------------------------------


def _fill_window(kind: str, n: int) -> None:
    """Make ``n`` rows ready at once, in one commit: instances to dispatch or tasks to claim."""
    import selvedge_django as sv

    if kind == "dispatch":
        sv.start_workflows([(NOOP, i) for i in range(n)])
    else:
        from bench.tasks_bulk import bulk_noop
        from selvedge_django.tasks import enqueue_many

        enqueue_many([(bulk_noop, [i], {}) for i in range(n)])


def _remaining(kind: str) -> int:
    from selvedge_django.models import ActivityTask, WorkflowInstance

    if kind == "dispatch":
        return WorkflowInstance.objects.filter(status="running", runnable=True).count()
    return ActivityTask.objects.filter(status="queued").count()


def _retire_leftovers(kind: str) -> None:
    """Take what the window left out of the workers' reach, and wait for what they hold."""
    from django.db import connection

    from selvedge_django.models import ActivityTask, WorkflowInstance

    with connection.cursor() as cursor:
        if kind == "claims":
            cursor.execute(
                "UPDATE selvedge_django_activitytask SET status = 'cancelled'"
                " WHERE status = 'queued'"
            )
        cursor.execute(
            "UPDATE selvedge_django_workflowinstance SET status = 'cancelled', runnable = false,"
            " closed_at = now() WHERE status = 'running' AND lease_owner = ''"
        )
    wait_for(
        lambda: (
            not WorkflowInstance.objects.filter(status="running").exists()
            and not ActivityTask.objects.filter(status="running").exists()
        ),
        timeout=120,
        interval=0.1,
    )


def run_window(
    kind: str,
    n: int,
    seconds: float,
    procs: list[WorkerProcess],
    dbname: str,
    server: dict[str, Any],
    bouncer: Any,
    pgss: bool,
    baseline: int,
) -> dict[str, Any]:
    """One window: ``n`` rows made ready at once; measure until the window ends or the
    ready rows fall below a fifth (then a short answer may be an empty queue)."""
    from django.db import connection

    reset_statements(pgss)
    cpu_workers = sum(process_cpu_seconds(p.proc.pid) for p in procs)
    cpu_server = server_cpu_seconds(server)
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO off")  # the fill is not what is measured
    _fill_window(kind, n)
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO on")
    t0 = time.time()
    peak_server, peak_clients, low = 0, 0, False
    while time.time() - t0 < seconds:
        peak_server = max(peak_server, client_backends(dbname) - baseline)
        if bouncer is not None:
            clients = sum(
                int(row["cl_active"]) + int(row["cl_waiting"])
                for row in bouncer.show("POOLS")
                if row["database"] == dbname
            )
            peak_clients = max(peak_clients, clients)
        if _remaining(kind) < n // 5:
            low = True
            break
        time.sleep(0.2)
    t1 = time.time()
    cpu_workers = sum(process_cpu_seconds(p.proc.pid) for p in procs) - cpu_workers
    cpu_server = server_cpu_seconds(server) - cpu_server
    statements = read_statements(pgss, dbname)
    _retire_leftovers(kind)
    from selvedge_django.models import WorkflowInstance

    failed = WorkflowInstance.objects.filter(status="failed")
    if failed.exists():
        print(
            f"  ({failed.count()} instances failed, the figures are not of the intended work:"
            f" {(failed.values_list('error', flat=True)[0] or '')[:300]})"
        )
    return {
        "kind": kind,
        "t0": t0,
        "t1": t1,
        "ran_low": low,
        "peak_server_connections": peak_server,
        "peak_pgbouncer_clients": peak_clients,
        "worker_cpu_s": cpu_workers,
        "server_cpu_s": cpu_server,
        "statements": statements,
    }


def summarise_window(window: dict[str, Any], probes: list[dict[str, Any]], procs: int) -> dict:
    method = "lease_batch" if window["kind"] == "dispatch" else "claim_tasks"
    t0, t1 = window["t0"], window["t1"]
    calls = [
        c for p in probes for c in p["calls"] if c[0] == method and c[1] >= t0 and c[1] + c[2] <= t1
    ]
    asked = sum(c[3] for c in calls)
    got = sum(c[4] for c in calls)
    short = [c for c in calls if c[4] < c[3]]
    latencies = [c[2] * 1000 for c in calls]
    span = t1 - t0
    stmt = statement_of(window["statements"], window["kind"])
    total_calls = sum(r["calls"] for r in window["statements"])
    return {
        "processes": procs,
        "kind": window["kind"],
        "seconds": span,
        "rows_per_s": got / span,
        "calls": len(calls),
        "asked": asked,
        "got": got,
        "short_calls": len(short),
        "short_share": len(short) / len(calls) if calls else 0.0,
        "missed_rows": asked - got,
        "missed_share": (asked - got) / asked if asked else 0.0,
        "empty_calls": sum(1 for c in calls if c[4] == 0),
        "p50_ms": percentile(latencies, 0.50),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
        "server_mean_ms": stmt["mean_ms"] if stmt else None,
        "server_statement": stmt["query"][:200] if stmt else None,
        "server_calls": stmt["calls"] if stmt else None,
        "server_statements_per_s": total_calls / span if window["statements"] else None,
        "connections_per_worker": window["peak_server_connections"] / procs,
        "pgbouncer_clients_per_worker": window["peak_pgbouncer_clients"] / procs,
        "worker_cores": window["worker_cpu_s"] / span,
        "server_cores": window["server_cpu_s"] / span,
        "ran_low": window["ran_low"],
        "load_average": os.getloadavg()[0],
        "top_statements": [
            {k: r[k] for k in ("calls", "total_ms", "mean_ms", "rows")}
            | {"query": r["query"][:400]}
            for r in window["statements"][:8]
        ],
    }


WORKER_HEADER = (
    f"  {'via':<10}{'P':>3} {'window':<9}{'rows/s':>8}{'calls':>7}{'short':>7}{'missed':>8}"
    f"{'empty':>7}{'p50 ms':>8}{'p95 ms':>8}{'p99 ms':>8}{'srv ms':>8}{'conn/P':>7}"
    f"{'pool/P':>7}{'cores W':>8}{'cores S':>8}{'load':>6}"
)


def print_worker_row(via: str, row: dict[str, Any]) -> None:
    srv = row["server_mean_ms"]
    print(
        f"  {via:<10}{row['processes']:>3} {row['kind']:<9}{row['rows_per_s']:>8.0f}"
        f"{row['calls']:>7}{row['short_share'] * 100:>6.1f}%{row['missed_share'] * 100:>7.1f}%"
        f"{row['empty_calls']:>7}{row['p50_ms']:>8.2f}{row['p95_ms']:>8.2f}{row['p99_ms']:>8.2f}"
        f"{(f'{srv:.2f}' if srv is not None else '-'):>8}{row['connections_per_worker']:>7.1f}"
        f"{(row['pgbouncer_clients_per_worker'] or 0):>7.1f}{row['worker_cores']:>8.2f}"
        f"{row['server_cores']:>8.2f}{row['load_average']:>6.1f}"
        + ("  (ran low)" if row["ran_low"] else ""),
        flush=True,
    )


def measure_workers(args: argparse.Namespace, dbname: str, server: dict[str, Any]) -> list[dict]:
    pgss = statements_available()
    print(WORKER_HEADER)
    out = []
    baseline = client_backends(dbname)  # this process's own connections
    for via in args.via:
        for count in args.processes:
            with tempfile.TemporaryDirectory(prefix="selvedge-probe-") as probe_dir:
                env = {"SELVEDGE_BENCH_PROBE_DIR": probe_dir}
                with contextlib_bouncer(via, dbname, args.pool_size) as bouncer:
                    if bouncer is not None:
                        env["SELVEDGE_BENCH_PGBOUNCER_PORT"] = str(bouncer.port)
                    windows = []
                    with worker_set(count, f"{via}{count}", env) as procs:
                        time.sleep(1.0)  # past every loop's first poll
                        for kind in ("dispatch", "claims"):
                            windows.append(
                                run_window(
                                    kind,
                                    args.workflows,
                                    args.seconds,
                                    procs,
                                    dbname,
                                    server,
                                    bouncer,
                                    pgss,
                                    baseline,
                                )
                            )
                    probes = read_probes(Path(probe_dir))
                for window in windows:
                    row = summarise_window(window, probes, count) | {"via": via}
                    print_worker_row(via, row)
                    out.append(row)
            clear_tables()
    print(
        "  rows/s: instances leased (dispatch) or tasks claimed (claims) per second by all P;"
        " short: calls that got fewer rows than they asked, with ready rows to spare"
        " (SKIP LOCKED misses); missed: rows asked and not got; p50-p99: the statement as"
        " the worker timed it; srv ms: its mean execution time (pg_stat_statements);"
        " conn/P: peak server connections per worker process (through pgbouncer: the"
        " pool's and the direct LISTEN and renewal ones); pool/P: pgbouncer client"
        " connections per worker; cores W/S: CPU used by the workers / by the server;"
        " load: the machine's 1-minute load average (everything on it, 2 cores)"
    )
    return out


@contextmanager
def contextlib_bouncer(via: str, dbname: str, pool_size: int) -> Iterator[Any]:
    if via == "direct":
        yield None
        return
    with pgbouncer_for(dbname, pool_size) as bouncer:
        yield bouncer


# -- notify -----------------------------------------------------------------------------


def _notify_commits(k: int, pace: float) -> list[float]:
    """Commit ``k`` notifications of the runnable topic, ``pace`` s apart; their times."""
    import psycopg

    from selvedge_django.storage.wakeups import NOTIFY_CHANNEL, TOPIC_RUNNABLE, notify_payload

    payload = notify_payload(TOPIC_RUNNABLE)
    times = []
    with psycopg.connect(
        host=os.environ["SELVEDGE_PG_HOST"],
        port=os.environ["SELVEDGE_PG_PORT"],
        user=os.environ.get("SELVEDGE_PG_USER", "postgres"),
        dbname=os.environ["SELVEDGE_BENCH_PG_NAME"],
        autocommit=True,
    ) as conn:
        for _ in range(k):
            t = time.perf_counter()
            conn.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, payload])
            times.append((time.perf_counter() - t) * 1000)
            time.sleep(pace)
    return times


def _server_statements(pgss: bool, dbname: str) -> int:
    """Statements the database ran since the last reset, the benchmark's own left out."""
    rows = read_statements(pgss, dbname)
    return sum(
        r["calls"] for r in rows if "pg_notify" not in r["query"] and "pg_stat" not in r["query"]
    )


def per_notification(
    busy: float, idle: float, *, spans: tuple[float, float], k: int, listening: int
) -> float:
    """What ``k`` notifications cost each listening process: the notifying window's
    figure less the idle window's rate over as long, per notification and process."""
    busy_span, idle_span = spans
    extra = busy - idle * busy_span / idle_span
    return extra / k / listening if listening else 0.0


def measure_notify(
    args: argparse.Namespace, dbname: str, server: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per listening process, what one notification costs it; and the sender's commit."""
    pgss = statements_available()
    k, pace = args.notifications, 0.05
    print(
        f"  {'listening':>9}{'commit p50':>11}{'p95 ms':>8}{'polls/notif':>12}"
        f"{'stmts/notif':>12}{'CPU ms/notif':>13}{'server CPU ms':>14}{'idle stmts/s':>13}"
    )
    out = []
    for count in [0, *args.listeners]:
        with tempfile.TemporaryDirectory(prefix="selvedge-probe-") as probe_dir:
            env = {"SELVEDGE_BENCH_PROBE_DIR": probe_dir}
            with worker_set(count, f"listen{count}", env) as procs:
                time.sleep(2.0)  # every loop has polled once and sleeps
                span = k * pace + 0.5
                # An idle window as long as the notifying one: what the workers do anyway.
                reset_statements(pgss)
                cpu0 = sum(process_cpu_seconds(p.proc.pid) for p in procs)
                srv0 = server_cpu_seconds(server)
                i0 = time.time()
                time.sleep(span)
                i1 = time.time()
                cpu1 = sum(process_cpu_seconds(p.proc.pid) for p in procs)
                srv1 = server_cpu_seconds(server)
                idle_statements = _server_statements(pgss, dbname)
                reset_statements(pgss)
                n0 = time.time()
                commits = _notify_commits(k, pace)
                time.sleep(0.5)  # the last wake-ups are served
                n1 = time.time()
                cpu2 = sum(process_cpu_seconds(p.proc.pid) for p in procs)
                srv2 = server_cpu_seconds(server)
                busy_statements = _server_statements(pgss, dbname)
            probes = read_probes(Path(probe_dir))

        def polls(a: float, b: float, probes: list[dict[str, Any]] = probes) -> int:
            return sum(
                1 for p in probes for c in p["calls"] if c[0] == "lease_batch" and a <= c[1] < b
            )

        net = functools.partial(per_notification, spans=(n1 - n0, i1 - i0), k=k, listening=count)
        row = {
            "listeners": count,
            "notifications": k,
            "commit_p50_ms": percentile(commits, 0.5),
            "commit_p95_ms": percentile(commits, 0.95),
            "polls_per_notification_per_process": net(polls(n0, n1), polls(i0, i1)),
            "statements_per_notification_per_process": net(busy_statements, idle_statements),
            "cpu_ms_per_notification_per_process": net(cpu2 - cpu1, cpu1 - cpu0) * 1000,
            "server_cpu_ms_per_notification_per_process": net(srv2 - srv1, srv1 - srv0) * 1000,
            "idle_statements_per_s_per_process": idle_statements / (i1 - i0) / count
            if count
            else 0.0,
        }
        out.append(row)
        print(
            f"  {count:>9}{row['commit_p50_ms']:>11.3f}{row['commit_p95_ms']:>8.3f}"
            f"{row['polls_per_notification_per_process']:>12.2f}"
            f"{row['statements_per_notification_per_process']:>12.2f}"
            f"{row['cpu_ms_per_notification_per_process']:>13.2f}"
            f"{row['server_cpu_ms_per_notification_per_process']:>14.2f}"
            f"{row['idle_statements_per_s_per_process']:>13.2f}",
            flush=True,
        )
    out += _raw_listeners(args.raw_listeners, k, pace, server)
    print(
        f"  {k} notifications of the runnable topic (what a start sends) one every {pace} s,"
        " with nothing to dispatch; per notification and listening process, net of an idle"
        " window as long: polls = dispatcher lease_batch calls (the probe), stmts = statements"
        " the server ran (pg_stat_statements), CPU of the worker processes and of the server."
        " commit: the sender's pg_notify in autocommit; 'raw': plain connections that only"
        " LISTEN (no worker behind them), the server's share of the fan-out alone"
    )
    return out


def _raw_listeners(
    counts: list[int], k: int, pace: float, server: dict[str, Any]
) -> list[dict[str, Any]]:
    """The sender's commit and the server's CPU with ``L`` plain LISTEN connections."""
    import psycopg

    from selvedge_django.storage.wakeups import NOTIFY_CHANNEL

    out = []
    for count in counts:
        conns = []
        try:
            for _ in range(count):
                conn = psycopg.connect(
                    host=os.environ["SELVEDGE_PG_HOST"],
                    port=os.environ["SELVEDGE_PG_PORT"],
                    user=os.environ.get("SELVEDGE_PG_USER", "postgres"),
                    dbname=os.environ["SELVEDGE_BENCH_PG_NAME"],
                    autocommit=True,
                )
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                conns.append(conn)
            span = k * pace + 0.5
            srv0 = server_cpu_seconds(server)
            time.sleep(span)
            srv1 = server_cpu_seconds(server)
            commits = _notify_commits(k, pace)
            time.sleep(0.5)
            srv2 = server_cpu_seconds(server)
            for conn in conns:  # read what arrived, so nothing is left queued
                for _ in conn.notifies(timeout=0.01, stop_after=k):
                    pass
        finally:
            for conn in conns:
                conn.close()
        server_ms = ((srv2 - srv1) - (srv1 - srv0)) * 1000 / k / count
        row = {
            "raw_listeners": count,
            "notifications": k,
            "commit_p50_ms": percentile(commits, 0.5),
            "commit_p95_ms": percentile(commits, 0.95),
            "server_cpu_ms_per_notification_per_process": server_ms,
        }
        out.append(row)
        print(
            f"  {str(count) + ' raw':>9}{row['commit_p50_ms']:>11.3f}{row['commit_p95_ms']:>8.3f}"
            f"{'-':>12}{'-':>12}{'-':>13}{server_ms:>14.3f}{'-':>13}",
            flush=True,
        )
    return out


# -- driver -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    parser.add_argument("--processes", type=_ints, default=None, help="e.g. 1,2,4,8,16,32")
    parser.add_argument("--seconds", type=float, default=None, help="per worker window")
    parser.add_argument("--workflows", type=int, default=None, help="rows made ready per window")
    parser.add_argument("--via", default=None, help="direct,pgbouncer")
    parser.add_argument("--pool-size", type=int, default=20, help="pgbouncer server connections")
    parser.add_argument("--listeners", type=_ints, default=None, help="e.g. 1,4,16,32")
    parser.add_argument("--raw-listeners", type=_ints, default=None, help="e.g. 100,500")
    parser.add_argument("--notifications", type=int, default=None)
    parser.add_argument("--instances", type=int, default=None, help="tables: default 10000000")
    parser.add_argument("--live-share", type=float, default=0.01, help="tables: running share")
    parser.add_argument("--chunk", type=int, default=None, help="tables: starts per bulk call")
    parser.add_argument(
        "--seed", type=int, default=None, help="tables: instances made by bulk starts"
    )
    parser.add_argument("--fillfactor", type=int, default=80, help="tables: the value tried")
    parser.add_argument("--shared", action="store_true", help="the SELVEDGE_PG_* server")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the figures here")
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    if set(args.only) - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(set(args.only) - set(SECTIONS)))}")
    quick = args.quick
    args.processes = args.processes or ([2] if quick else [1, 2, 4, 8, 16, 32])
    args.seconds = args.seconds or (2.0 if quick else 10.0)
    args.workflows = args.workflows or (1000 if quick else 20_000)
    args.via = (args.via or ("direct,pgbouncer")).split(",")
    args.listeners = args.listeners or ([2] if quick else [1, 2, 4, 8, 16, 32])
    args.raw_listeners = args.raw_listeners or ([50] if quick else [100, 250, 500])
    args.notifications = args.notifications or (20 if quick else 100)
    args.instances = args.instances or (10_000 if quick else 10_000_000)

    results: dict[str, Any] = {}
    with benchmark_server(args.shared) as server:
        os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_scaleout_{os.getpid()}")
        dbname = os.environ["SELVEDGE_BENCH_PG_NAME"]
        with bench_database("postgres", SETTINGS) as info:
            import django

            from selvedge_django.storage.postgresql.listener import stop_listeners

            print(
                f"== {info['version']} "
                + ("(the benchmark's own cluster: " if server["own"] else "(shared server: ")
                + (
                    ", ".join(f"{k}={v}" for k, v in SERVER_SETTINGS.items())
                    if server["own"]
                    else "its settings"
                )
                + f") ==\nDjango {django.get_version()}, Python {platform.python_version()}, "
                f"{os.cpu_count()} CPUs, {memory_gb():.0f} GB",
                flush=True,
            )
            try:
                if "workers" in args.only:
                    print(
                        f"\nWorker processes: {args.workflows} rows made ready per window, "
                        f"{args.seconds:.0f} s windows, pgbouncer pool {args.pool_size}",
                        flush=True,
                    )
                    results["workers"] = measure_workers(args, dbname, server)
                if "notify" in args.only:
                    print("\nNOTIFY fan-out to idle worker processes", flush=True)
                    results["notify"] = measure_notify(args, dbname, server)
                if "tables" in args.only:
                    from bench.scale_out_tables import measure_tables

                    clear_tables()
                    results["tables"] = measure_tables(args, dbname)
            finally:
                stop_listeners()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
