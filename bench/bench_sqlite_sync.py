#!/usr/bin/env python
"""The cost of ``SQLITE_SYNCHRONOUS = "FULL"`` (the default) against ``"NORMAL"`` on this machine.

    python bench/bench_sqlite_sync.py [--workflows N] [--signals N] [--rounds N]

With ``PRAGMA synchronous = FULL`` SQLite syncs the write-ahead log to disk at
every commit, so a commit the engine acknowledged (a close ``wait_workflow``
reported, a consumed signal) survives a power loss; with ``NORMAL`` it syncs
only at checkpoints, and the last commits before a power loss can be lost
(never on a process crash). Two workloads, each run on a fresh database file in
a child process per mode, the modes alternating for ``--rounds`` rounds:

* **workflows**: N three-activity workflows (``bench.three_steps``) started up
  front, then run by one in-process ``Worker`` with the default settings; the
  figure is the time from the first start to the last close.
* **signals**: N ``sv.signal()`` calls one after another, each its own
  transaction (the cost of one commit as a web request sees it).

The last lines print the medians and the ratio FULL / NORMAL (above 1: FULL is
slower by that factor). The figure depends on the disk: it is the cost of an
``fsync`` of the WAL per commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

MODES = ("FULL", "NORMAL")


def run_mode(mode: str, workflows: int, signals: int) -> dict[str, Any]:
    """One round in this process (Django is configured once per process)."""
    from bench.harness import bench_database

    with bench_database("sqlite"):
        from django.db import connection, connections
        from django.db.models import Max
        from django.test.utils import override_settings
        from django.utils import timezone

        import selvedge_django as sv
        from bench import workloads
        from selvedge_django.models import WorkflowInstance
        from selvedge_django.worker import Worker

        override_settings(SELVEDGE={"SQLITE_SYNCHRONOUS": mode}).enable()
        connections.close_all()  # reopen under the mode above
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous")
            applied = int(cursor.fetchone()[0])

        first_start = timezone.now()
        ids = [sv.start_workflow(workloads.three_steps, x) for x in range(workflows)]
        with Worker():
            for instance_id in ids:
                result = sv.wait_workflow(instance_id, timeout=300)
                if result.status != "completed":
                    raise RuntimeError(f"{instance_id}: {result.status} {result.error!r}")
        last_close = WorkflowInstance.objects.filter(instance_id__in=ids).aggregate(
            last=Max("closed_at")
        )["last"]
        workflow_seconds = (last_close - first_start).total_seconds()

        target = sv.start_workflow(workloads.signal_wake, None, instance_id="signal-target")
        t0 = time.perf_counter()
        for i in range(signals):
            sv.signal(target, "bench", i)
        signal_seconds = time.perf_counter() - t0
    return {
        "mode": mode,
        "pragma": applied,
        "workflow_seconds": workflow_seconds,
        "signal_seconds": signal_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=200, metavar="N")
    parser.add_argument("--signals", type=int, default=500, metavar="N")
    parser.add_argument("--rounds", type=int, default=3, metavar="N")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.workflows, args.signals, args.rounds) < 1:
        parser.error("--workflows, --signals and --rounds must be at least 1")
    if args.child:
        print(json.dumps(run_mode(args.child, args.workflows, args.signals)))
        return 0

    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for round_no in range(1, args.rounds + 1):
        for mode in MODES if round_no % 2 else reversed(MODES):
            command = [sys.executable, str(Path(__file__).resolve()), "--child", mode]
            command += ["--workflows", str(args.workflows), "--signals", str(args.signals)]
            out = subprocess.run(command, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.stderr.write(out.stdout + out.stderr)
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[mode].append(row)
            print(
                f"round {round_no} {mode:<6} (PRAGMA synchronous = {row['pragma']}): "
                f"{args.workflows} workflows in {row['workflow_seconds']:.2f} s, "
                f"{args.signals} signals in {row['signal_seconds']:.2f} s",
                flush=True,
            )

    def median(mode: str, field: str) -> float:
        return statistics.median(row[field] for row in results[mode])

    print()
    for field, label, n in (
        ("workflow_seconds", "workflows", args.workflows),
        ("signal_seconds", "signals", args.signals),
    ):
        full, normal = median("FULL", field), median("NORMAL", field)
        print(
            f"{label:<9} FULL {n / full:8.1f}/s   NORMAL {n / normal:8.1f}/s   "
            f"FULL/NORMAL time ratio {full / normal:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
