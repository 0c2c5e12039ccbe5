#!/usr/bin/env python
"""Bulk starts and enqueues against a loop of single calls, on one database.

    python bench/bench_bulk.py [--db sqlite|postgres|all] [--count N]

Each case creates N instances (default 10,000) of a one-line workflow, or enqueues
N ``django.tasks`` tasks (SelvedgeBackend), three ways, one after the other on the
same fresh database:

* **loop**: N single calls (``sv.start_workflow``, ``task.enqueue``), each its own
  transaction and commit, as a view calling them in a loop does;
* **loop in atomic()**: the same N calls inside one ``transaction.atomic()``
  (one commit, still a round trip per statement);
* **bulk**: one call (``sv.start_workflows``, ``selvedge_django.tasks.enqueue_many``),
  three times: the median of the three counts.

For each: the wall time, starts per second, the statements the database received
(Django's cursor, counted with an execute wrapper; BEGIN and savepoints left out)
and the commits (a statement run outside a transaction counts as one), and the bulk
call's speed-up against each loop. No worker runs: the figures are the client's.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_core import _git_revision  # noqa: E402 - the repository root goes first
from bench.harness import bench_database, each_database  # noqa: E402

# The bulk call lasts a second where a loop lasts ten: one stall of the machine moves it
# by a fifth. It runs this many times and its median counts; a loop is already the
# average of its N calls.
BULK_REPEATS = 3


@contextmanager
def counted() -> Iterator[dict[str, int]]:
    """Count the statements and commits of the default connection inside the block."""
    from django.db import connection

    counts = {"statements": 0, "commits": 0}

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
        if not sql.lstrip().upper().startswith(("BEGIN", "SAVEPOINT", "RELEASE")):
            counts["statements"] += 1
            if connection.get_autocommit():
                counts["commits"] += 1  # a statement that is its own transaction
        return execute(sql, params, many, ctx)

    commit = connection.commit

    def counting_commit() -> None:
        counts["commits"] += 1
        commit()

    connection.commit = counting_commit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(wrapper):
            yield counts
    finally:
        del connection.commit


def timed(label: str, n: int, run: Callable[[], Any], *, repeat: int = 1) -> float:
    """Run ``run`` ``repeat`` times and print the median time (and each, when several)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        with counted() as counts:
            run()
        times.append(time.perf_counter() - started)
    seconds = sorted(times)[len(times) // 2]
    each = f"  (median of {', '.join(f'{t:.3f}' for t in times)})" if repeat > 1 else ""
    print(
        f"  {label:<34} {seconds:8.3f} s  {n / seconds:10.0f}/s  "
        f"{counts['statements']:7d} statements  {counts['commits']:6d} commits{each}"
    )
    return seconds


def ratio(label: str, slow: float, fast: float) -> None:
    print(f"  {label:<34} {slow / fast:8.1f}x")


def run_one(db: str, n: int) -> None:
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_bulk_{os.getpid()}")
    with bench_database(db, "bench.settings_bulk") as info:
        import django
        from django.db import transaction

        import selvedge_django as sv
        from bench.tasks_bulk import bulk_noop
        from selvedge_django.conf import get_settings
        from selvedge_django.tasks import enqueue_many

        @sv.workflow(name="bench.bulk.noop")
        def noop(ctx: sv.WorkflowContext, i: int) -> int:
            return i

        print(f"== {db}: {info['version']} ==")
        print(
            f"selvedge_django (git {_git_revision()}), Django {django.get_version()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs; "
            f"PREPARED_STATEMENTS={get_settings().prepared_statements}; {n} each"
        )
        # Warm-up: connection, first-use caches, prepared statements.
        for i in range(20):
            sv.start_workflow(noop, i)
            bulk_noop.enqueue(i)
        sv.start_workflows([(noop, i) for i in range(20)])
        enqueue_many([(bulk_noop, [i], {}) for i in range(20)])

        def loop_in_atomic(call: Callable[[int], Any]) -> Callable[[], None]:
            def run() -> None:
                with transaction.atomic():
                    for i in range(n):
                        call(i)

            return run

        print("workflow starts")
        loop = timed(
            "loop of sv.start_workflow", n, lambda: [sv.start_workflow(noop, i) for i in range(n)]
        )
        atomic = timed(
            "loop in one atomic()", n, loop_in_atomic(lambda i: sv.start_workflow(noop, i))
        )
        bulk = timed(
            "sv.start_workflows (one call)",
            n,
            lambda: sv.start_workflows([(noop, i) for i in range(n)]),
            repeat=BULK_REPEATS,
        )
        ratio("bulk vs loop", loop, bulk)
        ratio("bulk vs loop in atomic()", atomic, bulk)
        print("django.tasks enqueues")
        loop = timed("loop of task.enqueue", n, lambda: [bulk_noop.enqueue(i) for i in range(n)])
        atomic = timed("loop in one atomic()", n, loop_in_atomic(lambda i: bulk_noop.enqueue(i)))
        bulk = timed(
            "enqueue_many (one call)",
            n,
            lambda: enqueue_many([(bulk_noop, [i], {}) for i in range(n)]),
            repeat=BULK_REPEATS,
        )
        ratio("bulk vs loop", loop, bulk)
        ratio("bulk vs loop in atomic()", atomic, bulk)
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--count", type=int, default=10_000, metavar="N")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    if args.db != "all":
        run_one(args.db, args.count)
        return 0
    return each_database(__file__, ["--count", str(args.count)])


if __name__ == "__main__":
    sys.exit(main())
