#!/usr/bin/env python
"""The machine's own ceiling: single-row ``UPDATE ... COMMIT`` transactions per second.

    python bench/limit.py [--db sqlite|postgres|all] [--connections 1,2,4,8]
                          [--seconds S] [--json PATH]

Each of N processes opens one connection and commits, as fast as it can for S
seconds, a transaction that updates one row of its own: the cheapest durable
write the database offers, so no engine doing durable work on that database can
commit more often. PostgreSQL runs with the server's own ``synchronous_commit``
(printed); SQLite in WAL mode with ``synchronous = FULL`` (the engine's default),
each writer taking the write lock with ``BEGIN IMMEDIATE``.

``bench/run_all.py`` divides selvedge's commits per second (its throughput times
the write transactions a workflow needs) by these figures. Nothing here is part
of the test suite.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import _pg_admin, _quote  # noqa: E402 - the repository root goes on the path first

TABLE = "limit_rows"


def _pg_connect(dbname: str) -> Any:
    import psycopg

    return psycopg.connect(
        host=os.environ.get("SELVEDGE_PG_HOST", "127.0.0.1"),
        port=os.environ.get("SELVEDGE_PG_PORT", "5432"),
        user=os.environ.get("SELVEDGE_PG_USER", "postgres"),
        password=os.environ.get("SELVEDGE_PG_PASSWORD", ""),
        dbname=dbname,
        connect_timeout=5,
    )


def _writer(db: str, target: str, row: int, start: Any, seconds: float, out: Any) -> None:
    """One connection committing single-row updates until its time is up."""
    if db == "postgres":
        conn = _pg_connect(target)
        cursor = conn.cursor()

        def commit_one() -> None:
            cursor.execute(f"UPDATE {TABLE} SET v = v + 1 WHERE id = %s", [row])
            conn.commit()

    else:
        conn = sqlite3.connect(target, timeout=60, isolation_level=None)
        conn.execute("PRAGMA synchronous = FULL")

        def commit_one() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"UPDATE {TABLE} SET v = v + 1 WHERE id = ?", [row])
            conn.execute("COMMIT")

    commit_one()  # warm: the connection and the row are ready before the clock starts
    start.wait()
    commits = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        commit_one()
        commits += 1
    conn.close()
    out.put(commits)


def measure(db: str, target: str, connections: int, seconds: float, writer: Any = None) -> float:
    """Commits per second from ``connections`` processes, one connection each, each
    running ``writer(db, target, row, start, seconds, out)`` (default: :func:`_writer`)."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    out = ctx.Queue()
    procs = [
        ctx.Process(target=writer or _writer, args=(db, target, row, start, seconds, out))
        for row in range(1, connections + 1)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5 + 0.1 * connections)  # let every writer connect and warm up
    started = time.perf_counter()
    start.set()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    elapsed = max(time.perf_counter() - started, seconds)
    for proc in procs:
        proc.join(timeout=30)
    return total / elapsed


def setup(db: str, rows: int, tmp: Path) -> tuple[str, str]:
    """Create the table of ``rows`` rows; return (target, a description of the settings)."""
    if db == "postgres":
        name = f"selvedge_limit_{os.getpid()}"
        _pg_admin(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
        _pg_admin(f"CREATE DATABASE {_quote(name)}")
        with _pg_connect(name) as conn:
            conn.execute(f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, v bigint NOT NULL)")
            conn.execute(f"INSERT INTO {TABLE} SELECT g, 0 FROM generate_series(1, %s) g", [rows])
            version = conn.execute("SHOW server_version").fetchone()[0]
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        return name, f"PostgreSQL {version}, synchronous_commit = {sync}"
    path = str(tmp / "limit.sqlite3")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, v integer NOT NULL)")
    conn.executemany(f"INSERT INTO {TABLE} VALUES (?, 0)", [(i,) for i in range(1, rows + 1)])
    conn.close()
    return path, f"SQLite {sqlite3.sqlite_version}, WAL, synchronous = FULL"


def teardown(db: str, target: str) -> None:
    if db == "postgres":
        _pg_admin(f"DROP DATABASE IF EXISTS {_quote(target)} WITH (FORCE)")


def add_measure_arguments(
    parser: argparse.ArgumentParser, connections: str = "1,2,4,8", seconds: float = 5.0
) -> None:
    """The options of a script that measures commits per second over connection counts
    (``--connections``, ``--seconds``, ``--json``); :func:`connection_counts` reads the first."""
    parser.add_argument("--connections", default=connections, help="counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=seconds, help="per measurement")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the figures here")


def connection_counts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The ``--connections`` counts, or the parser's usage error."""
    counts = [int(part) for part in args.connections.split(",") if part]
    if not counts or min(counts) < 1:
        parser.error("--connections needs positive counts")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    add_measure_arguments(parser)
    args = parser.parse_args(argv)
    counts = connection_counts(parser, args)
    dbs = ["sqlite", "postgres"] if args.db == "all" else [args.db]
    print(f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="selvedge-limit-") as tmp:
        for db in dbs:
            target, described = setup(db, max(counts), Path(tmp))
            try:
                print(f"== {db}: {described} ==")
                print("  single-row UPDATE ... COMMIT, one row per connection")
                results[db] = {}
                for count in counts:
                    rate = measure(db, target, count, args.seconds)
                    results[db][str(count)] = rate
                    print(f"  {count:>3} connection(s)  {rate:>10,.0f} commits/s")
            finally:
                teardown(db, target)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
