#!/usr/bin/env python
"""Streams: entries per second written by one activity, and write-to-read latency.

    python bench/bench_streams.py [--db sqlite|postgres|all] [--entries N] [--samples N]

Three figures per database, all from one in-process ``Worker`` with default settings:

* write rate: one activity calls ``sv.write_stream()`` ``--entries`` times in a
  loop (each entry its own transaction, fenced by the attempt's claim); entries
  per second, beside a baseline measured in the same run: the same number of
  one-row INSERT transactions into a plain table through the same connection
  (the floor of any durable write), and the ratio of the two;
* write-to-read latency, same process: the activity writes ``--samples``
  entries, 20 ms apart, each carrying ``time.perf_counter()`` taken just before
  the call; a reader thread of this process (``sv.read_stream``, woken by the
  in-process bus) notes when each arrives; p50 and p99;
* write-to-read latency, another process: the same with the reader in a child
  process (woken through LISTEN/NOTIFY on PostgreSQL, polling every
  ``WAIT_POLL_INTERVAL`` on SQLite), which starts listening before the first
  write. ``perf_counter`` is the same monotonic clock in both processes on Linux.

DBOS's streams would be run beside these if DBOS were installed here; it is not
(bench/compare_dbos.py installs it into a virtualenv of its own), so this prints
selvedge's figures and the baseline only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_core import _git_revision  # noqa: E402 - the repository root goes on the path first
from bench.harness import bench_database, each_database  # noqa: E402

PACE = 0.02  # seconds between the latency samples' writes


def define_workload() -> Any:
    import selvedge_django as sv

    @sv.activity(name="bench.streams.burst", start_to_close_timeout=600)
    def burst(n: int) -> float:
        """Write ``n`` entries as fast as possible; return the seconds it took."""
        started = time.perf_counter()
        for i in range(n):
            sv.write_stream("burst", i)
        return time.perf_counter() - started

    @sv.activity(name="bench.streams.paced", start_to_close_timeout=600)
    def paced(request: dict[str, Any]) -> int:
        """Write ``n`` entries PACE apart, each carrying the moment just before its write,
        once the reader process says it listens (the file ``ready`` exists)."""
        n, ready = request["n"], request.get("ready")
        deadline = time.monotonic() + 120
        while ready and not Path(ready).exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the reader process never got ready")
            time.sleep(0.01)
        for _ in range(n):
            time.sleep(PACE)  # pacing the load, not synchronisation
            sv.write_stream("paced", time.perf_counter())
        return n

    @sv.workflow(name="bench.streams.burst")
    def run_burst(ctx: sv.WorkflowContext, n: int) -> float:
        return burst.execute(ctx, n)

    @sv.workflow(name="bench.streams.paced")
    def run_paced(ctx: sv.WorkflowContext, request: dict[str, Any]) -> int:
        count = paced.execute(ctx, request)
        ctx.close_stream("paced")
        return count

    return run_burst, run_paced


def baseline_inserts(n: int) -> float:
    """Seconds for ``n`` one-row INSERT transactions into a plain table."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_stream_baseline (id INTEGER PRIMARY KEY, v TEXT)")
    started = time.perf_counter()
    for i in range(n):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_stream_baseline (id, v) VALUES (%s, %s)", [i, "1"])
    return time.perf_counter() - started


def read_latencies(instance_id: str) -> list[float]:
    import selvedge_django as sv

    out = []
    for entry in sv.read_stream(instance_id, "paced", timeout=60):
        out.append(time.perf_counter() - float(entry.value))
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.2f} ms"


def summarise(label: str, values: list[float]) -> None:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    print(
        f"  {label:<34} p50 {_ms(cuts[49])}   p99 {_ms(cuts[98])}   max {_ms(max(values))}"
        f"   ({len(values)} entries)"
    )


def run_child_reader(instance_id: str, ready: str) -> None:
    import django

    django.setup()
    from selvedge_django.operations import client_store

    store = client_store()
    if store.db.notify_enabled:  # listening before the first write, as a long-lived page is
        from selvedge_django.storage.postgresql.listener import (
            ensure_listener,
            wait_until_connected,
        )

        wait_until_connected(ensure_listener(store.db.listen_alias, store.bus), 30)
    Path(ready).touch()
    print(json.dumps(read_latencies(instance_id)), flush=True)


def run_one(db: str, entries: int, samples: int) -> None:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_streams_{os.getpid()}")
    with bench_database(db) as info:
        import django

        import selvedge_django as sv
        from selvedge_django.worker import Worker

        run_burst, run_paced = define_workload()
        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django (git {_git_revision()}), Django {django.get_version()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
        )
        worker = Worker()
        worker.start()
        try:
            sv.wait_workflow(sv.start_workflow(run_burst, 50), timeout=120)  # warm-up
            iid = sv.start_workflow(run_burst, entries)
            seconds = sv.wait_workflow(iid, timeout=600).output
            base = baseline_inserts(entries)
            print(
                f"  write rate: {entries / seconds:8.0f} entries/s (one activity, {entries}"
                f" entries); baseline {entries / base:8.0f} one-row inserts/s;"
                f" ratio {seconds / base:.2f}x the baseline's time"
            )

            iid = sv.start_workflow(run_paced, {"n": samples})
            summarise("write -> read, same process", read_latencies(iid))
            sv.wait_workflow(iid, timeout=60)

            ready = Path(tempfile.mkdtemp(prefix="selvedge-bench-")) / "ready"
            iid = sv.start_workflow(run_paced, {"n": samples, "ready": str(ready)})
            child = subprocess.Popen(
                [sys.executable, __file__, "--reader", iid, "--ready", str(ready)],
                stdout=subprocess.PIPE,
                text=True,
            )
            out, _ = child.communicate(timeout=300)
            summarise("write -> read, another process", json.loads(out.strip().splitlines()[-1]))
            sv.wait_workflow(iid, timeout=60)
        finally:
            worker.stop(timeout=10)
            from selvedge_django.storage.postgresql.listener import stop_listeners

            stop_listeners()
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--entries", type=int, default=2000, metavar="N")
    parser.add_argument("--samples", type=int, default=200, metavar="N")
    parser.add_argument("--reader", metavar="INSTANCE_ID", help=argparse.SUPPRESS)
    parser.add_argument("--ready", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reader:
        run_child_reader(args.reader, args.ready)
        return 0
    if args.db != "all":
        run_one(args.db, args.entries, args.samples)
        return 0
    options = ["--entries", str(args.entries), "--samples", str(args.samples)]
    return each_database(__file__, options)


if __name__ == "__main__":
    sys.exit(main())
