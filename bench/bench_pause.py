#!/usr/bin/env python
"""Pausing at scale: a bulk pause by filter, and what held work costs the claims and dispatch.

    python bench/bench_pause.py [--db postgres|sqlite] [--instances N] [--peer M]

Creates N running instances of one workflow, each parked with a queued activity
task and an armed timer (rows written directly, as a backlog looks), then:

1. pauses them all with ``runselvedge pause --workflow NAME`` (ids read in batches
   of 100, each instance paused in its own transaction) and prints the time, the
   rate, the batches and the most instances one transaction touched; then the
   peer in the same run: ``runselvedge terminate --workflow`` over M other such
   instances, the bulk operation a pause is meant to spare;
2. times a claim of 10 tasks and a dispatch of 10 instances with the N paused
   instances' tasks held and instances paused, against the same with none of
   them (deleted): the ratio is what held work costs each claim and dispatch.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_core import _git_revision  # noqa: E402 - the repository root goes on the path first
from bench.harness import bench_database  # noqa: E402

PAUSED = "bench.pause.parked"
PEER = "bench.pause.peer"
FREE = "bench.pause.free"


def backlog(workflow: str, count: int, *, runnable: bool = False, offset: int = 0) -> None:
    """``count`` running instances of ``workflow``, each with a queued task and a timer."""
    from django.utils import timezone

    from selvedge_django.models import ActivityTask, TimerSubscription, WorkflowInstance

    now = timezone.now()
    ids = [f"{workflow}-{offset + n:06d}" for n in range(count)]
    WorkflowInstance.objects.bulk_create(
        [
            WorkflowInstance(
                instance_id=iid,
                workflow_name=workflow,
                status="running",
                runnable=runnable,
                ready_ms=1_000 + n,
                started_at=now,
                updated_at=now,
                lease_epoch=1,
            )
            for n, iid in enumerate(ids)
        ],
        batch_size=1000,
    )
    ActivityTask.objects.bulk_create(
        [
            ActivityTask(
                instance_id=iid,
                workflow_name=workflow,
                key="#1:bench.act",
                seq=1,
                name="bench.act",
                input="null",
                status="queued",
                not_before_ms=1_000 + n,
            )
            for n, iid in enumerate(ids)
        ],
        batch_size=1000,
    )
    TimerSubscription.objects.bulk_create(
        [
            TimerSubscription(
                instance_id=iid, key="#2:t", expires_at=now, fire_at_ms=4_000_000_000_000
            )
            for iid in ids
        ],
        batch_size=1000,
    )


def timed(run: Any, repeat: int = 20) -> float:
    """The median time of ``run()`` in ms."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return times[len(times) // 2]


def command(*args: str) -> tuple[float, str]:
    from django.core.management import call_command

    out = io.StringIO()
    start = time.perf_counter()
    call_command("runselvedge", *args, stdout=out, stderr=io.StringIO())
    return time.perf_counter() - start, out.getvalue()


def run(db: str, count: int, peer: int) -> int:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_pause_{os.getpid()}")
    with bench_database(db) as info:
        import django
        from django.db import connection

        from selvedge_django.conf import get_settings
        from selvedge_django.engine.codec import Codec
        from selvedge_django.models import ActivityTask, WorkflowInstance
        from selvedge_django.operations.recovery import MAX_SELECTION_BATCH
        from selvedge_django.storage import store_for

        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django (git {_git_revision()}), Django {django.get_version()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
        )
        backlog(PAUSED, count, runnable=True)
        backlog(PEER, peer)
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")

        took, out = command("pause", "--workflow", PAUSED, "--reason", "bench")
        paused = WorkflowInstance.objects.filter(workflow_name=PAUSED, lease_owner="$paused")
        held = ActivityTask.objects.filter(workflow_name=PAUSED, held=True).count()
        print(
            f"bulk pause of {count} instances by filter: {took:.1f} s ({count / took:.0f}/s),"
            f" {-(-count // MAX_SELECTION_BATCH)} id batches of at most {MAX_SELECTION_BATCH},"
            f" one instance (its row, 1 task, 1 timer) per transaction;"
            f" paused {paused.count()}, tasks held {held}; last line: {out.splitlines()[-1]!r}"
        )
        took_peer, _ = command("terminate", "--workflow", PEER, "--reason", "bench")
        print(
            f"peer, bulk terminate of {peer}: {took_peer:.1f} s ({peer / took_peer:.0f}/s);"
            f" pause per instance / terminate per instance:"
            f" {(took / count) / (took_peer / peer):.2f}"
        )
        took_again, out = command("pause", "--workflow", PAUSED)
        print(f"bulk pause again (nothing left): {took_again:.2f} s, {out.strip()!r}")

        # Claims and dispatch with the held work ahead of 10 free instances and tasks in
        # their index order (due and ready, after every held task and paused instance).
        backlog(FREE, 10, runnable=True)
        ActivityTask.objects.filter(workflow_name=FREE).update(not_before_ms=10**7)
        WorkflowInstance.objects.filter(workflow_name=FREE).update(ready_ms=10**7)
        store = store_for("default", Codec(), get_settings())
        names = ["bench.act"]

        def claim_pick() -> None:
            # The claim's candidates (the statement that walks the rank index).
            rows = store.db._fetch(*store.limits._claim_pick(names, 10))
            assert len(rows) == 10, rows

        def dispatch() -> None:
            leased = store.instances.lease_batch("w", 30, 10, [FREE, PAUSED])
            assert len(leased) == 10, leased
            free = WorkflowInstance.objects.filter(workflow_name=FREE)
            free.update(lease_owner="", lease_expires_ms=None, runnable=True)

        def dispatch_only() -> float:
            times = []
            for _ in range(20):
                start = time.perf_counter()
                dispatch()
                times.append((time.perf_counter() - start) * 1000)
            return sorted(times)[10]

        with_held = (timed(claim_pick), dispatch_only())
        WorkflowInstance.objects.filter(workflow_name=PAUSED).delete()
        without = (timed(claim_pick), dispatch_only())
        print(
            f"claim candidates (10): {with_held[0]:.2f} ms with {count} held tasks queued first,"
            f" {without[0]:.2f} ms without (ratio {with_held[0] / without[0]:.2f})"
        )
        print(
            f"dispatch of 10 instances (and a reset): {with_held[1]:.2f} ms with {count} paused"
            f" runnable"
            f" instances, {without[1]:.2f} ms without (ratio {with_held[1] / without[1]:.2f})"
        )
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--instances", type=int, default=10_000, metavar="N")
    parser.add_argument("--peer", type=int, default=2_000, metavar="M")
    args = parser.parse_args(argv)
    if args.instances < 1 or args.peer < 1:
        parser.error("--instances and --peer must be at least 1")
    return run(args.db, args.instances, args.peer)


if __name__ == "__main__":
    sys.exit(main())
