#!/usr/bin/env python
"""An entity workflow receiving signals one by one: total worker CPU, with and without the cache.

    python bench/bench_entity.py [--db sqlite|postgres|all] [--counts 1000,10000]
                                 [--cache on|off|both]

The worker has the settings of the README's five-minute section and nothing else
(``MAX_POLL_INTERVAL`` 2; on SQLite the ``IMMEDIATE`` transaction mode of
bench/settings.py): "on" is the default workflow cache, "off" sets
``WORKFLOW_CACHE["MAX_ENTRIES"]`` to 0.

One in-process ``Worker`` runs a workflow that calls ``ctx.receive("s")`` ``n``
times. The sender sends the next signal only once the execution has suspended
again (the ``on_workflow_suspended`` hook), so every signal costs one resumption:
without the workflow cache each one replays the whole history so far (O(n^2) in
total), with it the parked execution goes on (O(n)). The CPU counted is the
process's minus the sending thread's (``time.process_time()`` and
``time.thread_time()``): the worker's loops and executions, SQLite included, the
PostgreSQL server not. The last lines print the CPU of the largest count over the
smallest's, per mode: the goal is at most 12x for 10,000 over 1,000 with the cache.

See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import os
import platform
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

# The README's five-minute settings: SELVEDGE = {"MAX_POLL_INTERVAL": 2}.
README_SETTINGS: dict[str, Any] = {"max_poll_interval": 2}
OFF = {"MAX_ENTRIES": 0}


class _Suspensions:
    """Counts the executions that suspended (a hook on the worker's threads)."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def on_workflow_suspended(self, event: Any) -> None:
        with self.changed:
            self.count += 1
            self.changed.notify_all()

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: self.count >= count, timeout):
                raise RuntimeError(f"the workflow did not suspend {count} times")


def define_workload() -> Any:
    """Register the benchmark's workflow: receive ``n`` signals one at a time, add them up."""
    import selvedge_django as sv

    @sv.workflow(name="bench.entity")
    def entity(ctx: sv.WorkflowContext, n: int) -> int:
        total = 0
        for _ in range(n):
            total += ctx.receive("s")
        return total

    return entity


def one_run(workflow: Any, n: int, cache: bool) -> tuple[float, float, dict[str, int]]:
    """Return (worker CPU seconds, wall seconds, cache counters) of one n-signal run."""
    import selvedge_django as sv
    from selvedge_django.worker import Worker

    hooks = _Suspensions()
    overrides = dict(README_SETTINGS) if cache else {**README_SETTINGS, "workflow_cache": OFF}
    worker = Worker(hooks=hooks, **overrides)
    worker.start()
    try:
        wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        instance_id = sv.start_workflow(workflow, n)
        for i in range(n):
            hooks.wait_for(i + 1)
            sv.signal(instance_id, "s", 1)
        result = sv.wait_workflow(instance_id, timeout=120)
        worker_cpu = (time.process_time() - cpu) - (time.thread_time() - thread)
        wall = time.perf_counter() - wall
        if result.status != "completed" or result.output != n:
            raise RuntimeError(f"{instance_id}: {result.status} {result.output!r} {result.error!r}")
        return worker_cpu, wall, worker.workflow_cache_stats()
    finally:
        worker.stop(timeout=10)


def run_one(db: str, counts: list[int], modes: list[bool]) -> None:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_entity_{os.getpid()}")
    with bench_database(db) as info:
        import django

        import selvedge_django

        workflow = define_workload()
        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django {getattr(selvedge_django, '__version__', '?')} "
            f"(git {_git_revision()}), Django {django.get_version()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
        )
        one_run(workflow, 20, True)  # warm-up: connections, imports, statement caches
        table: dict[tuple[bool, int], float] = {}
        print(f"  {'cache':<6} {'signals':>8} {'worker CPU':>12} {'wall':>10} {'hits':>8}")
        for cache in modes:
            for n in counts:
                cpu, wall, stats = one_run(workflow, n, cache)
                table[(cache, n)] = cpu
                label = "on" if cache else "off"
                print(
                    f"  {label:<6} {n:>8} {cpu:>10.2f} s {wall:>8.2f} s {stats['hits']:>8}",
                    flush=True,
                )
        low, high = min(counts), max(counts)
        for cache in modes:
            label = "on" if cache else "off"
            ratio = table[(cache, high)] / table[(cache, low)]
            print(f"  cache {label}: CPU({high}) / CPU({low}) = {ratio:.1f}x")
        from selvedge_django.storage.postgresql.listener import stop_listeners

        stop_listeners()
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--counts", default="1000,10000", help="signal counts, comma-separated")
    parser.add_argument("--cache", choices=("on", "off", "both"), default="on")
    args = parser.parse_args(argv)
    try:
        counts = sorted({int(part) for part in args.counts.split(",")})
    except ValueError:
        parser.error("--counts must be comma-separated integers")
    if len(counts) < 2 or counts[0] < 1:
        parser.error("--counts needs two or more positive counts")
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.cache]
    if args.db != "all":
        run_one(args.db, counts, modes)
        return 0
    return each_database(__file__, ["--counts", args.counts, "--cache", args.cache])


if __name__ == "__main__":
    sys.exit(main())
