"""django.tasks enqueue-to-done: SelvedgeBackend against django-tasks-db's DatabaseBackend.

Both backends run the same trivial task on the same machine and the same fresh
database, each drained by its own worker processes (``runselvedge worker`` and
``db_worker``), one backend at a time. SelvedgeBackend runs with durable retries on
(up to 5 attempts, recorded); DatabaseBackend has no retries.

    python bench/bench_tasks.py                      # both databases, 500 tasks
    python bench/bench_tasks.py --db postgres --tasks 2000 --processes 2

Needs Django 6 (django.tasks) and the ``bench`` dependency group (django-tasks-db):
``pip install -e '.[postgres]' 'Django>=6.1,<6.2' --group bench`` in a virtualenv of its
own. Figures:

- burst: enqueue N tasks as fast as one thread can (``enqueue/s``), and the time from
  the first enqueue to the last task done (``done/s`` = N / that time);
- latency of the burst's tasks, enqueued to finished, from each backend's own
  timestamps (p50 and p95);
- idle latency: one task at a time on an idle worker, enqueue to the enqueuer seeing
  it finished through ``get_result`` (p50 and p95 of 30).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import REPO_ROOT, bench_database, each_database

IDLE_SAMPLES = 30
WARM_UP = 20


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_workers(backend: str, processes: int) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if backend == "selvedge":
        command = ["runselvedge", "worker", *os.environ.get("BENCH_SELVEDGE_ARGS", "").split()]
    else:
        command = ["db_worker", "--backend", "db", "--interval", "0.05", "--no-startup-delay"]
    return [
        subprocess.Popen(
            [sys.executable, "-m", "django", *command],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def done_count(backend: str) -> int:
    if backend == "selvedge":
        from selvedge_django.models import WorkflowInstance

        return WorkflowInstance.objects.filter(
            workflow_name="selvedge.task", status="completed"
        ).count()
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult.objects.filter(status="SUCCESSFUL").count()


def burst_latencies(backend: str, ids: list[str]) -> list[float]:
    if backend == "selvedge":
        from selvedge_django.models import WorkflowInstance

        rows = WorkflowInstance.objects.filter(instance_id__in=ids).values_list(
            "started_at", "closed_at"
        )
    else:
        from django_tasks_db.models import DBTaskResult

        rows = DBTaskResult.objects.filter(id__in=ids).values_list("enqueued_at", "finished_at")
    return [(end - start).total_seconds() for start, end in rows if end is not None]


def wait_done(backend: str, target: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while done_count(backend) < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{backend}: {done_count(backend)} of {target} done in {timeout} s")
        time.sleep(0.01)


def measure(backend: str, n: int, processes: int) -> dict[str, Any]:
    from bench import tasks_bench

    task = tasks_bench.selvedge_noop if backend == "selvedge" else tasks_bench.db_noop
    procs = start_workers(backend, processes)
    try:
        for i in range(WARM_UP):
            task.enqueue(i)
        wait_done(backend, WARM_UP, timeout=120)
        started = time.perf_counter()
        ids = [str(task.enqueue(i).id) for i in range(n)]
        enqueued = time.perf_counter() - started
        wait_done(backend, WARM_UP + n)
        drained = time.perf_counter() - started
        latencies = burst_latencies(backend, ids)
        idle = []
        for i in range(IDLE_SAMPLES):
            began = time.perf_counter()
            result = task.enqueue(i)
            while not result.is_finished:
                time.sleep(0.002)
                result.refresh()
            idle.append(time.perf_counter() - began)
    finally:
        stop_workers(procs)
    return {
        "enqueue_rate": n / enqueued,
        "done_rate": n / drained,
        "p50": percentile(latencies, 0.5),
        "p95": percentile(latencies, 0.95),
        "idle_p50": percentile(idle, 0.5),
        "idle_p95": percentile(idle, 0.95),
    }


def run_one(db: str, n: int, processes: int) -> None:
    with bench_database(db, "bench.settings_tasks") as info:
        rows = {backend: measure(backend, n, processes) for backend in ("selvedge", "db")}
    print(
        f"\n{info['version']}: {n} tasks, {processes} worker process(es) per backend"
        f" (Python {sys.version.split()[0]})"
    )
    header = (
        f"{'backend':<34} {'enqueue/s':>10} {'done/s':>8} {'p50 ms':>8} {'p95 ms':>8}"
        f" {'idle p50':>9} {'idle p95':>9}"
    )
    print(header)
    print("-" * len(header))
    names = {
        "selvedge": "SelvedgeBackend (retries on)",
        "db": "django-tasks-db DatabaseBackend",
    }
    for backend, row in rows.items():
        print(
            f"{names[backend]:<34} {row['enqueue_rate']:>10.0f} {row['done_rate']:>8.0f}"
            f" {row['p50'] * 1000:>8.0f} {row['p95'] * 1000:>8.0f}"
            f" {row['idle_p50'] * 1000:>9.0f} {row['idle_p95'] * 1000:>9.0f}"
        )
    ratio = rows["selvedge"]["done_rate"] / rows["db"]["done_rate"]
    print(f"throughput, SelvedgeBackend / DatabaseBackend: {ratio:.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--tasks", type=int, default=500, metavar="N")
    parser.add_argument("--processes", type=int, default=1, metavar="K")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.processes < 1:
        parser.error("--tasks and --processes must be at least 1")
    if args.db != "all":
        run_one(args.db, args.tasks, args.processes)
        return 0
    return each_database(__file__, ["--tasks", str(args.tasks), "--processes", str(args.processes)])


if __name__ == "__main__":
    sys.exit(main())
