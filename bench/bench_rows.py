"""Rows and WAL written per durable unit on PostgreSQL: the inputs of docs/scaling.md's model.

    python bench/bench_rows.py                 # a private cluster of its own, 200 units a kind
    python bench/bench_rows.py --units 500
    python bench/bench_rows.py --shared        # the server of SELVEDGE_PG_* instead

For each unit kind (an empty workflow: start, dispatch and close; an inline activity
step; a background step claimed by the activity loop; a sleep; a signal) a workflow
of N units and one of none run step by step in this thread, as ``bench_scale.py
--only counts`` drives them; the difference over N is one unit. Per unit it prints the
statements and transactions (counted on the connection, as ``bench/harness.py`` does),
the statements that may send a ``NOTIFY`` (their text calls ``pg_notify``; a one-statement
write sends it only when its write happened),
the rows each hot table had inserted, updated (and of those, HOT updates: no index
entry written) and deleted (``pg_stat_user_tables``), and the WAL written
(``pg_current_wal_insert_lsn``). Last it runs ``--fill`` more workflows of three inline
steps and prints the heap and index bytes per row kept, after ``VACUUM``.

By default the run starts a throwaway PostgreSQL cluster of its own
(``tests/pgcluster.py``: ``fsync``, ``synchronous_commit`` and ``full_page_writes``
off), so nothing else writes WAL meanwhile; the WAL figure is then the records alone,
without the full-page images a production server adds after each checkpoint.
``--shared`` uses the configured server, where other work's WAL counts too.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_database

KINDS = (
    ("workflow", "an empty workflow (start, dispatch, close)"),
    ("inline", "activity step, inline"),
    ("background", "activity step, background"),
    ("sleep", "sleep (timer armed, fired)"),
    ("signal", "signal (sent, received)"),
)
TABLES = (
    ("workflowinstance", "instance"),
    ("historyevent", "history"),
    ("activitytask", "task"),
    ("timersubscription", "timer"),
    ("signalmessage", "signal"),
)


@contextlib.contextmanager
def server(shared: bool) -> Iterator[None]:
    """The configured server, or a private cluster pointed at through SELVEDGE_PG_*."""
    if shared:
        yield
        return
    from tests.pgcluster import private_cluster

    with private_cluster() as cluster:
        os.environ["SELVEDGE_PG_HOST"] = cluster.host
        os.environ["SELVEDGE_PG_PORT"] = str(cluster.port)
        os.environ["SELVEDGE_PG_USER"] = "postgres"
        os.environ["SELVEDGE_PG_PASSWORD"] = ""
        yield


def table_rows() -> dict[str, Counter[str]]:
    """Rows inserted, updated, HOT-updated and deleted so far, per engine table."""
    from django.db import connection

    with connection.cursor() as cursor:
        # Flush this backend's pending counts (PostgreSQL 15+), then read them fresh.
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
            " FROM pg_stat_user_tables WHERE relname LIKE 'selvedge_django_%%'"
        )
        rows = cursor.fetchall()
    out: dict[str, Counter[str]] = {}
    for name, ins, upd, hot, dele in rows:
        short = name.removeprefix("selvedge_django_")
        out[short] = Counter(ins=ins, upd=upd, hot=hot, dele=dele)
    return out


def wal_lsn() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def measure(units: int) -> dict[str, dict[str, float]]:
    import selvedge_django as sv
    from bench.harness import SqlCounter, store_classes, transactions
    from bench.workloads import BACKGROUND_QUEUE
    from selvedge_django.worker import Worker

    counter = SqlCounter()
    plumbing = {"atomic", "read_snapshot", "after_commit", "now_expr"}
    for tracked in store_classes():
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

    runner = inline_worker(worker_id="bench-rows")
    workflows = inline_worker(worker_id="bench-rows-wf", activity_queues=["-"])
    activities = inline_worker(worker_id="bench-rows-act", activity_queues=[BACKGROUND_QUEUE])

    notifying = Counter[str]()

    def count_notify(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "pg_notify" in sql:
            notifying["statements"] += 1
        return execute(sql, params, many, context)

    def run(kind: str, count: int) -> Counter[str]:
        from django.db import connection

        with connection.execute_wrapper(count_notify):
            return run_counted(kind, count)

    def run_counted(kind: str, count: int) -> Counter[str]:
        unit = "inline" if kind == "workflow" else kind
        before, lsn = table_rows(), wal_lsn()
        counter.reset()
        notifying.clear()
        instance_id = sv.start_workflow("bench.scale.units", {"kind": unit, "count": count})
        worker = workflows if unit == "background" else runner
        worker.dispatcher.run_once()
        for _ in range(count if unit != "inline" else 0):
            if unit == "background":
                activities.activity_poller.run_once()
            elif unit == "sleep":
                time.sleep(0.005)  # the timer is due a millisecond after it was armed
                worker.timer_poller.run_once()
            elif unit == "signal":
                sv.signal(instance_id, "go", 1)
            worker.dispatcher.run_once()
        if sv.get_workflow_result(instance_id).status != "completed":
            raise RuntimeError(f"{kind} x{count} did not complete")
        total: Counter[str] = Counter()
        for c in counter.snapshot()[0].values():
            total.update(c)
        total["transactions"] = transactions(total)
        total["notify"] = notifying["statements"]
        total["wal"] = wal_lsn() - lsn
        after = table_rows()
        for table, _ in TABLES:
            for field in ("ins", "upd", "hot", "dele"):
                total[f"{table}.{field}"] = after[table][field] - before[table][field]
        return total

    out: dict[str, dict[str, float]] = {}
    for kind, _ in KINDS:
        run(kind, 1)  # warm-up
        zero = run(kind, 0)
        if kind == "workflow":
            out[kind] = {key: float(value) for key, value in zero.items()}
            continue
        full = run(kind, units)
        keys = set(full) | set(zero)
        out[kind] = {key: (full[key] - zero[key]) / units for key in keys}
    return out


def fill(count: int) -> None:
    """Run ``count`` more workflows of three inline steps to completion, for the sizes."""
    import selvedge_django as sv
    from selvedge_django.worker import Worker

    worker = Worker(worker_id="bench-rows-fill")  # never started: driven from this thread
    worker.resumptions.inline = True
    worker.activities.inline = True
    for start in range(0, count, 1000):
        batch = min(1000, count - start)
        sv.start_workflows([("bench.scale.units", {"kind": "inline", "count": 3})] * batch)
        while worker.dispatcher.run_once():
            pass


def sizes() -> list[tuple[str, int, float, float]]:
    """Per hot table after the run (vacuumed): live rows, and heap and index bytes per row."""
    from django.db import connection

    out = []
    with connection.cursor() as cursor:
        for table, short in TABLES:
            name = f"selvedge_django_{table}"
            cursor.execute(f"VACUUM ANALYZE {name}")
            cursor.execute(
                "SELECT (SELECT count(*) FROM " + name + "), pg_table_size(%s),"
                " pg_indexes_size(%s)",
                [name, name],
            )
            rows, heap, indexes = cursor.fetchone()
            if rows:
                out.append((short, rows, heap / rows, indexes / rows))
    return out


def report(out: dict[str, dict[str, float]]) -> None:
    print(f"  {'':<44}{'queries':>8}{'transactions':>13}{'may notify':>11}{'WAL bytes':>11}")
    for kind, label in KINDS:
        c = out[kind]
        print(
            f"  {label:<44}{c['queries']:>8.2f}{c['transactions']:>13.2f}{c['notify']:>11.2f}"
            f"{c['wal']:>11.0f}"
        )
    print("  rows per unit: inserted / updated (HOT) / deleted")
    print(f"  {'':<44}" + "".join(f"{short:>18}" for _, short in TABLES))
    for kind, label in KINDS:
        c = out[kind]
        cells = []
        for table, _ in TABLES:
            ins, upd = c.get(f"{table}.ins", 0), c.get(f"{table}.upd", 0)
            hot, dele = c.get(f"{table}.hot", 0), c.get(f"{table}.dele", 0)
            cells.append(f"{ins:.1f}/{upd:.1f}({hot:.1f})/{dele:.1f}".rjust(18))
        print(f"  {label:<44}" + "".join(cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=200, help="units per kind (default 200)")
    parser.add_argument(
        "--shared", action="store_true", help="use the SELVEDGE_PG_* server, not a private one"
    )
    parser.add_argument(
        "--fill",
        type=int,
        default=5000,
        help="workflows of three inline steps run before the sizes are read (default 5000)",
    )
    args = parser.parse_args()
    os.environ.setdefault("SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_rows_{os.getpid()}")
    with server(args.shared), bench_database("postgres") as info:
        import bench.workloads  # noqa: F401 - registers the workflows

        print(f"== postgres: {info['version']}, {args.units} units a kind ==")
        report(measure(args.units))
        fill(args.fill)
        print(
            f"  bytes per row kept (heap with TOAST / indexes), after VACUUM, with {args.fill}"
            " more workflows of three inline steps:"
        )
        for short, rows, heap, indexes in sizes():
            print(f"  {short:<10}{rows:>8} rows {heap:>8.0f} B / {indexes:>6.0f} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
