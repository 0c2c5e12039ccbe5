#!/usr/bin/env python
"""selvedge_django against DBOS Transact on the same database server, in one run.

    python bench/compare_dbos.py [--db postgres|sqlite] [--quick] [--workflows N]
                                 [--processes 1,2,4] [--samples N] [--rounds R]
                                 [--json PATH]

The same three cases on both, one after the other:

* throughput: N workflows of three trivial steps, started by a client in one
  transaction while 1, 2 and 4 worker processes wait (selvedge: ``runselvedge
  worker`` processes; DBOS: processes serving a DBOS queue, DBOS's way to spread
  work over processes, filled with ``DBOSClient.enqueue_in_transaction``); from
  the commit to the last completion in the database's own records;
* start-to-result latency of one-step workflows, one at a time, with the
  workflow running in the client's process and in another process;
* signal-to-wake: a workflow blocked waiting for a message (selvedge
  ``ctx.receive``, DBOS ``DBOS.recv``) returns the wall clock at which it woke;
  the figure is that minus the moment the client sent the message.

Both run with their defaults (DBOS queues poll every second; selvedge workers
are woken by LISTEN/NOTIFY). The only setting changed is the DBOS client's
result polling (5 ms instead of 1 s), so that DBOS's figures are not the
benchmark's own polling.

DBOS is installed only for this benchmark, in its own virtualenv: the
``SELVEDGE_BENCH_VENV`` directory (default ``.venv-bench`` in the repository),
created with ``pip install dbos`` on first use. The selvedge side runs in the
interpreter running this script. Databases: the selvedge side's is created by
``bench/bench_scale.py``; DBOS's system database ``selvedge_compare_dbos_<pid>``
is created here and dropped at the end. With ``--db sqlite`` each side has a
fresh SQLite file in a temporary directory on the same disk: selvedge's in WAL
mode with ``synchronous = FULL`` (its default), DBOS's with DBOS's own settings
(printed with its version).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import venv
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import _pg_admin, _quote  # noqa: E402 - the repository root goes first


def bench_venv(db: str) -> Path:
    """The benchmark virtualenv's interpreter, with DBOS installed (created on first use).

    For SQLite it also gets ``pysqlite3-binary`` when the interpreter's SQLite is older
    than DBOS's schema needs (3.42)."""
    root = Path(os.environ.get("SELVEDGE_BENCH_VENV", REPO_ROOT / ".venv-bench"))
    python = root / "bin" / "python"
    if not python.exists():
        print(f"creating {root} for DBOS Transact ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(root)
    wanted = {"dbos": ["dbos", "psycopg[binary]"]}
    if db == "sqlite":
        old = "import sqlite3, sys; sys.exit(sqlite3.sqlite_version_info < (3, 42))"
        if subprocess.run([str(python), "-c", old]).returncode != 0:
            wanted["pysqlite3"] = ["pysqlite3-binary"]
    for module, packages in wanted.items():
        probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True)
        if probe.returncode != 0:
            print(f"installing {' '.join(packages)} into the benchmark virtualenv ...", flush=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
    return python


def pg_url(name: str) -> str:
    user = os.environ.get("SELVEDGE_PG_USER", "postgres")
    password = os.environ.get("SELVEDGE_PG_PASSWORD", "")
    host = os.environ.get("SELVEDGE_PG_HOST", "127.0.0.1")
    port = os.environ.get("SELVEDGE_PG_PORT", "5432")
    auth = f"{user}:{password}" if password else user
    return f"postgresql://{auth}@{host}:{port}/{name}"


def run_selvedge(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [sys.executable, str(REPO_ROOT / "bench" / "bench_scale.py"), "--db", args.db]
    command += ["--only", "throughput,latency,signal", "--json", str(out)]
    command += ["--workflows", str(args.workflows), "--samples", str(args.samples)]
    command += ["--processes", ",".join(map(str, args.processes))]
    subprocess.run(command, check=True)
    return dict(json.loads(out.read_text())[args.db])


def run_dbos(args: argparse.Namespace, python: Path, out: Path) -> dict[str, Any]:
    if args.db == "sqlite":
        url = f"sqlite:///{out.parent / 'dbos.sqlite3'}"
        subprocess.run([*dbos_command(args, python, out), "--url", url], check=True)
        return dict(json.loads(out.read_text()))
    name = f"selvedge_compare_dbos_{os.getpid()}"
    _pg_admin(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
    _pg_admin(f"CREATE DATABASE {_quote(name)}")
    try:
        subprocess.run([*dbos_command(args, python, out), "--url", pg_url(name)], check=True)
    finally:
        _pg_admin(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
    return dict(json.loads(out.read_text()))


def dbos_command(args: argparse.Namespace, python: Path, out: Path) -> list[str]:
    command = [str(python), str(REPO_ROOT / "bench" / "dbos_side.py"), "run", "--json", str(out)]
    command += ["--workflows", str(args.workflows), "--samples", str(args.samples)]
    command += ["--processes", ",".join(map(str, args.processes))]
    return command


def rows(ours: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    """(figure, selvedge, DBOS, unit) for every figure both sides measured."""
    table: list[tuple[str, float, float, str]] = []
    for count, run in ours.get("throughput", {}).items():
        other = theirs.get("throughput", {}).get(count)
        if other:
            plural = "es" if int(count) > 1 else ""
            table.append(
                (
                    f"throughput, {count} worker process{plural}",
                    run["workflows_per_s"],
                    other["workflows_per_s"],
                    "workflows/s",
                )
            )
    for section, title in (("latency", "start-to-result"), ("signal", "signal-to-wake")):
        for mode, where in (("in_process", "in-process"), ("worker_process", "other process")):
            mine = ours.get(section, {}).get(mode)
            other = theirs.get(section, {}).get(mode)
            if not (mine and other):
                continue
            for q in ("p50", "p95", "p99"):
                table.append((f"{title} {q}, {where}", mine[q] * 1000, other[q] * 1000, "ms"))
    return table


def print_table(
    table: list[tuple[str, float, float, str]], ours: str, theirs: str, db: str
) -> None:
    where = "same PostgreSQL server" if db == "postgres" else "SQLite files on the same disk"
    print(f"selvedge_django ({ours}) vs {theirs}, {where}, same run")
    print(f"  {'figure':<40}{'selvedge':>12}{'DBOS':>12}  {'unit':<12}{'ratio':>8}  better")
    for figure, mine, other, unit in table:
        higher_is_better = unit.endswith("/s")
        ratio = mine / other if other else float("inf")
        better = (mine >= other) if higher_is_better else (mine <= other)
        print(
            f"  {figure:<40}{mine:>12.1f}{other:>12.1f}  {unit:<12}{ratio:>7.2f}x  "
            f"{'selvedge' if better else 'DBOS'}"
        )
    print("  ratio = selvedge / DBOS (throughput: higher is better; latency: lower is better)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--workflows", type=int, default=None, metavar="N")
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--samples", type=int, default=None, metavar="N")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="R",
        help="run both sides R times, alternating, and report each figure's median",
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="write the figures here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds needs a positive count")
    args.processes = [int(part) for part in args.processes.split(",") if part]
    args.workflows = args.workflows or (100 if args.quick else 1000)
    args.samples = args.samples or (30 if args.quick else 200)

    python = bench_venv(args.db)
    rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="selvedge-compare-") as tmp:
        for number in range(1, args.rounds + 1):
            of = f" (round {number} of {args.rounds})" if args.rounds > 1 else ""
            print(f"== selvedge_django{of} ==", flush=True)
            ours = run_selvedge(args, Path(tmp) / "selvedge.json")
            print(f"== DBOS Transact{of} ==", flush=True)
            theirs = run_dbos(args, python, Path(tmp) / "dbos.json")
            rounds.append((ours, theirs))
    tables = [rows(ours, theirs) for ours, theirs in rounds]
    table = median_table(tables)
    ours, theirs = rounds[-1]
    print()
    print_table(table, ours.get("version", args.db), theirs.get("version", "DBOS"), args.db)
    if args.rounds > 1:
        print(
            f"  each figure the median of {args.rounds} alternated rounds;"
            " throughput ratios by round:"
        )
        for figure, *_ in table:
            if figure.startswith("throughput"):
                ratios = [mine / other for mine, other in by_round(tables, figure) if other]
                print(f"    {figure:<38}" + "  ".join(f"{r:.2f}x" for r in ratios))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "selvedge": ours,  # the last round's
                    "dbos": theirs,
                    "rounds": [{"selvedge": o, "dbos": t} for o, t in rounds],
                    "rows": [
                        {"figure": f, "selvedge": a, "dbos": b, "unit": u} for f, a, b, u in table
                    ],
                },
                indent=2,
            )
        )
    return 0


def median_table(
    tables: list[list[tuple[str, float, float, str]]],
) -> list[tuple[str, float, float, str]]:
    """Each figure's median over the rounds, for each side on its own (the figures of
    the first round, in its order; a figure a round lacks is left out of its median)."""
    merged = []
    for figure, _, _, unit in tables[0]:
        found = by_round(tables, figure)
        merged.append(
            (
                figure,
                statistics.median(mine for mine, _ in found),
                statistics.median(other for _, other in found),
                unit,
            )
        )
    return merged


def by_round(
    tables: list[list[tuple[str, float, float, str]]], figure: str
) -> list[tuple[float, float]]:
    """(selvedge, DBOS) for ``figure`` in each round that measured it."""
    return [(mine, other) for t in tables for name, mine, other, _ in t if name == figure]


if __name__ == "__main__":
    sys.exit(main())
