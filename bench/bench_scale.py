#!/usr/bin/env python
"""Scale benchmark: worker processes, latency, signal wake-ups, sleepers, resume cost.

    python bench/bench_scale.py [--db sqlite|postgres|all] [--quick] [--only SECTION,...]
                                [--workflows N] [--processes 1,2,4] [--samples N]
                                [--sleepers N] [--history 10,1000,10000] [--json PATH]

Sections (``--only`` picks some):

throughput  N workflows of three trivial activities, started in one transaction
            by this process while 1, 2 and 4 ``runselvedge worker`` processes wait;
            workflows/s and activity steps/s from the commit to the last close.
latency     start-to-result of one-activity workflows, one at a time
            (``start_workflow`` then ``wait_workflow``): p50/p95/p99, with the
            worker in this process and in another process.
signal      signal-to-wake: a workflow blocked in ``receive`` is signalled; the
            figure is the time until its code runs again (it returns the wall
            clock it woke at), in this process and in another process.
sleepers    N workflows sleeping at once on durable timers in one worker process:
            its threads and memory before and after, then every timer is made due
            at once and the rate at which they fire and the workflows finish.
resume      the cost of one resumption (lease, history load, replay, next wait)
            against the length of the history replayed.

Each database runs in its own child process (Django is configured once per
process) on a throwaway database (see bench/harness.py). Worker processes use
the project's defaults; on SQLite, where processes have no notifications, they
poll every 0.1 s (``SELVEDGE_BENCH_POLL``). See bench/README.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import bench_database  # noqa: E402 - the repository root goes on the path first

SECTIONS = ("counts", "throughput", "latency", "signal", "sleepers", "resume")
SQLITE_POLL = 0.1  # seconds: the polling of worker processes that share a SQLite file


# -- worker processes -------------------------------------------------------------------


class WorkerProcess:
    """A ``runselvedge worker`` process on the benchmark database."""

    def __init__(
        self,
        db: str,
        worker_id: str,
        *args: str,
        settings: str = "bench.scale_settings",
        env: dict[str, str] | None = None,
    ) -> None:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings,
            "PYTHONPATH": str(REPO_ROOT),
            **(env or {}),
        }
        if db == "sqlite":
            env["SELVEDGE_BENCH_POLL"] = str(SQLITE_POLL)
        self.worker_id = worker_id
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "django",
                "runselvedge",
                "worker",
                "--worker-id",
                worker_id,
                *list(args),
            ],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "started" not in line:
            self.proc.kill()
            self.log.seek(0)
            raise RuntimeError(f"worker {worker_id} did not start: {line}{self.log.read()}")

    def status(self, field: str) -> int:
        """A field of /proc/<pid>/status (VmRSS in kB, Threads)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.seek(0)
        errors = [line for line in self.log.read().splitlines() if "Traceback" in line]
        self.log.close()
        if errors:
            print(f"  (worker {self.worker_id} logged {len(errors)} tracebacks)")


@contextmanager
def worker_processes(db: str, count: int, prefix: str) -> Iterator[list[WorkerProcess]]:
    procs: list[WorkerProcess] = []
    try:
        for index in range(count):
            procs.append(WorkerProcess(db, f"{prefix}-{index}"))
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@contextmanager
def client_polling(db: str) -> Iterator[None]:
    """On SQLite the client finds another process's results by polling: poll like the workers."""
    if db != "sqlite":
        yield
        return
    from django.conf import settings
    from django.test import override_settings

    with override_settings(
        SELVEDGE={
            **settings.SELVEDGE,
            "MODULES": ["bench.workloads"],
            "WAIT_POLL_INTERVAL": SQLITE_POLL,
        }
    ):
        yield


@contextmanager
def in_process_worker() -> Iterator[Any]:
    from selvedge_django.worker import Worker

    worker = Worker(worker_id=f"bench-inproc-{os.getpid()}")
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=30)


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {
        "n": len(ordered),
        "p50": pick(0.50),
        "p95": pick(0.95),
        "p99": pick(0.99),
        "mean": statistics.fmean(ordered),
    }


# -- sections ---------------------------------------------------------------------------


def _any_running(ids: list[str]) -> bool:
    """Whether any of ``ids`` still runs: one hand-written statement, as the DBOS side
    polls its own table (bench/dbos_side.py), so that neither side's poll costs the
    machine more than the other's (the ORM's IN list of N values costs milliseconds)."""
    from django.db import connection

    from selvedge_django.models import WorkflowInstance

    table = connection.ops.quote_name(WorkflowInstance._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT 1 FROM {table} WHERE status = 'running' AND instance_id = ANY(%s) LIMIT 1",
                [ids],
            )
        else:
            marks = ", ".join(["%s"] * len(ids))
            cursor.execute(
                f"SELECT 1 FROM {table} WHERE status = 'running' AND instance_id IN ({marks})"
                " LIMIT 1",
                ids,
            )
        return cursor.fetchone() is not None


def _next_xid() -> int | None:
    """PostgreSQL's next transaction id (None on SQLite). Only a transaction that writes
    takes one, so the difference over a run counts the write transactions of every
    process on the server (the workers', and nothing else on a quiet one); reading it
    takes none."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        return int(cursor.fetchone()[0])


def measure_throughput(db: str, n: int, processes: list[int]) -> dict[str, Any]:
    """N workflows of three activities with 1, 2, 4 worker processes."""
    from django.db import transaction
    from django.db.models import Max

    import selvedge_django as sv
    from bench.workloads import three_steps_output
    from selvedge_django.models import WorkflowInstance

    runs: dict[str, Any] = {}
    for count in processes:
        with worker_processes(db, count, f"tp{count}"):
            # All N become visible at once, in one commit, to workers that are up and
            # idle: the clock measures the workers, not the client's start rate.
            started = time.time()
            with transaction.atomic():
                ids = {sv.start_workflow("bench.scale.three_steps", x): x for x in range(n)}
            t0 = time.time()
            starting = t0 - started
            first_xid = _next_xid()
            wait_for(lambda waited=list(ids): not _any_running(waited), timeout=600, interval=0.1)
            written = None if first_xid is None else _next_xid() - first_xid  # type: ignore[operator]
        rows = WorkflowInstance.objects.filter(instance_id__in=list(ids))
        wrong = [
            i
            for i, status, output in rows.values_list("instance_id", "status", "output")
            if status != "completed" or json.loads(output) != three_steps_output(ids[i])
        ]
        if wrong:
            raise RuntimeError(f"{len(wrong)} workflows did not complete correctly")
        last = rows.aggregate(last=Max("closed_at"))["last"]
        elapsed = last.timestamp() - t0
        runs[str(count)] = {
            "processes": count,
            "workflows": n,
            "seconds": elapsed,
            "starts_seconds": starting,
            "workflows_per_s": n / elapsed,
            "steps_per_s": 3 * n / elapsed,
        }
        writes = ""
        if written is not None:
            runs[str(count)]["write_transactions_per_s"] = written / elapsed
            writes = (
                f", {written / n:.2f} write transactions a workflow ({written / elapsed:,.0f}/s)"
            )
        print(
            f"  {count} worker process{'es' if count > 1 else '  '}: {elapsed:7.2f} s  "
            f"{n / elapsed:8.1f} workflows/s  {3 * n / elapsed:8.1f} steps/s  "
            f"(the {n} starts, one transaction before the clock started: {starting:.2f} s"
            f"{writes})",
            flush=True,
        )
    return runs


def _latencies(n: int, warmup: int) -> list[float]:
    import selvedge_django as sv

    samples = []
    for x in range(n + warmup):
        started = time.perf_counter()
        instance_id = sv.start_workflow("bench.scale.one_step", x)
        result = sv.wait_workflow(instance_id, timeout=60)
        took = time.perf_counter() - started
        if result.status != "completed" or result.output != x + 1:
            raise RuntimeError(f"{instance_id}: {result.status} {result.error!r}")
        if x >= warmup:
            samples.append(took)
    return samples


def measure_latency(db: str, n: int) -> dict[str, Any]:
    """Start-to-result of one-activity workflows, in-process and across processes."""
    out: dict[str, Any] = {}
    with in_process_worker():
        out["in_process"] = percentiles(_latencies(n, warmup=5))
    with worker_processes(db, 1, "lat"), client_polling(db):
        out["worker_process"] = percentiles(_latencies(n, warmup=5))
    for mode, label in (("in_process", "worker in this process"), ("worker_process", PROC)):
        _print_percentiles(label, out[mode])
    return out


PROC = "worker in another process"


def _print_percentiles(label: str, p: dict[str, float]) -> None:
    print(
        f"  {label:<34} p50 {p['p50'] * 1000:7.1f} ms   p95 {p['p95'] * 1000:7.1f} ms   "
        f"p99 {p['p99'] * 1000:7.1f} ms   (n={p['n']})",
        flush=True,
    )


def _signal_wakes(n: int, warmup: int) -> list[float]:
    import selvedge_django as sv
    from selvedge_django.models import WorkflowInstance

    samples = []
    for x in range(n + warmup):
        instance_id = sv.start_workflow("bench.scale.signal_wake", None)
        suspended = WorkflowInstance.objects.filter(
            instance_id=instance_id, lease_epoch__gte=1, lease_owner="", runnable=False
        )
        wait_for(suspended.exists, timeout=60, interval=0.002)
        time.sleep(0.02)  # the worker's loops are idle again
        sent = time.time()
        sv.signal(instance_id, "go", x)
        result = sv.wait_workflow(instance_id, timeout=60)
        if result.status != "completed":
            raise RuntimeError(f"{instance_id}: {result.status} {result.error!r}")
        if x >= warmup:
            samples.append(float(result.output) - sent)
    return samples


def measure_signal(db: str, n: int) -> dict[str, Any]:
    """Signal-to-wake of a workflow blocked in receive, in-process and across processes."""
    out: dict[str, Any] = {}
    with in_process_worker():
        out["in_process"] = percentiles(_signal_wakes(n, warmup=3))
    with worker_processes(db, 1, "sig"), client_polling(db):
        out["worker_process"] = percentiles(_signal_wakes(n, warmup=3))
    for mode, label in (("in_process", "worker in this process"), ("worker_process", PROC)):
        _print_percentiles(label, out[mode])
    return out


def measure_sleepers(db: str, n: int) -> dict[str, Any]:
    """N workflows asleep at once in one worker process; then all timers come due."""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.db.models import Max, Q
    from django.utils import timezone

    import selvedge_django as sv
    from selvedge_django.models import TimerSubscription, WorkflowInstance
    from selvedge_django.storage.wakeups import NOTIFY_CHANNEL

    name = "bench.scale.sleep_until"
    with worker_processes(db, 1, "sleep") as (proc,), client_polling(db):
        # Warm up: a few sleeps that end at once load every code path of the worker.
        soon = (timezone.now() + timedelta(seconds=0.5)).isoformat()
        for instance_id in [sv.start_workflow(name, soon) for _ in range(20)]:
            sv.wait_workflow(instance_id, timeout=60)
        time.sleep(1.0)
        rss0, threads0 = proc.status("VmRSS"), proc.status("Threads")
        until = (timezone.now() + timedelta(days=1)).isoformat()
        t0 = time.time()
        for start in range(0, n, 500):
            with transaction.atomic():
                for _ in range(min(500, n - start)):
                    sv.start_workflow(name, until)
        created = time.time() - t0
        running = WorkflowInstance.objects.filter(workflow_name=name, status="running")
        busy = running.filter(Q(runnable=True) | ~Q(lease_owner=""))

        def all_asleep() -> bool:
            return TimerSubscription.objects.count() >= n and not busy.exists()

        wait_for(all_asleep, timeout=1800, interval=0.5)
        asleep = time.time() - t0
        time.sleep(2.0)
        rss1, threads1 = proc.status("VmRSS"), proc.status("Threads")

        # Every timer comes due now (the poller reads fire_at_ms, on the database
        # clock; 0 is long past); the NOTIFY is what arming a timer sends.
        fire_at = timezone.now()
        t1 = time.time()
        TimerSubscription.objects.update(expires_at=fire_at, fire_at_ms=0)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, 'timer')", [NOTIFY_CHANNEL])
        wait_for(lambda: not TimerSubscription.objects.exists(), timeout=1800, interval=0.2)
        fired = time.time() - t1
        wait_for(lambda: not running.exists(), timeout=1800, interval=0.5)
        last = WorkflowInstance.objects.filter(workflow_name=name).aggregate(m=Max("closed_at"))
        finished = last["m"].timestamp() - t1
        rss2, threads2 = proc.status("VmRSS"), proc.status("Threads")
    out = {
        "sleepers": n,
        "start_seconds": created,
        "all_asleep_seconds": asleep,
        "threads_idle": threads0,
        "threads_asleep": threads1,
        "threads_after": threads2,
        "rss_idle_mb": rss0 / 1024,
        "rss_asleep_mb": rss1 / 1024,
        "rss_after_mb": rss2 / 1024,
        "rss_added_mb": (rss1 - rss0) / 1024,
        "fire_seconds": fired,
        "fired_per_s": n / fired,
        "finish_seconds": finished,
        "finished_per_s": n / finished,
    }
    print(
        f"  {n} workflows started in {created:.1f} s, all asleep after {asleep:.1f} s "
        f"({n / asleep:.0f} suspensions/s)\n"
        f"  worker threads: {threads0} idle, {threads1} with {n} asleep, {threads2} after\n"
        f"  worker memory (RSS): {rss0 / 1024:.1f} MB idle, {rss1 / 1024:.1f} MB with {n} asleep "
        f"(+{(rss1 - rss0) / 1024:.1f} MB), {rss2 / 1024:.1f} MB after they finished\n"
        f"  all timers due at once: fired in {fired:.2f} s ({n / fired:.0f} timers/s), "
        f"every workflow closed after {finished:.2f} s ({n / finished:.0f} workflows/s)",
        flush=True,
    )
    return out


@contextmanager
def fast_commits() -> Iterator[None]:
    """Skip the flush at commit while a long history is built (a throwaway database)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET synchronous_commit TO off")
        else:
            cursor.execute("PRAGMA synchronous")
            previous = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous = OFF")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET synchronous_commit TO on")
            else:
                cursor.execute(f"PRAGMA synchronous = {int(previous)}")


def measure_resume(lengths: list[int], repeats: int) -> dict[str, Any]:
    """One resumption's cost (lease, load, replay, receive, suspend) per history length."""
    from django.test import override_settings

    import selvedge_django as sv
    from selvedge_django.models import HistoryEvent
    from selvedge_django.worker import Worker

    out: dict[str, Any] = {}
    # A long lease: the worker is driven from this thread, without its renewer, and
    # building a long history takes longer than the default lease.
    lease = {"TTL": 3600, "RENEW_INTERVAL": 60, "MARGIN": 5, "MAX_SKEW": 1}
    with override_settings(
        SELVEDGE={
            "MODULES": ["bench.workloads"],
            "HISTORY_WARNING_THRESHOLD": 10**7,
            "LEASE": lease,
        }
    ):
        worker = Worker(worker_id="bench-resume")  # never started: driven from this thread
        worker.resumptions.inline = True
        worker.activities.inline = True
        store = worker.store
        for length in lengths:
            with fast_commits():
                instance_id = sv.start_workflow("bench.scale.history", length)
                if worker.dispatcher.run_once() != 1:
                    raise RuntimeError("the history workflow was not dispatched")
            events = HistoryEvent.objects.filter(instance_id=instance_id).count()
            if events != length:
                raise RuntimeError(f"expected {length} history events, found {events}")
            times, loads = [], []
            for r in range(repeats):
                t = time.perf_counter()
                store.instances.load_snapshot(instance_id)
                loads.append(time.perf_counter() - t)
                sv.signal(instance_id, "go", r)
                t = time.perf_counter()
                if worker.dispatcher.run_once() != 1:
                    raise RuntimeError("the signalled workflow was not dispatched")
                times.append(time.perf_counter() - t)
            out[str(length)] = {
                "events": length,
                # The first resumption also delivers every value recorded before it.
                "first_ms": times[0] * 1000,
                "resume_ms": statistics.median(times[1:]) * 1000,
                "load_ms": statistics.median(loads) * 1000,
            }
    base = out[str(lengths[0])]["resume_ms"]
    for length in lengths:
        row = out[str(length)]
        row["ratio"] = row["resume_ms"] / base
        print(
            f"  {length:>6} events: one resumption {row['resume_ms']:8.1f} ms "
            f"(history load alone {row['load_ms']:7.1f} ms), {row['ratio']:6.1f}x the "
            f"{lengths[0]}-event cost; the first, delivering, {row['first_ms']:8.1f} ms",
            flush=True,
        )
    return out


UNIT_KINDS = (
    ("inline", "activity step, inline (act.execute)"),
    ("background", "activity step, background (claimed by a poller)"),
    ("sleep", "sleep (ctx.sleep, timer fired by the poller)"),
    ("signal", "signal (sv.signal + ctx.receive)"),
)


def measure_counts(units: int) -> dict[str, Any]:
    """Statements and transactions per durable unit, counted on every connection.

    Each kind runs a workflow of ``units`` units and one of none, driven step by
    step in this thread (no idle polls); the difference divided by ``units`` is
    the cost of one unit, everything included: the command's own transaction, the
    suspension, the wake-up (claim, fire, signal) and the next dispatch.
    """
    import selvedge_django as sv
    from bench.harness import SqlCounter, store_classes, transactions
    from bench.workloads import BACKGROUND_QUEUE
    from selvedge_django.models import WorkflowInstance
    from selvedge_django.worker import Worker

    counter = SqlCounter()
    plumbing = {"atomic", "read_snapshot", "after_commit", "now_expr"}
    for tracked in store_classes():  # the store of the database, its database and parts
        names = [
            name
            for cls in tracked.__mro__
            for name, attr in vars(cls).items()
            if inspect.isfunction(attr) and not name.startswith("_") and name not in plumbing
        ]
        counter.track(tracked, names)
    counter.install()

    def inline_worker(**overrides: Any) -> Any:
        worker = Worker(**overrides)  # never started: its loops are driven from this thread
        worker.resumptions.inline = True
        worker.activities.inline = True
        return worker

    runner = inline_worker(worker_id="bench-counts")
    workflows = inline_worker(worker_id="bench-counts-wf", activity_queues=["-"])
    activities = inline_worker(worker_id="bench-counts-act", activity_queues=[BACKGROUND_QUEUE])

    def run(kind: str, count: int) -> Any:
        counter.reset()
        instance_id = sv.start_workflow("bench.scale.units", {"kind": kind, "count": count})
        worker = workflows if kind == "background" else runner
        if worker.dispatcher.run_once() != 1:
            raise RuntimeError("not dispatched")
        for _ in range(count if kind != "inline" else 0):
            if kind == "background":
                activities.activity_poller.run_once()
            elif kind == "sleep":
                time.sleep(0.005)
                worker.timer_poller.run_once()
            elif kind == "signal":
                sv.signal(instance_id, "go", 1)
            worker.dispatcher.run_once()
        counts = counter.snapshot()[0]
        status = WorkflowInstance.objects.get(instance_id=instance_id).status
        if status != "completed":
            raise RuntimeError(f"{kind} x{count}: {status}")
        total: Any = {}
        for c in counts.values():
            for key, value in c.items():
                total[key] = total.get(key, 0) + value
        total["transactions"] = transactions(Counter(total))
        return total

    from collections import Counter

    out: dict[str, Any] = {}
    base = None
    for kind, _ in UNIT_KINDS:
        run(kind, units)  # warm-up
        zero = run(kind, 0)
        if base is None:
            base = zero
        full = run(kind, units)
        out[kind] = {
            key: (full.get(key, 0) - zero.get(key, 0)) / units
            for key in ("queries", "commits", "autocommit", "transactions")
        }
    out["workflow"] = {
        key: base.get(key, 0) for key in ("queries", "commits", "autocommit", "transactions")
    }
    print(f"  {'':<50}{'queries':>9}{'commits':>9}{'autocommit':>12}{'transactions':>14}")
    rows = [("workflow", "start + dispatch + close (an empty workflow)"), *list(UNIT_KINDS)]
    for kind, label in rows:
        c = out[kind]
        print(
            f"  {label:<50}{c['queries']:>9.2f}{c['commits']:>9.2f}{c['autocommit']:>12.2f}"
            f"{c['transactions']:>14.2f}",
            flush=True,
        )
    print(
        "  per unit: a workflow of N units minus one of none, over N (commits = write "
        "transactions; autocommit = single reads)"
    )
    return out


# -- driver -----------------------------------------------------------------------------


def run_one(db: str, args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_scale_{os.getpid()}")
    with bench_database(db) as info:
        import django

        import bench.workloads  # noqa: F401 - registers the workflows in this process

        print(f"== {db}: {info['version']} ==")
        print(
            f"Django {django.get_version()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs; worker processes: project defaults"
            + (
                f", polling every {SQLITE_POLL} s (no notifications on SQLite)"
                if db == "sqlite"
                else ""
            )
        )
        results: dict[str, Any] = {"db": db, "version": info["version"]}
        if "counts" in args.only:
            print("\nStatements and transactions per durable unit (3 units, driven inline)")
            results["counts"] = measure_counts(3)
        if "throughput" in args.only:
            print(
                f"\nThroughput: {args.workflows} workflows x 3 activities, started in one "
                "transaction, from its commit to the last close"
            )
            results["throughput"] = measure_throughput(db, args.workflows, args.processes)
        if "latency" in args.only:
            print("\nStart-to-result latency, one-activity workflows, one at a time")
            results["latency"] = measure_latency(db, args.samples)
        if "signal" in args.only:
            print("\nSignal-to-wake latency (signal sent -> workflow code running again)")
            results["signal"] = measure_signal(db, args.samples)
        if "sleepers" in args.only:
            print(f"\n{args.sleepers} sleeping workflows in one worker process")
            results["sleepers"] = measure_sleepers(db, args.sleepers)
        if "resume" in args.only:
            print("\nResume cost against history length (median of 4 after the first, inline)")
            results["resume"] = measure_resume(args.history, 5)
        from selvedge_django.storage.postgresql.listener import stop_listeners

        stop_listeners()  # wait_workflow's LISTEN connection, before the database goes
        print(flush=True)
    return results


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    parser.add_argument("--workflows", type=int, default=None, metavar="N")
    parser.add_argument("--processes", type=_ints, default=[1, 2, 4])
    parser.add_argument("--samples", type=int, default=None, metavar="N")
    parser.add_argument("--sleepers", type=int, default=None, metavar="N")
    parser.add_argument("--history", type=_ints, default=None)
    parser.add_argument("--json", default=None, metavar="PATH", help="write the figures here")
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    quick = args.quick
    args.workflows = args.workflows or (100 if quick else 1000)
    args.samples = args.samples or (30 if quick else 200)
    args.sleepers = args.sleepers or (1000 if quick else 20_000)
    args.history = args.history or ([10, 100, 1000] if quick else [10, 1000, 10_000])

    if args.db != "all":
        results = {args.db: run_one(args.db, args)}
    else:
        # One process per database: Django is configured once per process.
        results = {}
        failed = []
        for db in ("sqlite", "postgres"):
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                command = [sys.executable, str(Path(__file__).resolve()), "--db", db]
                command += ["--only", ",".join(args.only), "--json", out.name]
                command += ["--workflows", str(args.workflows), "--samples", str(args.samples)]
                command += ["--sleepers", str(args.sleepers)]
                command += ["--processes", ",".join(map(str, args.processes))]
                command += ["--history", ",".join(map(str, args.history))]
                if subprocess.call(command) != 0:
                    failed.append(db)
                    continue
                results.update(json.loads(Path(out.name).read_text() or "{}"))
        if failed:
            print(f"failed: {', '.join(failed)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return (
        0
        if all(db in results for db in ([args.db] if args.db != "all" else ["sqlite", "postgres"]))
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
