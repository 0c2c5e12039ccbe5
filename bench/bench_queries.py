#!/usr/bin/env python
"""Query benchmark: ``sv.query()`` latency against history length, per database.

    python bench/bench_queries.py [--db sqlite|postgres|all] [--lengths 100,1000,10000]
                                  [--seconds S]

A query takes one snapshot of the instance (``export_history``: the instance
row, its history and its signal positions), replays the registered workflow
code read-only from the start and runs the handler where replay stops. It
therefore costs one full replay: this script measures how that grows with the
number of recorded events.

For each length N one instance of ``bench.q.history`` records N commands (three
``ctx.now()`` for every inline activity: one history row each) and parks on a
receive (rows copied from a live instance, see ``build``). Then
``sv.query(id, "steps")`` runs repeatedly for about ``--seconds``
(at least 5 times) after one warm-up query; every answer is checked (N). The
two halves of a query are also timed on their own: the snapshot read
(``export_history``) and the replay (``replay_history`` of that snapshot).

See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402 - the repository root goes on the path first
    SqlCounter,
    bench_database,
    each_database,
    transactions,
)

DEFAULT_LENGTHS = (100, 1_000, 10_000)

# A lease long enough for the longest set-up, held by an execution driven from
# this thread (no renewer runs): the first dispatch replays N commands.
BUILD_LEASE = {"TTL": 3600, "RENEW_INTERVAL": 60, "MARGIN": 10, "MAX_SKEW": 1}


def define_workload() -> Any:
    """Register the benchmark's workflow and activity; return the workflow."""
    import selvedge_django as sv

    @sv.activity(name="bench.q.step")
    def step(i: int) -> int:
        return i

    @sv.workflow(name="bench.q.history")
    def history(ctx: sv.WorkflowContext, n: int) -> None:
        seen = {"steps": 0}
        ctx.set_query_handler("steps", lambda: seen["steps"])
        for i in range(n):
            if i % 4 == 3:
                step.execute(ctx, i)
            else:
                ctx.now()
            seen["steps"] += 1
        ctx.receive("go")

    return history


def record_live(workflow: Any, n: int) -> tuple[str, float]:
    """Run an instance of ``n`` commands through the engine; return its id and the time."""
    import selvedge_django as sv
    from selvedge_django.testing import run_until_idle
    from selvedge_django.worker import Worker

    t0 = time.perf_counter()
    instance_id = sv.start_workflow(workflow, n)
    run_until_idle(Worker(lease=BUILD_LEASE))
    return instance_id, time.perf_counter() - t0


def build(workflow: Any, n: int, template: list[Any]) -> tuple[str, float]:
    """Record an instance with ``n`` history events; return its id and the set-up time.

    Recording 10,000 commands one fenced transaction at a time takes minutes on a
    small machine, so the rows are copied from ``template`` (the four rows the
    engine recorded for a live instance: three ``now`` and one activity) with
    their positions, keys and activity results renumbered, and bulk-inserted.
    The instance is then dispatched once: the engine replays all ``n`` rows and
    parks on the receive, which proves they are the history it would have written.
    """
    import selvedge_django as sv
    from selvedge_django.models import HistoryEvent, WorkflowInstance
    from selvedge_django.testing import run_until_idle
    from selvedge_django.worker import Worker

    t0 = time.perf_counter()
    instance_id = sv.start_workflow(workflow, n)
    rows = []
    for i in range(n):
        like = template[i % len(template)]
        seq = i + 1
        rows.append(
            HistoryEvent(
                instance_id=instance_id,
                key=like.key.replace(f"#{like.seq}:", f"#{seq}:", 1),
                seq=seq,
                command=like.command,
                event_type=like.event_type,
                data=json.dumps(i) if like.command == "activity" else like.data,
                reservation=like.reservation,
                delivered_seq=like.delivered_seq,
                arrived_at=like.arrived_at,
            )
        )
    HistoryEvent.objects.bulk_create(rows, batch_size=1000)
    run_until_idle(Worker(lease=BUILD_LEASE))
    elapsed = time.perf_counter() - t0
    count = HistoryEvent.objects.filter(instance_id=instance_id).count()
    inst = WorkflowInstance.objects.get(instance_id=instance_id)
    if count != n or inst.status != "running" or inst.lease_owner or inst.lease_epoch != 1:
        raise RuntimeError(f"{instance_id}: {count} rows, {inst.status}, {inst.lease_owner!r}")
    return instance_id, elapsed


def template_rows(workflow: Any) -> list[Any]:
    """The rows the engine records for four commands, checked against a copied instance."""
    from selvedge_django.models import HistoryEvent

    def shape(instance_id: str) -> list[tuple[Any, ...]]:
        return [
            (r.seq, r.key, r.command, r.event_type, r.reservation, r.delivered_seq)
            + ((r.data,) if r.command == "activity" else ())
            for r in HistoryEvent.objects.filter(instance_id=instance_id).order_by("seq")
        ]

    live, _ = record_live(workflow, 8)
    template = list(HistoryEvent.objects.filter(instance_id=live).order_by("seq")[:4])
    copied, _ = build(workflow, 8, template)
    if shape(copied) != shape(live):
        raise RuntimeError(f"copied rows differ from the engine's: {shape(copied)} {shape(live)}")
    return template


def timed(fn: Callable[[], Any], seconds: float, check: Callable[[Any], None]) -> list[float]:
    """Run ``fn`` once to warm up, then for about ``seconds`` (at least 5 times)."""
    check(fn())
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < 5 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        value = fn()
        samples.append(time.perf_counter() - t0)
        check(value)
    return samples


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def measure(
    workflow: Any, n: int, seconds: float, counter: SqlCounter, template: list[Any]
) -> dict[str, Any]:
    import selvedge_django as sv

    instance_id, build_seconds = build(workflow, n, template)

    def answer_is_n(value: Any) -> None:
        if value != n:
            raise RuntimeError(f"query answered {value!r}, expected {n}")

    query = timed(lambda: sv.query(instance_id, "steps"), seconds, answer_is_n)
    counter.reset()
    sv.query(instance_id, "steps")
    counts, _, _ = counter.snapshot()
    statements = sum(c["queries"] for c in counts.values())
    txs = sum(transactions(c) for c in counts.values())

    export = timed(lambda: sv.export_history(instance_id), seconds / 2, lambda h: None)
    history = sv.export_history(instance_id)
    replay = timed(lambda: sv.replay_history(history), seconds / 2, lambda _: None)
    return {
        "n": n,
        "build": build_seconds,
        "query": query,
        "export": export,
        "replay": replay,
        "statements": statements,
        "transactions": txs,
    }


def print_results(rows: list[dict[str, Any]]) -> None:
    print("Query latency by history length (milliseconds over the runs)")
    print(
        f"  {'events':>7}{'runs':>6}{'query min':>11}{'p50':>9}{'p95':>9}{'p50/event':>11}"
        f"{'snapshot p50':>14}{'replay p50':>12}{'statements':>12}{'set-up':>9}"
    )
    for row in rows:
        q = statistics.median(row["query"]) * 1000
        print(
            f"  {row['n']:>7,}{len(row['query']):>6}{min(row['query']) * 1000:>11.2f}"
            f"{q:>9.2f}{p95(row['query']) * 1000:>9.2f}{q * 1000 / row['n']:>9.1f}us"
            f"{statistics.median(row['export']) * 1000:>14.2f}"
            f"{statistics.median(row['replay']) * 1000:>12.2f}"
            f"{row['statements']:>7} in {row['transactions']}"
            f"{row['build']:>8.1f}s"
        )
    print(
        "  (snapshot: export_history alone; replay: replay_history of that snapshot alone;\n"
        "   statements: SQL statements of one query, in so many transactions;\n"
        "   set-up: writing the rows and the first dispatch)"
    )


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


def run_one(db: str, lengths: list[int], seconds: float) -> None:
    # A database name of its own, so this can run next to the other benchmarks.
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_queries_{os.getpid()}")
    with bench_database(db) as info:
        import django

        import selvedge_django

        workflow = define_workload()
        counter = SqlCounter()
        counter.install()
        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django {getattr(selvedge_django, '__version__', '?')} "
            f"(git {_git_revision()}), "
            f"Django {django.get_version()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs"
        )
        print(
            "Workload: a running instance of N recorded commands (3 ctx.now() for every "
            "inline activity), parked on a receive; the handler returns a local counter"
        )
        print()
        template = template_rows(workflow)
        rows = [measure(workflow, n, seconds, counter, template) for n in lengths]
        print_results(rows)
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument(
        "--lengths",
        default=",".join(str(n) for n in DEFAULT_LENGTHS),
        help="comma-separated history lengths (default 100,1000,10000)",
    )
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="time spent querying per length (default 2)"
    )
    args = parser.parse_args(argv)
    try:
        lengths = [int(part) for part in args.lengths.split(",") if part.strip()]
    except ValueError:
        parser.error("--lengths takes comma-separated integers")
    if not lengths or min(lengths) < 1:
        parser.error("--lengths must be positive")
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    if args.db != "all":
        run_one(args.db, lengths, args.seconds)
        return 0
    return each_database(__file__, ["--lengths", args.lengths, "--seconds", str(args.seconds)])


if __name__ == "__main__":
    sys.exit(main())
