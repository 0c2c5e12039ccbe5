#!/usr/bin/env python
"""Core benchmark: SQL per durable operation, and worker throughput, per database.

    python bench/bench_core.py [--db sqlite|postgres|all] [--workflows N] [--sql] [--futures]
    python bench/bench_core.py --background [--db ...] [--workflows N] [--steps S]

The workload is one workflow of three trivial activities run with
``act.execute(ctx, x)`` (the inline path: reserve and claim in one transaction,
run on the workflow thread, complete). With ``--futures`` it is instead one
workflow that issues ten trivial activities with ``act.execute_async(ctx, x)``
and then calls ``get()`` on each future: ten reservations, then activity
workers and the workflow's own inline ``get()`` attempts run them
concurrently. Two measurements per database:

1. Statements and transactions per workflow and per phase (start, dispatch,
   activity step, close), counted on every connection of every thread while N
   workflows run one after another, each dispatched and run inline. These
   figures do not depend on the machine.
2. Throughput: N workflows started up front, then one in-process ``Worker``
   with the default settings; the clock runs from the first start to the last
   close (the latest ``closed_at``).

With ``--background`` the activities run on a second worker instead of the
workflow's thread (``bench/background.py`` says how): statements and
transactions per background step by store method, idle polls included, and the
throughput of such workflows.

See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402 - the repository root goes on the path first
    UNTRACKED,
    SqlCounter,
    bench_database,
    each_database,
    store_classes,
    transactions,
)

ACTIVITIES_PER_WORKFLOW = 3
FUTURES_PER_WORKFLOW = 10

# Store methods and the phase of a workflow's life they belong to. Calls nested
# in another tracked method are charged to the outer one.
PHASES: dict[str, str] = {
    "create_instance": "start",
    "acquire_batch": "dispatch",
    "lease_batch": "dispatch",
    "acquire": "dispatch",
    "load_snapshot": "dispatch",
    "reserve_activity": "step",
    "claim_task": "step",
    "complete_task": "step",
    "fail_task": "step",
    "retry_task": "step",
    "get_row": "step",
    "close": "close",
    "release_lease": "close",
    # Other workflow commands: this workload issues none of them.
    "record_command": "other commands",
    "reserve_timer": "other commands",
    "timer_fired": "other commands",
    "observe": "other commands",
    "start_child": "other commands",
    "next_signal": "other commands",
    "signal_payload": "other commands",
    "arrivals": "other commands",
    "cancel_state": "other commands",
    # The worker's loops when they find nothing to do, renewals and leader duties.
    "claim_tasks": "polling",
    "next_task_due_ms": "polling",
    "renew_lease": "polling",
    "renew_leases": "polling",
    "renew_task": "polling",
    "renew_claims": "polling",
    "release_task": "polling",
    "claim_alive": "polling",
    "now_ms": "polling",
    "fire_due_timers": "polling",
    "next_timer_due_ms": "polling",
    "try_lock": "polling",
    "unlock": "polling",
    "lock_owner": "polling",
    "sweep_activity_timeouts": "polling",
    # Client calls.
    "get_instance": "client",
    "list_tasks": "client",
    "append_signal": "client",
    "request_cancel": "client",
}


def phase_rows(steps: int) -> tuple[tuple[str, str, int], ...]:
    """The phases of part 1: (phase, label, how many per workflow)."""
    return (
        ("start", "start (start_workflow)", 1),
        ("dispatch", "dispatch (lease + history load)", 1),
        ("step", "activity step (per step)", steps),
        ("close", "close", 1),
    )


@dataclass(frozen=True)
class Workload:
    """One benchmarked workflow: its definition, its activity steps and its expected output."""

    workflow: Any
    steps: int
    description: str
    expected: Callable[[int], Any]


def define_workload() -> Workload:
    """Register the benchmark's workflow and its three activities."""
    import selvedge_django as sv

    @sv.activity(name="bench.add_one")
    def add_one(x: int) -> int:
        return x + 1

    @sv.activity(name="bench.double")
    def double(x: int) -> int:
        return x * 2

    @sv.activity(name="bench.label")
    def label(x: int) -> str:
        return f"n={x}"

    @sv.workflow(name="bench.three_steps")
    def three_steps(ctx: sv.WorkflowContext, x: int) -> str:
        return label.execute(ctx, double.execute(ctx, add_one.execute(ctx, x)))

    return Workload(
        three_steps,
        ACTIVITIES_PER_WORKFLOW,
        f"{ACTIVITIES_PER_WORKFLOW} trivial activities per workflow, "
        "act.execute(ctx, x) (reserve + claim inline, run, complete)",
        expected_output,
    )


def expected_output(x: int) -> str:
    return f"n={(x + 1) * 2}"


def define_futures_workload() -> Workload:
    """Register the ``--futures`` workflow: ten futures issued serially, then awaited."""
    import selvedge_django as sv

    @sv.activity(name="bench.square")
    def square(x: int) -> int:
        return x * x

    @sv.workflow(name="bench.ten_futures")
    def ten_futures(ctx: sv.WorkflowContext, x: int) -> int:
        futures = [square.execute_async(ctx, x + i) for i in range(FUTURES_PER_WORKFLOW)]
        return sum(future.get(ctx) for future in futures)

    return Workload(
        ten_futures,
        FUTURES_PER_WORKFLOW,
        f"{FUTURES_PER_WORKFLOW} concurrent futures per workflow, act.execute_async(ctx, x) "
        "for each, then future.get(ctx) for each (claimed inline when still queued)",
        expected_futures_output,
    )


def expected_futures_output(x: int) -> int:
    return sum((x + i) ** 2 for i in range(FUTURES_PER_WORKFLOW))


# -- measurements -------------------------------------------------------------------


def by_phase(counts: dict[str, Counter[str]]) -> dict[str, Counter[str]]:
    phases: dict[str, Counter[str]] = {}
    for op, c in counts.items():
        phase = PHASES.get(op, "other" if op != UNTRACKED else UNTRACKED)
        phases.setdefault(phase, Counter()).update(c)
    return phases


def measure_counts(workload: Workload, counter: SqlCounter, n: int, trace: bool) -> dict[str, Any]:
    """Run ``n`` workflows one at a time, dispatched and run inline, counting SQL."""
    import selvedge_django as sv
    from selvedge_django.worker import Worker

    worker = Worker()  # never started: its loops are driven from this thread
    worker.resumptions.inline = True
    worker.activities.inline = True

    def one(x: int) -> str:
        instance_id = sv.start_workflow(workload.workflow, x)
        dispatched = worker.dispatcher.run_once()
        if dispatched != 1:
            raise RuntimeError(f"expected one dispatch, got {dispatched}")
        return instance_id

    one(-1)  # warm up: connection set-up and first-use caches are not counted
    counter.reset()
    if trace:
        counter.trace = []
        one(-2)
        trace_rows = counter.trace
        counter.trace = None
        counter.reset()
    t0 = time.perf_counter()
    ids = [(one(x), x) for x in range(n)]
    elapsed = time.perf_counter() - t0
    counts, calls, shapes = counter.snapshot()
    for instance_id, x in ids:
        result = sv.get_workflow_result(instance_id)
        if result.status != "completed" or result.output != workload.expected(x):
            raise RuntimeError(f"{instance_id}: {result.status} {result.output!r} {result.error!r}")
    return {
        "counts": counts,
        "calls": calls,
        "shapes": shapes,
        "trace": trace_rows if trace else None,
        "elapsed": elapsed,
    }


def measure_throughput(
    workload: Workload, counter: SqlCounter, n: int, overrides: dict[str, Any]
) -> dict[str, Any]:
    """Start ``n`` workflows, then let one in-process Worker run them all."""
    from django.db.models import Max
    from django.utils import timezone

    import selvedge_django as sv
    from selvedge_django.models import WorkflowInstance
    from selvedge_django.worker import Worker

    counter.reset()
    first_start = timezone.now()
    t0 = time.perf_counter()
    ids = [(sv.start_workflow(workload.workflow, x), x) for x in range(n)]
    starting = time.perf_counter() - t0
    worker = Worker(**overrides)
    worker_started = timezone.now()
    worker.start()
    try:
        for instance_id, x in ids:
            result = sv.wait_workflow(instance_id, timeout=120)
            if result.status != "completed" or result.output != workload.expected(x):
                raise RuntimeError(f"{instance_id}: {result.status} {result.error!r}")
    finally:
        worker.stop(timeout=10)
    counts, calls, _ = counter.snapshot()
    last_close = WorkflowInstance.objects.filter(
        instance_id__in=[instance_id for instance_id, _ in ids]
    ).aggregate(last=Max("closed_at"))["last"]
    return {
        "starting": starting,
        "elapsed": (last_close - first_start).total_seconds(),
        "draining": (last_close - worker_started).total_seconds(),
        "resumptions": worker.settings.max_concurrent_resumptions,
        "activities": worker.settings.max_concurrent_activities,
        "counts": counts,
        "calls": calls,
    }


# -- printing -----------------------------------------------------------------------

COLUMNS = ("queries", "savepoint", "commits", "autocommit", "transactions")


def _row(label: str, c: Counter[str], per: float, width: int = 34) -> str:
    values = [c["queries"], c["savepoint"], c["commits"], c["autocommit"], transactions(c)]
    cells = "".join(f"{v / per:>13.2f}" for v in values)
    return f"  {label:<{width}}{cells}"


def _header(width: int = 34) -> str:
    names = ("queries", "savepoints", "commits", "autocommit", "transactions")
    return f"  {'':<{width}}" + "".join(f"{name:>13}" for name in names)


def print_counts(result: dict[str, Any], n: int, steps: int) -> None:
    counts, calls, shapes = result["counts"], result["calls"], result["shapes"]
    phases = by_phase(counts)
    rows = phase_rows(steps)
    print(f"Statements and transactions, inline path (averaged over {n} workflows)")
    print(_header())
    total: Counter[str] = Counter()
    for phase, label, per_workflow in rows:
        c = phases.get(phase, Counter())
        total.update(c)
        print(_row(label, c, n * per_workflow))
    print(_row(f"workflow, start to close ({steps} steps)", total, n))
    leftover = {k: v for k, v in phases.items() if k not in {p for p, _, _ in rows}}
    for phase, c in sorted(leftover.items()):
        print(_row(f"not in a phase: {phase}", c, n))
    print()
    print("By store method (per workflow; statement shapes per call)")
    width = 18
    print(f"  {'method':<{width}}{'calls':>7}{'queries':>9}{'commits':>9}  statements per call")
    order = {op: i for i, op in enumerate(PHASES)}
    for op in sorted(counts, key=lambda op: order.get(op, len(order))):
        c = counts[op]
        ncalls = calls.get(op, 0)
        per_call = max(ncalls, 1)
        shape_text = ", ".join(
            f"{count / per_call:g}x {shape}" if count != per_call else shape
            for shape, count in shapes.get(op, Counter()).items()
        )
        print(
            f"  {op:<{width}}{ncalls / n:>7.2f}{c['queries'] / n:>9.2f}"
            f"{c['commits'] / n:>9.2f}  {shape_text}"
        )
    print(
        f"  (this run, one workflow at a time on one thread with counting on: "
        f"{n / result['elapsed']:.1f} workflows/s)"
    )


def print_trace(rows: list[tuple[str, str]]) -> None:
    print("SQL of one workflow, in order:")
    for op, sql in rows:
        text = " ".join(sql.split())
        print(f"  [{op}] {text[:200]}{'...' if len(text) > 200 else ''}")
    print()


def print_throughput(result: dict[str, Any], n: int, per_workflow: int) -> None:
    elapsed = result["elapsed"]
    steps = n * per_workflow
    print(
        f"Throughput: {n} workflows started up front, one in-process Worker "
        f"(max_concurrent_resumptions={result['resumptions']}, "
        f"max_concurrent_activities={result['activities']}, other settings at their defaults)"
    )
    print(
        f"  {n} starts                       {result['starting']:>8.2f} s  "
        f"({n / result['starting']:.0f} starts/s)"
    )
    print(f"  worker start -> last close       {result['draining']:>8.2f} s")
    print(f"  first start -> last close        {elapsed:>8.2f} s")
    print(f"  workflows/s                      {n / elapsed:>8.1f}")
    print(f"  activity steps/s                 {steps / elapsed:>8.1f}")
    phases = by_phase(result["counts"])
    print("  observed during this run, per workflow, all threads:")
    print(_header(32))
    shown = ("start", "dispatch", "step", "close", "other commands", "polling", "client", "other")
    for phase in (*shown, UNTRACKED):
        if phase in phases:
            label = {
                "step": f"activity steps (all {per_workflow})",
                "polling": "loops (idle, renewals, leader)",
                "client": "client reads (wait_workflow)",
            }.get(phase, phase)
            print(_row(label, phases[phase], n, 32))


def _git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def run_one(db: str, n: int, trace: bool, resumptions: int | None, futures: bool = False) -> None:
    with bench_database(db) as info:
        import django

        import selvedge_django

        workload = define_futures_workload() if futures else define_workload()
        counter = SqlCounter()
        for cls in store_classes():  # the store of the database, its database and parts
            counter.track(cls, PHASES)
        counter.install()

        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django {getattr(selvedge_django, '__version__', '?')} "
            f"(git {_git_revision()}), "
            f"Django {django.get_version()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs"
        )
        print(f"Workload: {workload.description}")
        print()
        counted = measure_counts(workload, counter, n, trace)
        if trace:
            print_trace(counted["trace"])
        print_counts(counted, n, workload.steps)
        print()
        overrides = {} if resumptions is None else {"max_concurrent_resumptions": resumptions}
        throughput = measure_throughput(workload, counter, n, overrides)
        print_throughput(throughput, n, workload.steps)
        print(flush=True)


def run_background(db: str, n: int, steps: int) -> None:
    """``--background``: the counts and throughput of background steps (bench/background.py)."""
    with bench_database(db) as info:
        from bench import background

        background.run(db, info, n, steps, throughput_n=min(n, background.THROUGHPUT_MAX))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--workflows", type=int, default=200, metavar="N")
    parser.add_argument(
        "--resumptions",
        type=int,
        metavar="N",
        help="max_concurrent_resumptions of the throughput Worker (default: the setting's default)",
    )
    parser.add_argument("--sql", action="store_true", help="print the SQL of one workflow")
    parser.add_argument(
        "--futures",
        action="store_true",
        help=f"benchmark {FUTURES_PER_WORKFLOW} concurrent futures per workflow instead",
    )
    parser.add_argument(
        "--background",
        action="store_true",
        help="benchmark background steps (activities run by a second worker) instead",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=ACTIVITIES_PER_WORKFLOW,
        metavar="S",
        help=f"background steps per workflow with --background (default {ACTIVITIES_PER_WORKFLOW})",
    )
    args = parser.parse_args(argv)
    if args.workflows < 1:
        parser.error("--workflows must be at least 1")
    if args.resumptions is not None and args.resumptions < 1:
        parser.error("--resumptions must be at least 1")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.background and args.db != "all":
        run_background(args.db, args.workflows, args.steps)
        return 0
    if args.db != "all":
        run_one(args.db, args.workflows, args.sql, args.resumptions, args.futures)
        return 0
    options = ["--workflows", str(args.workflows)] + (["--sql"] if args.sql else [])
    if args.resumptions is not None:
        options += ["--resumptions", str(args.resumptions)]
    if args.futures:
        options.append("--futures")
    if args.background:
        options += ["--background", "--steps", str(args.steps)]
    return each_database(__file__, options)


if __name__ == "__main__":
    sys.exit(main())
