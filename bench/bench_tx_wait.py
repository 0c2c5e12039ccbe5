#!/usr/bin/env python
"""How long a web request's ``sv.signal()`` waits while a transactional activity runs.

    python bench/bench_tx_wait.py                          # SQLite and PostgreSQL
    python bench/bench_tx_wait.py --db sqlite --bodies 0.5 2 5 --busy-timeout 3

A transactional activity runs its body inside a transaction on the engine's
database. On SQLite that transaction holds the database's write lock from its
``BEGIN IMMEDIATE`` to its commit, so every other writer waits for it: here a
"web request" thread sends ``sv.signal()`` to an unrelated instance every 20 ms
while one in-process ``Worker`` runs a transactional activity whose body takes
``--bodies`` seconds (a ``time.sleep()`` inside the transaction). Each signal is
timed from the call to its return. The table shows, per body length, the
signals that were in flight at some moment of the body: how many, the median and
longest wait, and how many failed with "database is locked" (a wait longer than the
busy timeout, 30 s by default in selvedge_django, ``--busy-timeout`` here). On
PostgreSQL the activity's transaction locks only the rows it writes, so the
signals to another instance do not wait.

Each database runs in a child process of its own (Django is set up once per
process), on a fresh database (``bench/harness.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

SIGNAL_EVERY = 0.02  # seconds between the end of one signal and the next


def run_child(db: str, bodies: list[float], busy_timeout: float | None) -> list[dict[str, Any]]:
    """Every body length on one database, in this process."""
    from bench.harness import bench_database

    with bench_database(db):
        from django.db import OperationalError, connections

        import selvedge_django as sv
        from selvedge_django.worker import Worker

        if busy_timeout is not None and db == "sqlite":
            connections["default"].settings_dict["OPTIONS"]["timeout"] = busy_timeout
            connections.close_all()

        body_started = threading.Event()
        marks: dict[str, float] = {}

        @sv.activity(name="bench.txwait.body", transactional=True)
        def body(seconds: float) -> float:
            marks["start"] = time.perf_counter()
            body_started.set()
            time.sleep(seconds)  # work inside the attempt's transaction
            marks["end"] = time.perf_counter()
            return seconds

        @sv.workflow(name="bench.txwait.flow")
        def flow(ctx: sv.WorkflowContext, seconds: float) -> float:
            return body.execute(ctx, seconds)

        @sv.workflow(name="bench.txwait.inbox")
        def inbox(ctx: sv.WorkflowContext, _: Any) -> None:
            ctx.receive("never")  # parks; the signals on "web" pile up in its inbox

        rows = []
        with Worker():
            for seconds in bodies:
                target = sv.start_workflow(inbox, None)
                sv.signal(target, "web", "warm-up")
                body_started.clear()
                marks.clear()
                calls: list[tuple[float, float, bool]] = []
                stop = threading.Event()

                def web_requests(
                    target: str = target, calls: list[Any] = calls, stop: threading.Event = stop
                ) -> None:
                    n = 0
                    while not stop.is_set():
                        began = time.perf_counter()
                        try:
                            sv.signal(target, "web", n)
                            ok = True
                        except OperationalError:
                            ok = False
                        calls.append((began, time.perf_counter() - began, ok))
                        n += 1
                        stop.wait(SIGNAL_EVERY)
                    connections.close_all()

                thread = threading.Thread(target=web_requests, daemon=True)
                thread.start()
                instance_id = sv.start_workflow(flow, seconds)
                result = sv.wait_workflow(instance_id, timeout=seconds * 10 + 60)
                time.sleep(0.2)  # a few more calls after the commit
                stop.set()
                thread.join(60)
                start, end = marks.get("start", 0.0), marks.get("end", 0.0)
                # Every call that was in flight at some moment of the body.
                during = [(w, ok) for began, w, ok in calls if began <= end and began + w >= start]
                waits = [w for w, ok in during if ok]
                rows.append(
                    {
                        "body": seconds,
                        "status": result.status,
                        "signals": len(during),
                        "p50_ms": statistics.median(waits) * 1000 if waits else None,
                        "max_ms": max(w for w, _ in during) * 1000 if during else None,
                        "locked": sum(1 for _, ok in during if not ok),
                    }
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--bodies", type=float, nargs="+", default=[0.1, 0.5, 2.0, 5.0])
    parser.add_argument(
        "--busy-timeout", type=float, default=None, help="SQLite busy timeout, seconds"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.db, args.bodies, args.busy_timeout)))
        return 0
    databases = ["sqlite", "postgres"] if args.db == "all" else [args.db]
    for db in databases:
        command = [sys.executable, __file__, "--child", "--db", db, "--bodies"]
        command += [str(b) for b in args.bodies]
        if args.busy_timeout is not None:
            command += ["--busy-timeout", str(args.busy_timeout)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=str(REPO_ROOT))
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return done.returncode
        rows = json.loads(done.stdout.strip().splitlines()[-1])
        timeout = f", busy timeout {args.busy_timeout:g} s" if args.busy_timeout else ""
        print(f"== {db}{timeout}: sv.signal() to another instance during a transactional body ==")
        header = ("body", "outcome", "signals", "p50 wait", "max wait", "locked")
        print("  {:>7}  {:>9}  {:>7}  {:>10}  {:>10}  {:>6}".format(*header))
        for row in rows:
            p50 = "-" if row["p50_ms"] is None else f"{row['p50_ms']:.1f} ms"
            longest = "-" if row["max_ms"] is None else f"{row['max_ms']:.1f} ms"
            print(
                f"  {row['body']:>6g}s  {row['status']:>9}  {row['signals']:>7}  {p50:>10}"
                f"  {longest:>10}  {row['locked']:>6}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
