#!/usr/bin/env python
"""What a parked execution costs a worker process, and what a sleeping instance costs.

    python bench/bench_parked.py [--db sqlite|postgres|all] [--parked N] [--history N]
                                 [--sleepers N] [--only parked,sleepers,greenlet]

parked    N instances (default 100, the default cache's MAX_ENTRIES) each record
          ``--history`` now() commands and wait in ``receive``, in one
          ``runselvedge worker`` process with the default settings (the workflow
          cache on), then in one with the cache off: the worker's threads and
          resident memory (VmRSS) idle and with the N waiting, per instance.
          Then each gets its signal and the run's wall time to the last close
          is printed (continued against replayed).
sleepers  N instances (default 100,000) asleep on one-day durable timers in one
          worker process with the default settings: threads and resident memory
          idle (a first worker process) and with the N asleep (a second one, which
          took them all to sleep). A long sleep does not park (it unwinds and
          releases its lease as without a cache), so the figure to read is
          "threads added: 0" and the memory against the 100 MB budget.
greenlet  No worker: N threads each blocked at a wait 30 Python frames deep,
          against N greenlets suspended at the same depth, each after one SQLite
          query, in a child process each (resident memory per parked stack). Runs
          only when the ``greenlet`` package is importable; it is not a dependency.

Each database runs in its own child process on a throwaway database
(bench/harness.py); the worker processes are real ``runselvedge worker``
processes (bench/bench_scale.py's). See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_core import _git_revision  # noqa: E402 - the repository root goes on the path first
from bench.bench_scale import client_polling, wait_for, worker_processes  # noqa: E402
from bench.harness import bench_database  # noqa: E402

SECTIONS = ("parked", "sleepers", "greenlet")
SETTLE = 2.5  # seconds: a parked thread closes its connections after 1 s idle


def _waiting(name: str) -> Any:
    """Running instances of ``name`` that have run and wait (no lease, not runnable)."""
    from selvedge_django.models import WorkflowInstance

    return WorkflowInstance.objects.filter(
        workflow_name=name, status="running", lease_owner="", runnable=False, parked_seq__gt=0
    )


def _running(name: str) -> Any:
    from selvedge_django.models import WorkflowInstance

    return WorkflowInstance.objects.filter(workflow_name=name, status="running")


def _worker_connections(db: str) -> str:
    """PostgreSQL: the server connections open on the benchmark database besides ours."""
    if db != "postgres":
        return ""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return f", {cursor.fetchone()[0]} server connections"


def measure_parked(db: str, n: int, history: int) -> None:
    """N waiting instances in a worker with the default cache, then in one without."""
    import selvedge_django as sv

    name = "bench.scale.history"
    print(f"\n{n} instances waiting in receive after {history} recorded commands each")
    print(
        f"  {'cache':<14} {'threads':>14} {'RSS idle':>10} {'RSS waiting':>12} "
        f"{'per instance':>13} {'signal all, to next wait':>27}"
    )
    for label, cache in (("on (default)", None), ("off", "0")):
        if cache is None:
            os.environ.pop("SELVEDGE_BENCH_CACHE", None)
        else:
            os.environ["SELVEDGE_BENCH_CACHE"] = cache
        with worker_processes(db, 1, f"parked-{label[:3]}") as (proc,), client_polling(db):
            # Warm up: every code path of a park, a continuation and a close.
            warm = [sv.start_workflow("bench.scale.signal_wake", None) for _ in range(5)]
            wait_for(lambda: _waiting("bench.scale.signal_wake").count() == 5, timeout=120)
            for iid in warm:
                sv.signal(iid, "go", None)
            for iid in warm:
                sv.wait_workflow(iid, timeout=120)
            time.sleep(SETTLE)
            rss0, threads0 = proc.status("VmRSS"), proc.status("Threads")
            ids = [sv.start_workflow(name, history) for _ in range(n)]
            wait_for(lambda: _waiting(name).count() == n, timeout=600, interval=0.1)
            time.sleep(SETTLE)
            rss1, threads1 = proc.status("VmRSS"), proc.status("Threads")
            connections = _worker_connections(db)
            started = time.perf_counter()
            for iid in ids:
                sv.signal(iid, "go", None)
            # Each receives again ("go" forever): one more wait per instance.
            again = _waiting(name).filter(parked_seq__gt=history + 1)
            wait_for(lambda again=again: again.count() == n, timeout=600, interval=0.1)
            resumed = time.perf_counter() - started
            _running(name).update(status="terminated")
        per = (rss1 - rss0) / n
        print(
            f"  {label:<14} {threads0:>5} -> {threads1:<6} {rss0 / 1024:>7.1f} MB "
            f"{rss1 / 1024:>9.1f} MB {per:>9.1f} KiB {resumed:>22.2f} s{connections}",
            flush=True,
        )
    os.environ.pop("SELVEDGE_BENCH_CACHE", None)


def measure_sleepers(db: str, n: int) -> None:
    """N instances asleep on one-day timers in a worker with the default settings.

    The N start while no worker runs (on SQLite a client's writes could otherwise
    wait out its busy timeout behind a worker suspending thousands a second); the
    idle figures are those of a first worker process after a warm-up, the asleep
    ones those of the second, which takes all N to sleep.
    """
    from django.db import transaction
    from django.utils import timezone

    import selvedge_django as sv
    from selvedge_django.models import TimerSubscription

    name = "bench.scale.sleep_until"
    print(f"\n{n} instances asleep on one-day timers (default settings, cache on)")
    with worker_processes(db, 1, "idle") as (proc,), client_polling(db):
        soon = (timezone.now() + timedelta(seconds=0.5)).isoformat()
        for iid in [sv.start_workflow(name, soon) for _ in range(20)]:
            sv.wait_workflow(iid, timeout=60)
        time.sleep(SETTLE)
        rss0, threads0 = proc.status("VmRSS"), proc.status("Threads")
    until = (timezone.now() + timedelta(days=1)).isoformat()
    for first in range(0, n, 1000):
        with transaction.atomic():
            for _ in range(min(1000, n - first)):
                sv.start_workflow(name, until)

    def all_asleep() -> bool:
        return TimerSubscription.objects.count() >= n and _waiting(name).count() >= n

    with worker_processes(db, 1, "sleepers") as (proc,), client_polling(db):
        started = time.perf_counter()
        wait_for(all_asleep, timeout=3600, interval=1.0)
        asleep = time.perf_counter() - started
        time.sleep(SETTLE)
        rss1, threads1 = proc.status("VmRSS"), proc.status("Threads")
        connections = _worker_connections(db)
    print(
        f"  all asleep after {asleep:.1f} s ({n / asleep:.0f} suspensions/s)\n"
        f"  worker threads: {threads0} idle, {threads1} with {n} asleep "
        f"(threads added: {threads1 - threads0}){connections}\n"
        f"  worker memory (RSS): {rss0 / 1024:.1f} MB idle, {rss1 / 1024:.1f} MB with {n} asleep "
        f"(+{(rss1 - rss0) / 1024:.1f} MB; budget 100 MB)",
        flush=True,
    )


# -- greenlet against a thread per parked execution (no worker, no database server) ------

_PARK_CHILD = r"""
import sqlite3, sys, threading, time
kind, n, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def query():
    # A database call before the wait, as a workflow's last command made one.
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
    db.executemany("INSERT INTO t VALUES (?, ?)", [(str(i), "v" * 50) for i in range(50)])
    db.execute("SELECT k, v FROM t WHERE k > ? ORDER BY v LIMIT 10", ("1",)).fetchall()
    db.close()

def nested(level, park):
    local = [level] * 8  # a few locals per frame, as workflow code has
    if level == 0:
        query()
        park()
        return 0
    return nested(level - 1, park) + local[0]

before = rss()
if kind == "thread":
    gate = threading.Event()
    threads = [threading.Thread(target=nested, args=(depth, gate.wait)) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    after, alive = rss(), threading.active_count()
    gate.set()
    for t in threads:
        t.join()
else:
    import greenlet
    main = greenlet.getcurrent()
    parked = [greenlet.greenlet(lambda: nested(depth, main.switch)) for _ in range(n)]
    for g in parked:
        g.switch()
    after, alive = rss(), threading.active_count()
    for g in parked:
        g.switch()
print(before, after, alive)
"""


def measure_greenlet(n: int, depth: int = 30) -> None:
    """RSS per parked frame stack: a thread each against a greenlet each."""
    try:
        import greenlet  # noqa: F401
    except ImportError:
        print("\ngreenlet: not installed (pip install greenlet), section skipped")
        return
    print(f"\n{n} parked stacks {depth} frames deep after a query: a thread or a greenlet each")
    for kind in ("thread", "greenlet"):
        out = subprocess.run(
            [sys.executable, "-c", _PARK_CHILD, kind, str(n), str(depth)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ},
        ).stdout.split()
        before, after, threads = int(out[0]), int(out[1]), int(out[2])
        print(
            f"  {kind:<9} RSS {before / 1024:6.1f} -> {after / 1024:6.1f} MB, "
            f"{(after - before) / n:6.1f} KiB each, {threads} threads",
            flush=True,
        )


def run_one(db: str, args: argparse.Namespace) -> None:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_parked_{os.getpid()}")
    with bench_database(db, "bench.scale_settings") as info:
        import django

        import selvedge_django
        from selvedge_django.conf import get_settings

        cache = get_settings().workflow_cache
        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django {getattr(selvedge_django, '__version__', '?')} "
            f"(git {_git_revision()}), Django {django.get_version()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs; default cache: "
            f"MAX_ENTRIES {cache.max_entries}, MAX_BYTES {cache.max_bytes // 2**20} MiB, "
            f"STICKY_WINDOW {cache.sticky_window} s"
        )
        if "parked" in args.only:
            measure_parked(db, args.parked, args.history)
        if "sleepers" in args.only:
            measure_sleepers(db, args.sleepers)
        from selvedge_django.storage.postgresql.listener import stop_listeners

        stop_listeners()  # before the database is dropped
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--parked", type=int, default=100, metavar="N")
    parser.add_argument("--history", type=int, default=20, metavar="N")
    parser.add_argument("--sleepers", type=int, default=100_000, metavar="N")
    parser.add_argument("--only", default=",".join(SECTIONS))
    args = parser.parse_args(argv)
    args.only = {part.strip() for part in args.only.split(",") if part.strip()}
    if not args.only <= set(SECTIONS):
        parser.error(f"--only takes {', '.join(SECTIONS)}")
    if args.db != "all":
        run_one(args.db, args)
        return 0
    if "greenlet" in args.only:
        measure_greenlet(args.parked)
        args.only.discard("greenlet")
    failed = []
    options = ["--parked", str(args.parked), "--history", str(args.history)]
    options += ["--sleepers", str(args.sleepers), "--only", ",".join(sorted(args.only))]
    for db in ("sqlite", "postgres"):
        if args.only and subprocess.call([sys.executable, __file__, "--db", db, *options]) != 0:
            failed.append(db)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
