#!/usr/bin/env python
"""Signal-to-wake latency: from ``sv.signal()`` to the workflow observing the payload.

    python bench/bench_signals.py [--db sqlite|postgres|all] [--signals N] [--settle MS]

One in-process ``Worker`` with the project's default settings runs a workflow
that waits in ``ctx.receive("ping")``. Each sample starts a fresh instance,
waits until it is parked (dispatched once, unleased, not runnable), lets the
worker go idle for ``--settle`` milliseconds, then sends one signal. The
latency runs from just before ``sv.signal()`` to the moment workflow code gets
the payload back from ``ctx.receive()`` (the consumption has committed by
then), read with ``time.perf_counter()`` on both sides: the worker runs in this
process. It covers the signal's commit, the after-commit wake-up, the lease,
the history load, the replay and the fenced consumption.

See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_core import _git_revision  # noqa: E402 - the repository root goes on the path first
from bench.harness import bench_database, each_database  # noqa: E402

WARM_UP = 5

# Filled by the workflow on the worker's thread, read by the sender.
_observed: dict[str, float] = {}
_events: dict[str, threading.Event] = {}


def define_workload() -> Any:
    """Register the benchmark's workflow: receive one "ping" and note when it arrived."""
    import selvedge_django as sv

    @sv.workflow(name="bench.wait_for_ping")
    def wait_for_ping(ctx: sv.WorkflowContext, key: str) -> str:
        payload = ctx.receive("ping")
        if not ctx.is_replaying:
            _observed[payload] = time.perf_counter()
            _events[payload].set()
        return str(payload)

    return wait_for_ping


def _parked(instance_id: str) -> bool:
    from selvedge_django.models import WorkflowInstance

    return WorkflowInstance.objects.filter(
        instance_id=instance_id,
        status="running",
        lease_owner="",
        runnable=False,
        lease_epoch__gte=1,
    ).exists()


def one_sample(workflow: Any, key: str, settle: float) -> tuple[float, float]:
    """Return (signal-to-observation latency, duration of the signal call) in seconds."""
    import selvedge_django as sv

    instance_id = sv.start_workflow(workflow, key)
    deadline = time.monotonic() + 30
    while not _parked(instance_id):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{instance_id} never parked in receive()")
        time.sleep(0.001)
    time.sleep(settle)  # let the worker's loops go idle: the signal finds a quiet worker
    _events[key] = threading.Event()
    sent = time.perf_counter()
    sv.signal(instance_id, "ping", key)
    returned = time.perf_counter()
    if not _events[key].wait(30):
        raise RuntimeError(f"{instance_id} never observed its signal")
    result = sv.wait_workflow(instance_id, timeout=30)
    if result.status != "completed" or result.output != key:
        raise RuntimeError(f"{instance_id}: {result.status} {result.output!r} {result.error!r}")
    return _observed[key] - sent, returned - sent


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def summarise(label: str, values: list[float]) -> None:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    print(
        f"  {label:<28} p50 {_ms(cuts[49])}   p95 {_ms(cuts[94])}   "
        f"p99 {_ms(cuts[98])}   min {_ms(min(values))}   max {_ms(max(values))}"
    )


def run_one(db: str, n: int, settle_ms: float) -> None:
    # A database of its own, so this can run next to bench_core.py on one server.
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_signals_{os.getpid()}")
    with bench_database(db) as info:
        import django

        import selvedge_django
        from selvedge_django.worker import Worker

        workflow = define_workload()
        worker = Worker()
        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django {getattr(selvedge_django, '__version__', '?')} "
            f"(git {_git_revision()}), "
            f"Django {django.get_version()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs"
        )
        cfg = worker.settings
        print(
            f"One in-process Worker, default settings (listen_notify={cfg.listen_notify}, "
            f"workflow_resumption_interval={cfg.workflow_resumption_interval:g} s); "
            f"{n} signals after {WARM_UP} warm-up ones, each to a fresh parked instance "
            f"after {settle_ms:g} ms of idling"
        )
        worker.start()
        try:
            settle = settle_ms / 1000
            for i in range(WARM_UP):
                one_sample(workflow, f"warm-{i}", settle)
            latencies: list[float] = []
            calls: list[float] = []
            for i in range(n):
                latency, call = one_sample(workflow, f"ping-{i}", settle)
                latencies.append(latency)
                calls.append(call)
        finally:
            worker.stop(timeout=10)
            from selvedge_django.storage.postgresql.listener import stop_listeners

            stop_listeners()  # wait_workflow's LISTEN connection, before the database goes
        summarise("signal -> workflow observes", latencies)
        summarise("sv.signal() call alone", calls)
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--signals", type=int, default=200, metavar="N")
    parser.add_argument(
        "--settle", type=float, default=20.0, metavar="MS", help="idle time before each signal"
    )
    args = parser.parse_args(argv)
    if args.signals < 2:
        parser.error("--signals must be at least 2")
    if args.settle < 0:
        parser.error("--settle must not be negative")
    if args.db != "all":
        run_one(args.db, args.signals, args.settle)
        return 0
    return each_database(__file__, ["--signals", str(args.signals), "--settle", str(args.settle)])


if __name__ == "__main__":
    sys.exit(main())
