#!/usr/bin/env python
"""The DBOS Transact side of ``bench/compare_dbos.py`` (runs in the benchmark virtualenv).

    python bench/dbos_side.py run --url URL --json PATH [--workflows N] [--processes 1,2,4]
                                   [--samples N] [--only throughput,latency,signal]
    python bench/dbos_side.py worker --url URL --id ID      (started by ``run``)
    python bench/dbos_side.py inproc --url URL --samples N  (started by ``run``)

The same shapes as ``bench/workloads.py``: three trivial steps in a row, one
step, and a workflow that waits for a message on "go" and returns the wall time
it woke at. ``run`` starts worker processes that serve the queue "bench" (DBOS's
way to spread workflows over processes) with DBOS's defaults, enqueues from a
``DBOSClient`` and reads completion times from DBOS's own workflow table.
Imports nothing from selvedge_django or Django.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if sqlite3.sqlite_version_info < (3, 42):
    # DBOS's SQLite schema uses unixepoch('subsec') (SQLite 3.42): take the SQLite
    # of pysqlite3-binary when the interpreter's own is older (compare_dbos.py
    # installs it into the benchmark virtualenv for --db sqlite).
    try:
        import pysqlite3  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        sys.modules["sqlite3"] = pysqlite3

from dbos import DBOS, DBOSClient

QUEUE = "bench"
# The client's result polling (DBOS's default is 1 s): short, so that the figures
# measure DBOS's execution rather than how often the benchmark looks.
RESULT_POLL = 0.005


@DBOS.step()
def add_one(x: int) -> int:
    return x + 1


@DBOS.step()
def double(x: int) -> int:
    return x * 2


@DBOS.step()
def label(x: int) -> str:
    return f"n={x}"


@DBOS.workflow()
def three_steps(x: int) -> str:
    return label(double(add_one(x)))


@DBOS.workflow()
def one_step(x: int) -> int:
    return add_one(x)


@DBOS.workflow()
def signal_wake() -> float:
    DBOS.recv("go", timeout_seconds=120)
    return time.time()


def launch(url: str) -> None:
    DBOS(config={"name": "selvedge-compare", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()


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


# -- worker processes -------------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> None:
    """Serve the queue with DBOS's defaults until SIGTERM."""
    launch(args.url)
    DBOS.register_queue(QUEUE)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"dbos worker {args.id} started", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=10)


@contextmanager
def workers(url: str, count: int) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        for index in range(count):
            proc = subprocess.Popen(
                [sys.executable, __file__, "worker", "--url", url, "--id", str(index)],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if "started" not in line:
                raise RuntimeError(f"DBOS worker did not start: {line}")
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()


# -- sections ---------------------------------------------------------------------------


def _status(client: DBOSClient, ids: list[str]) -> tuple[int, float]:
    """(workflows that succeeded, latest completion as a Unix time) among ``ids``."""
    import sqlalchemy as sa

    engine = client._sys_db.engine
    if engine.dialect.name == "sqlite":  # no schemas and no arrays: an IN list
        marks = ", ".join(f":id{index}" for index in range(len(ids)))
        statement = (
            "SELECT count(*), max(updated_at) FROM workflow_status"
            f" WHERE status = 'SUCCESS' AND workflow_uuid IN ({marks})"
        )
        params: dict[str, Any] = {f"id{index}": value for index, value in enumerate(ids)}
    else:
        statement = (
            "SELECT count(*), max(updated_at) FROM dbos.workflow_status"
            " WHERE status = 'SUCCESS' AND workflow_uuid = ANY(:ids)"
        )
        params = {"ids": ids}
    with engine.connect() as conn:
        done, last = conn.execute(sa.text(statement), params).one()
    return int(done), (last or 0) / 1000


def throughput(client: DBOSClient, url: str, n: int, processes: list[int]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for count in processes:
        with workers(url, count):
            # All N become visible at once, in one commit (as on the selvedge side).
            started = time.time()
            ids = []
            with client._sys_db.engine.begin() as conn:
                for x in range(n):
                    handle = client.enqueue_in_transaction(
                        conn, {"queue_name": QUEUE, "workflow_name": "three_steps"}, x
                    )
                    ids.append(handle.get_workflow_id())
            t0 = time.time()
            starting = t0 - started
            deadline = time.monotonic() + 600
            while True:
                done, last = _status(client, ids)
                if done == n:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{done} of {n} DBOS workflows finished")
                time.sleep(0.1)
        for handle_id, x in zip(ids, range(n), strict=True):
            value = client.retrieve_workflow(handle_id).get_result()
            if value != f"n={(x + 1) * 2}":
                raise RuntimeError(f"{handle_id} returned {value!r}")
        elapsed = last - t0
        runs[str(count)] = {
            "processes": count,
            "workflows": n,
            "seconds": elapsed,
            "starts_seconds": starting,
            "workflows_per_s": n / elapsed,
            "steps_per_s": 3 * n / elapsed,
        }
        print(f"  DBOS {count} process(es): {n / elapsed:.1f} workflows/s", flush=True)
    return runs


def remote_latency(client: DBOSClient, n: int, warmup: int) -> dict[str, float]:
    samples = []
    for x in range(n + warmup):
        started = time.perf_counter()
        handle = client.enqueue({"queue_name": QUEUE, "workflow_name": "one_step"}, x)
        value = handle.get_result(polling_interval_sec=RESULT_POLL)
        took = time.perf_counter() - started
        if value != x + 1:
            raise RuntimeError(f"one_step returned {value!r}")
        if x >= warmup:
            samples.append(took)
    return percentiles(samples)


def _wait_pending(client: DBOSClient, workflow_id: str) -> None:
    deadline = time.monotonic() + 60
    while client.retrieve_workflow(workflow_id).get_status().status != "PENDING":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{workflow_id} never started")
        time.sleep(0.002)


def remote_signal(client: DBOSClient, n: int, warmup: int) -> dict[str, float]:
    samples = []
    for x in range(n + warmup):
        handle = client.enqueue({"queue_name": QUEUE, "workflow_name": "signal_wake"})
        _wait_pending(client, handle.get_workflow_id())
        time.sleep(0.05)  # inside recv by now
        sent = time.time()
        client.send(handle.get_workflow_id(), x, "go")
        woke = handle.get_result(polling_interval_sec=RESULT_POLL)
        if x >= warmup:
            samples.append(woke - sent)
    return percentiles(samples)


def cmd_inproc(args: argparse.Namespace) -> None:
    """Latency and signal-to-wake with the workflows running in this process."""
    launch(args.url)
    out: dict[str, Any] = {}
    if "latency" in args.only:
        samples = []
        for x in range(args.samples + 5):
            started = time.perf_counter()
            value = DBOS.start_workflow(one_step, x).get_result()
            took = time.perf_counter() - started
            if value != x + 1:
                raise RuntimeError(f"one_step returned {value!r}")
            if x >= 5:
                samples.append(took)
        out["latency"] = percentiles(samples)
    if "signal" in args.only:
        samples = []
        for x in range(args.samples + 3):
            handle = DBOS.start_workflow(signal_wake)
            deadline = time.monotonic() + 60
            while handle.get_status().status != "PENDING":
                if time.monotonic() > deadline:
                    raise TimeoutError("signal_wake never started")
                time.sleep(0.002)
            time.sleep(0.05)
            sent = time.time()
            DBOS.send(handle.get_workflow_id(), x, "go")
            woke = handle.get_result()
            if x >= 3:
                samples.append(woke - sent)
        out["signal"] = percentiles(samples)
    Path(args.json).write_text(json.dumps(out))
    DBOS.destroy()


def cmd_run(args: argparse.Namespace) -> None:
    only = set(args.only)
    results: dict[str, Any] = {}
    # In-process figures come from a process of their own: a launched DBOS there would
    # also serve the queue that the worker processes below serve.
    inproc_json = f"{args.json}.inproc"
    if only & {"latency", "signal"}:
        subprocess.run(
            [
                sys.executable,
                __file__,
                "inproc",
                "--url",
                args.url,
                "--json",
                inproc_json,
                "--samples",
                str(args.samples),
                "--only",
                ",".join(args.only),
            ],
            check=True,
        )
        inproc = json.loads(Path(inproc_json).read_text())
        os.unlink(inproc_json)
    # Launch once so that the system database and its schema exist, and so that the
    # queue is registered, then hand everything over to the worker processes.
    with workers(args.url, 1):
        pass
    client = DBOSClient(system_database_url=args.url, application_name="selvedge-compare")
    try:
        if "throughput" in only:
            results["throughput"] = throughput(client, args.url, args.workflows, args.processes)
        if "latency" in only:
            with workers(args.url, 1):
                remote = remote_latency(client, args.samples, warmup=5)
            results["latency"] = {"in_process": inproc["latency"], "worker_process": remote}
        if "signal" in only:
            with workers(args.url, 1):
                remote = remote_signal(client, args.samples, warmup=3)
            results["signal"] = {"in_process": inproc["signal"], "worker_process": remote}
        results["version"] = _version(client)
    finally:
        client.destroy()
    Path(args.json).write_text(json.dumps(results, indent=2))


def _version(client: DBOSClient | None = None) -> str:
    from importlib.metadata import version

    text = f"DBOS Transact {version('dbos')}"
    engine = client._sys_db.engine if client is not None else None
    if engine is not None and engine.dialect.name == "sqlite":
        import sqlalchemy as sa

        with engine.connect() as conn:
            journal = conn.execute(sa.text("PRAGMA journal_mode")).scalar()
            synchronous = conn.execute(sa.text("PRAGMA synchronous")).scalar()
        levels = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
        library = sys.modules["sqlite3"].sqlite_version
        level = levels.get(synchronous, synchronous)
        text += f" on SQLite {library} ({journal}, synchronous = {level})"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--url", required=True)
    run.add_argument("--json", required=True)
    run.add_argument("--workflows", type=int, default=1000)
    run.add_argument("--processes", default="1,2,4")
    run.add_argument("--samples", type=int, default=200)
    run.add_argument("--only", default="throughput,latency,signal")
    worker = sub.add_parser("worker")
    worker.add_argument("--url", required=True)
    worker.add_argument("--id", default=uuid.uuid4().hex[:8])
    inproc = sub.add_parser("inproc")
    inproc.add_argument("--url", required=True)
    inproc.add_argument("--json", required=True)
    inproc.add_argument("--samples", type=int, default=200)
    inproc.add_argument("--only", default="latency,signal")
    args = parser.parse_args()
    if hasattr(args, "only"):
        args.only = [part for part in args.only.split(",") if part]
    if hasattr(args, "processes") and isinstance(args.processes, str):
        args.processes = [int(part) for part in args.processes.split(",") if part]
    {"run": cmd_run, "worker": cmd_worker, "inproc": cmd_inproc}[args.command](args)


if __name__ == "__main__":
    main()
