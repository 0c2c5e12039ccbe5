#!/usr/bin/env python
"""Streams: entries per second written by one activity, and write-to-read latency.

    python bench/bench_streams.py [--db sqlite|postgres|all] [--entries N] [--samples N]
                                  [--rounds N] [--dbos]

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

``--rounds N`` repeats the three N times (write rate: the median of the rounds;
latencies: percentiles over every round's entries). With ``--dbos`` each round is
followed by the same round with DBOS Transact's streams (``bench/dbos_streams.py``,
run in the virtualenv of ``bench/compare_dbos.py``: ``SELVEDGE_BENCH_VENV``, default
``.venv-bench``, created with pip on first use) against a system database of its own
on the same PostgreSQL server (or a SQLite file on the same disk), and a table puts
the figures side by side with the ratio selvedge/DBOS.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_stream_baseline (id INTEGER, v TEXT)")
        cursor.execute("DELETE FROM bench_stream_baseline")
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


def cuts(values: list[float]) -> dict[str, float]:
    """p50 and p99 (inclusive percentiles, the same function for both engines) and max."""
    points = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": points[49], "p99": points[98], "max": max(values)}


def summarise(label: str, values: list[float]) -> None:
    c = cuts(values)
    print(
        f"  {label:<34} p50 {_ms(c['p50'])}   p99 {_ms(c['p99'])}   max {_ms(c['max'])}"
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


def selvedge_round(workload: tuple[Any, Any], entries: int, samples: int) -> dict[str, Any]:
    """One round of the three figures on selvedge's side (a started Worker is running)."""
    import selvedge_django as sv

    run_burst, run_paced = workload
    iid = sv.start_workflow(run_burst, entries)
    seconds = sv.wait_workflow(iid, timeout=600).output
    base = baseline_inserts(entries)

    iid = sv.start_workflow(run_paced, {"n": samples})
    same = read_latencies(iid)
    sv.wait_workflow(iid, timeout=60)

    ready = Path(tempfile.mkdtemp(prefix="selvedge-bench-")) / "ready"
    iid = sv.start_workflow(run_paced, {"n": samples, "ready": str(ready)})
    child = subprocess.Popen(
        [sys.executable, __file__, "--reader", iid, "--ready", str(ready)],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = child.communicate(timeout=300)
    other = json.loads(out.strip().splitlines()[-1])
    sv.wait_workflow(iid, timeout=60)
    return {
        "write_seconds": seconds,
        "baseline_seconds": base,
        "same_process": same,
        "other_process": other,
    }


class DbosSide:
    """DBOS Transact's rounds: ``bench/dbos_streams.py`` in the benchmark virtualenv,
    against a system database of its own on the same server (or a SQLite file on the
    same disk), created here and removed at the end."""

    def __init__(self, db: str) -> None:
        from bench.compare_dbos import bench_venv, pg_url

        self.python = bench_venv(db)
        self.tmp = Path(tempfile.mkdtemp(prefix="selvedge-bench-dbos-"))
        self.pg_name: str | None = None
        if db == "sqlite":
            self.url = f"sqlite:///{self.tmp / 'dbos.sqlite3'}"
        else:
            from bench.harness import _pg_admin, _quote

            self.pg_name = f"selvedge_bench_streams_dbos_{os.getpid()}"
            _pg_admin(f"DROP DATABASE IF EXISTS {_quote(self.pg_name)} WITH (FORCE)")
            _pg_admin(f"CREATE DATABASE {_quote(self.pg_name)}")
            self.url = pg_url(self.pg_name)

    def round(self, entries: int, samples: int) -> dict[str, Any]:
        out = self.tmp / "round.json"
        command = [str(self.python), str(REPO_ROOT / "bench" / "dbos_streams.py"), "run"]
        command += ["--url", self.url, "--json", str(out)]
        command += ["--entries", str(entries), "--samples", str(samples)]
        subprocess.run(command, check=True, timeout=900)
        return dict(json.loads(out.read_text()))

    def close(self) -> None:
        if self.pg_name:
            from bench.harness import _pg_admin, _quote

            _pg_admin(f"DROP DATABASE IF EXISTS {_quote(self.pg_name)} WITH (FORCE)")
        shutil.rmtree(self.tmp, ignore_errors=True)


def print_table(db: str, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    """Both engines' figures side by side: write rate as the median of the rounds,
    latencies as percentiles over every round's entries pooled."""
    version = theirs[0]["version"] if theirs else ""
    place = "same PostgreSQL server" if db == "postgres" else "SQLite files on the same disk"
    print(f"  selvedge_django vs {version}, {place}, {len(ours)} interleaved rounds")
    print(f"  {'figure':<38}{'selvedge':>11}{'DBOS':>11}  {'unit':<10}{'ratio':>7}  better")
    table = [
        (
            "write rate, one activity/step",
            statistics.median(r["entries"] / r["write_seconds"] for r in ours),
            statistics.median(r["entries"] / r["write_seconds"] for r in theirs),
            "entries/s",
        )
    ]
    for key, where in (("same_process", "same process"), ("other_process", "other process")):
        mine = cuts([v for r in ours for v in r[key]])
        other = cuts([v for r in theirs for v in r[key]])
        for q in ("p50", "p99"):
            table.append((f"write -> read {q}, {where}", mine[q] * 1000, other[q] * 1000, "ms"))
    for figure, mine_v, other_v, unit in table:
        higher_is_better = unit.endswith("/s")
        better = (mine_v >= other_v) if higher_is_better else (mine_v <= other_v)
        print(
            f"  {figure:<38}{mine_v:>11.1f}{other_v:>11.1f}  {unit:<10}"
            f"{mine_v / other_v:>6.2f}x  {'selvedge' if better else 'DBOS'}"
        )
    print("  ratio = selvedge / DBOS (write rate: higher is better; latency: lower is better)")
    for index, (mine_r, other_r) in enumerate(zip(ours, theirs, strict=True), 1):
        print(
            f"  round {index}: write rate {mine_r['entries'] / mine_r['write_seconds']:.0f}"
            f" / {other_r['entries'] / other_r['write_seconds']:.0f} entries/s,"
            f" same-process p50 {cuts(mine_r['same_process'])['p50'] * 1000:.1f}"
            f" / {cuts(other_r['same_process'])['p50'] * 1000:.1f} ms"
        )


def run_one(db: str, entries: int, samples: int, rounds: int, dbos: bool) -> None:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_streams_{os.getpid()}")
    with bench_database(db) as info:
        import django

        import selvedge_django as sv
        from selvedge_django.worker import Worker

        workload = define_workload()
        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django (git {_git_revision()}), Django {django.get_version()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
        )
        peer = DbosSide(db) if dbos else None
        ours: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        worker = Worker()
        worker.start()
        try:
            sv.wait_workflow(sv.start_workflow(workload[0], 50), timeout=120)  # warm-up
            for _ in range(rounds):  # interleaved, so the machine's drift falls on both
                ours.append(dict(selvedge_round(workload, entries, samples), entries=entries))
                if peer is not None:
                    theirs.append(peer.round(entries, samples))
        finally:
            worker.stop(timeout=10)
            from selvedge_django.storage.postgresql.listener import stop_listeners

            stop_listeners()
            if peer is not None:
                peer.close()
        seconds = statistics.median(r["write_seconds"] for r in ours)
        base = statistics.median(r["baseline_seconds"] for r in ours)
        print(
            f"  write rate: {entries / seconds:8.0f} entries/s (one activity, {entries}"
            f" entries); baseline {entries / base:8.0f} one-row inserts/s;"
            f" ratio {seconds / base:.2f}x the baseline's time"
        )
        summarise("write -> read, same process", [v for r in ours for v in r["same_process"]])
        summarise("write -> read, another process", [v for r in ours for v in r["other_process"]])
        if theirs:
            print_table(db, ours, theirs)
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--entries", type=int, default=2000, metavar="N")
    parser.add_argument("--samples", type=int, default=200, metavar="N")
    parser.add_argument("--rounds", type=int, default=1, metavar="N")
    parser.add_argument(
        "--dbos", action="store_true", help="DBOS Transact's streams beside, same run"
    )
    parser.add_argument("--reader", metavar="INSTANCE_ID", help=argparse.SUPPRESS)
    parser.add_argument("--ready", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reader:
        run_child_reader(args.reader, args.ready)
        return 0
    if args.db != "all":
        run_one(args.db, args.entries, args.samples, args.rounds, args.dbos)
        return 0
    options = ["--entries", str(args.entries), "--samples", str(args.samples)]
    options += ["--rounds", str(args.rounds)] + (["--dbos"] if args.dbos else [])
    return each_database(__file__, options)


if __name__ == "__main__":
    sys.exit(main())
