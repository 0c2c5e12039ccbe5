#!/usr/bin/env python
"""The DBOS Transact side of ``bench/bench_streams.py --dbos`` (runs in the benchmark virtualenv).

    python bench/dbos_streams.py run --url URL --json PATH [--entries N] [--samples N]
    python bench/dbos_streams.py reader --url URL --workflow ID --ready PATH  (started by ``run``)

One round of the same workload as the selvedge side, with DBOS's streams:

* write rate: one ``@DBOS.step`` calls ``DBOS.write_stream()`` ``--entries`` times in a
  loop and returns the seconds it took (a warm-up of 50 entries first);
* write-to-read latency: a step writes ``--samples`` entries 20 ms apart, each carrying
  ``time.perf_counter()`` taken just before its write, then the workflow closes the
  stream; ``DBOS.read_stream`` reads them in this process (the workflow runs on DBOS's
  own thread) and, in a second workflow, in a child process that launches DBOS (its
  notification listener, as a page server would have) before the first write.

Prints nothing but DBOS's version; writes the raw figures as JSON. Imports nothing from
selvedge_django or Django.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if sqlite3.sqlite_version_info < (3, 42):
    # DBOS's SQLite schema needs SQLite 3.42: take pysqlite3-binary's where the
    # interpreter's is older (as bench/dbos_side.py does).
    try:
        import pysqlite3  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        sys.modules["sqlite3"] = pysqlite3

from dbos import DBOS

PACE = 0.02  # seconds between the latency samples' writes, as on the selvedge side


@DBOS.step()
def burst(n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        DBOS.write_stream("burst", i)
    return time.perf_counter() - started


@DBOS.step()
def paced(n: int, ready: str | None) -> int:
    deadline = time.monotonic() + 120
    while ready and not Path(ready).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the reader process never got ready")
        time.sleep(0.01)
    for _ in range(n):
        time.sleep(PACE)  # pacing the load, not synchronisation
        DBOS.write_stream("paced", time.perf_counter())
    return n


@DBOS.workflow()
def run_burst(n: int) -> float:
    return burst(n)


@DBOS.workflow()
def run_paced(n: int, ready: str | None) -> int:
    count = paced(n, ready)
    DBOS.close_stream("paced")
    return count


def launch(url: str, executor: str) -> None:
    DBOS(
        config={
            "name": "selvedge-bench-streams",
            "system_database_url": url,
            "log_level": "WARNING",
            # Distinct per process: a launch recovers the PENDING workflows of its own
            # executor id, and the reader must not take over the writer's workflow.
            "executor_id": executor,
        }
    )
    DBOS.launch()


def read_latencies(workflow_id: str) -> list[float]:
    return [
        time.perf_counter() - float(value)
        for value in DBOS.read_stream(workflow_id, "paced", timeout_seconds=60)
    ]


def cmd_reader(args: argparse.Namespace) -> None:
    launch(args.url, f"reader-{os.getpid()}")
    Path(args.ready).touch()
    print(json.dumps(read_latencies(args.workflow)), flush=True)
    DBOS.destroy()


def cmd_run(args: argparse.Namespace) -> None:
    import dbos

    launch(args.url, f"writer-{os.getpid()}")
    try:
        DBOS.start_workflow(run_burst, 50).get_result()  # warm-up
        seconds = DBOS.start_workflow(run_burst, args.entries).get_result()

        handle = DBOS.start_workflow(run_paced, args.samples, None)
        same = read_latencies(handle.get_workflow_id())
        handle.get_result()

        ready = Path(tempfile.mkdtemp(prefix="selvedge-bench-dbos-")) / "ready"
        handle = DBOS.start_workflow(run_paced, args.samples, str(ready))
        command = [sys.executable, __file__, "reader", "--url", args.url]
        command += ["--workflow", handle.get_workflow_id(), "--ready", str(ready)]
        child = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            text=True,
            check=True,
            timeout=300,
        )
        other = json.loads(child.stdout.strip().splitlines()[-1])
        handle.get_result()
    finally:
        DBOS.destroy()
    version = getattr(dbos, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("dbos")
    result = {
        "version": f"DBOS Transact {version}",
        "entries": args.entries,
        "write_seconds": seconds,
        "same_process": same,
        "other_process": other,
    }
    Path(args.json).write_text(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--url", required=True)
    run.add_argument("--json", required=True)
    run.add_argument("--entries", type=int, default=2000)
    run.add_argument("--samples", type=int, default=200)
    reader = sub.add_parser("reader")
    reader.add_argument("--url", required=True)
    reader.add_argument("--workflow", required=True)
    reader.add_argument("--ready", required=True)
    args = parser.parse_args()
    {"run": cmd_run, "reader": cmd_reader}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
