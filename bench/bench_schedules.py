#!/usr/bin/env python
"""Schedules due together: how long the leader takes to start every slot's run.

    python bench/bench_schedules.py [--db postgres|sqlite] [--schedules N] [--execute]

Creates N interval schedules (every 60 s, ``sv.create_schedule``, timed) whose
next slot is the same minute, moves the database clock (as the testing clock
does) to that slot, and starts one in-process ``Worker``: its leader fires the
due schedules in batches of ``MAX_WORKFLOWS_PER_BATCH``, one transaction each.
The figure is the time from the slot to the commit of the last run's start,
read by polling the instance count every 50 ms; the goal is that all N start
within the minute. With ``--execute`` the worker also runs the workflows (a
no-op) and the time until all have completed is printed too.
"""

from __future__ import annotations

import argparse
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

NAME = "bench.scheduled"


def define_workload() -> Any:
    import selvedge_django as sv

    @sv.workflow(name=NAME)
    def scheduled(ctx: sv.WorkflowContext, n: int) -> int:
        return n

    return scheduled


def run(db: str, count: int, execute: bool) -> int:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_schedules_{os.getpid()}")
    with bench_database(db) as info:
        import django

        import selvedge_django as sv
        from selvedge_django.models import WorkflowInstance
        from selvedge_django.schedules import schedule_store
        from selvedge_django.storage import set_clock_offset_ms
        from selvedge_django.worker import Worker

        if execute:
            define_workload()
        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django (git {_git_revision()}), Django {django.get_version()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
        )
        store = schedule_store()
        now_ms = store.now_ms()
        slot_ms = (now_ms // 60_000 + 3) * 60_000  # a whole minute, a few minutes ahead
        from datetime import UTC, datetime

        slot = datetime.fromtimestamp(slot_ms / 1000, UTC)
        created = time.perf_counter()
        for n in range(count):
            sv.create_schedule(f"s{n:05d}", NAME, interval=60, input=n, start_at=slot)
        created = time.perf_counter() - created
        print(f"created {count} schedules in {created:.1f} s ({count / created:.0f}/s)")

        worker = Worker()
        batch = worker.settings.max_workflows_per_batch
        # The database clock at the slot: every schedule is due from now on.
        set_clock_offset_ms(slot_ms - store.now_ms())
        due = time.perf_counter()
        worker.start()
        try:
            started = completed = None
            deadline = due + 600
            while time.perf_counter() < deadline:
                runs = WorkflowInstance.objects.filter(instance_id__startswith="s")
                if started is None and runs.count() >= count:
                    started = time.perf_counter() - due
                    if not execute:
                        break
                if started is not None and not runs.filter(status="running").exists():
                    completed = time.perf_counter() - due
                    break
                time.sleep(0.05)
        finally:
            worker.stop(timeout=30)
            set_clock_offset_ms(0)
            from selvedge_django.storage.postgresql.listener import stop_listeners

            stop_listeners()
        if started is None:
            print(f"FAILED: not all {count} runs started within 600 s")
            return 1
        total = WorkflowInstance.objects.filter(instance_id__startswith="s").count()
        print(
            f"{count} schedules due at {slot.isoformat()}: all {total} runs started "
            f"{started:.2f} s after the slot ({count / started:.0f} starts/s, "
            f"batches of {batch}); within the minute: {'yes' if started < 60 else 'NO'}"
        )
        if execute:
            print(
                "all completed "
                + (f"{completed:.2f} s after the slot" if completed else "not within 600 s")
            )
        return 0 if started < 60 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--schedules", type=int, default=10_000, metavar="N")
    parser.add_argument("--execute", action="store_true", help="also run the workflows")
    args = parser.parse_args(argv)
    if args.schedules < 1:
        parser.error("--schedules must be at least 1")
    return run(args.db, args.schedules, args.execute)


if __name__ == "__main__":
    sys.exit(main())
