#!/usr/bin/env python
"""Where the time of one in-process start-to-result goes: a statement timeline.

    python bench/trace_latency.py [--db postgres|sqlite] [--samples N] [--signal]
                                  [--no-trace] [--yappi PATH]

Starts a ``Worker`` in this process, runs N one-activity workflows one at a time
(``start_workflow`` then ``wait_workflow``, as the latency case of
``bench_scale.py``), and prints:

* p50 / p95 of the samples, and the process CPU time per workflow (every thread,
  client and worker: ``time.process_time()`` over the run);
* the timeline of the median sample and of the slowest: every statement and
  commit, with its start (ms from the start call), its duration and its thread.

``--signal`` measures signal-to-wake instead (a workflow blocked in
``ctx.receive``; the timeline runs from the ``sv.signal`` call). ``--no-trace``
leaves the statement hooks out (their own cost is about a tenth of a
millisecond per statement), for the CPU and percentile figures alone.
``--yappi PATH`` also profiles every thread's CPU with yappi (``pip install
yappi``; it slows everything several times, so read its proportions, not its
times) and writes the functions by total time to PATH.

This is the harness the optimisation notes in bench/README.md quote. Nothing
here is a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_scale import wait_for  # noqa: E402 - the repository root goes first
from bench.harness import bench_database  # noqa: E402

Event = tuple[float, float, str, str]


class Timeline:
    """Statements and commits of every connection, with their thread and timing."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def _add(self, started: float, sql: str) -> None:
        event = (started, time.perf_counter(), threading.current_thread().name, sql)
        with self._lock:
            self.events.append(event)

    def _wrapper(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self._add(started, " ".join(sql.split())[:100])

    def instrument(self, conn: Any) -> None:
        conn.execute_wrappers.append(self._wrapper)
        commit = conn.commit

        def timed_commit() -> None:
            started = time.perf_counter()
            commit()
            self._add(started, "COMMIT")

        conn.commit = timed_commit

    def take(self) -> list[Event]:
        with self._lock:
            events, self.events = self.events, []
        return events


def one_start(x: int) -> float:
    import selvedge_django as sv

    started = time.perf_counter()
    instance_id = sv.start_workflow("bench.scale.one_step", x)
    result = sv.wait_workflow(instance_id, timeout=60)
    if result.status != "completed" or result.output != x + 1:
        raise RuntimeError(f"{instance_id}: {result.status} {result.error!r}")
    return started


def one_signal(x: int) -> float:
    import selvedge_django as sv
    from selvedge_django.models import WorkflowInstance

    instance_id = sv.start_workflow("bench.scale.signal_wake", None)
    suspended = WorkflowInstance.objects.filter(
        instance_id=instance_id, lease_epoch__gte=1, lease_owner="", runnable=False
    )
    wait_for(suspended.exists, timeout=60, interval=0.002)
    time.sleep(0.02)  # the worker's threads are idle again
    started = time.perf_counter()
    sv.signal(instance_id, "go", x)
    result = sv.wait_workflow(instance_id, timeout=60)
    if result.status != "completed":
        raise RuntimeError(f"{instance_id}: {result.status} {result.error!r}")
    return started


def print_timeline(label: str, took: float, started: float, events: list[Event]) -> None:
    print(f"\n{label}: {took * 1000:.2f} ms")
    print(f"  {'start ms':>8} {'took ms':>8}  {'thread':<22} statement")
    for begin, end, thread, sql in sorted(events):
        at, took_ms = (begin - started) * 1000, (end - begin) * 1000
        print(f"  {at:8.2f} {took_ms:8.2f}  {thread[:22]:<22} {sql}")


def run(args: argparse.Namespace) -> None:
    from django.db import connections
    from django.db.backends.signals import connection_created

    import bench.workloads  # noqa: F401 - registers the workflows
    from selvedge_django.storage.postgresql.listener import stop_listeners
    from selvedge_django.worker import Worker

    timeline = Timeline()
    if args.trace:
        connection_created.connect(
            lambda sender, connection, **kw: timeline.instrument(connection), weak=False
        )
        connections.close_all()  # this thread reconnects, instrumented
    case: Callable[[int], float] = one_signal if args.signal else one_start
    worker = Worker(worker_id=f"bench-trace-{os.getpid()}").start()
    profiler: Any = None
    try:
        for x in range(args.warmup):
            case(x)
        if args.yappi:
            import yappi

            yappi.set_clock_type("cpu")
            yappi.start()
        samples: list[tuple[float, float, list[Event]]] = []
        cpu = time.process_time()
        for x in range(args.samples):
            timeline.take()
            started = case(x)
            took = time.perf_counter() - started
            samples.append((took, started, timeline.take()))
        cpu = time.process_time() - cpu
        if args.yappi:
            profiler = yappi
            yappi.stop()
    finally:
        worker.stop(timeout=30)
        stop_listeners()
    ordered = sorted(samples, key=lambda s: s[0])
    times = [s[0] for s in ordered]
    what = (
        "signal-to-result, workflow blocked in receive"
        if args.signal
        else "start-to-result, one-activity workflow"
    )
    print(
        f"{what}, worker in this process, {args.samples} samples: "
        f"p50 {statistics.median(times) * 1000:.2f} ms, "
        f"p95 {times[min(len(times) - 1, round(0.95 * len(times)) - 1)] * 1000:.2f} ms; "
        f"CPU {cpu / args.samples * 1000:.2f} ms per workflow (all threads)"
    )
    if args.trace:
        median = ordered[len(ordered) // 2]
        print_timeline("median sample", *median)
        print_timeline("slowest sample", *ordered[-1])
    if profiler is not None:
        stats = profiler.get_func_stats()
        stats.sort("ttot")
        with open(args.yappi, "w") as out:
            stats.print_all(
                out=out,
                columns={0: ("name", 100), 1: ("ncall", 10), 2: ("tsub", 8), 3: ("ttot", 8)},
            )
        print(f"\nyappi: functions by total CPU time written to {args.yappi}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--signal", action="store_true", help="signal-to-wake instead")
    parser.add_argument("--no-trace", dest="trace", action="store_false")
    parser.add_argument("--yappi", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_trace_{os.getpid()}")
    with bench_database(args.db):
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
