#!/usr/bin/env python
"""Run every benchmark, one after the other, and print one table of the headline figures.

    python bench/run_all.py [--quick] [--only NAME,...] [--skip NAME,...]

Runs, when present: limit.py (the machine's own commit ceiling), bench_core.py (also
with --background),
bench_scale.py, bench_signals.py, bench_queries.py, bench_admin.py,
explain_plans.py and compare_dbos.py, each in
its own process with a database of its own (created and dropped by the script),
on SQLite and PostgreSQL where the script measures both. Their full output is
printed as they run; the summary table at the end gathers the figures the issue
asks for. ``--quick`` runs small sizes (a smoke run of a few minutes); the full
run takes tens of minutes on a small machine. Needs the project's virtualenv, a
PostgreSQL server (see bench/README.md) and, for the DBOS comparison, access to
PyPI on the first run (compare_dbos.py installs DBOS into its own virtualenv).
Nothing here is part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


@dataclass
class Step:
    name: str
    script: str
    args: list[str] = field(default_factory=list)
    quick: list[str] = field(default_factory=list)
    json: bool = False


STEPS = [
    Step("limit", "limit.py", quick=["--seconds", "1", "--connections", "1,8"], json=True),
    Step("core", "bench_core.py", quick=["--workflows", "50"]),
    Step("core-background", "bench_core.py", ["--background"], quick=["--workflows", "20"]),
    Step("scale", "bench_scale.py", quick=["--quick"], json=True),
    Step("signals", "bench_signals.py", quick=["--signals", "30"]),
    Step("queries", "bench_queries.py"),
    Step("admin", "bench_admin.py", quick=["--instances", "10000"]),
    Step("plans", "explain_plans.py", quick=["--instances", "100000"]),
    Step("dbos", "compare_dbos.py", quick=["--quick"], json=True),
]


@dataclass
class Outcome:
    step: Step
    status: str
    seconds: float
    output: str
    data: dict[str, Any]


def run_step(step: Step, quick: bool, tmp: Path) -> Outcome:
    command = [sys.executable, str(BENCH / step.script), *step.args]
    if quick:
        command += step.quick
    json_path = tmp / f"{step.name}.json"
    if step.json:
        command += ["--json", str(json_path)]
    env = dict(os.environ)
    # A database of its own per script, so that runs never drop each other's.
    env["SELVEDGE_BENCH_PG_NAME"] = f"selvedge_bench_{step.name}_{os.getpid()}"
    print(f"\n######## {step.script} ########", flush=True)
    started = time.monotonic()
    lines: list[str] = []
    proc = subprocess.Popen(
        command,
        cwd=str(BENCH.parent),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    status = "ok" if proc.wait() == 0 else f"failed (exit {proc.returncode})"
    data: dict[str, Any] = {}
    if step.json and json_path.exists():
        try:
            data = json.loads(json_path.read_text())
        except ValueError:
            pass
    return Outcome(step, status, time.monotonic() - started, "".join(lines), data)


# -- extracting the headline figures -----------------------------------------------------

Row = tuple[str, str, str, str, str]  # section, figure, sqlite, postgres, unit


def _blocks(output: str) -> dict[str, str]:
    """Split a script's output into its per-database blocks (``== sqlite: ...``)."""
    parts = re.split(r"^== (sqlite|postgres)\b.*$", output, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def core_rows(out: Outcome) -> list[Row]:
    labels = [
        ("start (start_workflow)", "start"),
        ("dispatch (lease + history load)", "dispatch (lease + history load)"),
        ("activity step (per step)", "activity step, inline"),
        ("close", "close"),
        ("workflow, start to close (3 steps)", "3-step workflow, start to close"),
    ]
    blocks = _blocks(out.output)
    rows: list[Row] = []
    for label, figure in labels:
        cells: dict[str, str] = {}
        for db, text in blocks.items():
            match = re.search(rf"^  {re.escape(label)}\s+([\d.\s]+)$", text, re.MULTILINE)
            if match:
                numbers = match.group(1).split()
                cells[db] = f"{float(numbers[0]):g} / {float(numbers[-1]):g}"
        rows.append(
            (
                "SQL (bench_core)",
                figure,
                cells.get("sqlite", "-"),
                cells.get("postgres", "-"),
                "queries / transactions",
            )
        )
    cells = {}
    for db, text in blocks.items():
        match = re.search(r"^  workflows/s\s+([\d.]+)", text, re.MULTILINE)
        if match:
            cells[db] = match.group(1)
    rows.append(
        (
            "throughput (bench_core)",
            "one in-process Worker, 3-step workflows",
            cells.get("sqlite", "-"),
            cells.get("postgres", "-"),
            "workflows/s",
        )
    )
    return rows


def core_background_rows(out: Outcome) -> list[Row]:
    """Transactions per background step (polls included) from ``bench_core.py --background``."""
    rows: list[Row] = []
    labels = (
        ("driven by run_once()", "background step, driven (no cache, no polls)"),
        ("two started workers", "background step, started workers, polls included"),
    )
    for marker, figure in labels:
        cells: dict[str, str] = {}
        for db, text in _blocks(out.output).items():
            part = text.split(marker, 1)[1] if marker in text else ""
            match = re.search(
                r"^  = background step, polls included\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)$",
                part,
                re.MULTILINE,
            )
            if match:
                cells[db] = f"{float(match.group(1)):g} / {float(match.group(2)):g}"
        rows.append(
            (
                "SQL (bench_core --background)",
                figure,
                cells.get("sqlite", "-"),
                cells.get("postgres", "-"),
                "queries / transactions",
            )
        )
    return rows


def scale_rows(out: Outcome) -> list[Row]:
    data = out.data
    rows: list[Row] = []

    def both(getter: Any, digits: int = 1) -> tuple[str, str]:
        cells = []
        for db in ("sqlite", "postgres"):
            try:
                cells.append(_fmt(getter(data[db]), digits))
            except (KeyError, TypeError):
                cells.append("-")
        return cells[0], cells[1]

    labels = {
        "workflow": "empty workflow: start + dispatch + close",
        "inline": "activity step, inline",
        "background": "activity step, background",
        "sleep": "sleep",
        "signal": "signal",
    }
    for kind, label in labels.items():
        s, p = both(lambda d, k=kind: d["counts"][k]["commits"], 2)
        rows.append(("SQL per unit (bench_scale)", f"{label}: write transactions", s, p, "commits"))
        s, p = both(lambda d, k=kind: d["counts"][k]["transactions"], 2)
        rows.append(("SQL per unit (bench_scale)", f"{label}: all transactions", s, p, "tx"))
    for count in ("1", "2", "4"):
        s, p = both(lambda d, c=count: d["throughput"][c]["workflows_per_s"])
        rows.append(("throughput", f"{count} worker process(es), workflows/s", s, p, "wf/s"))
        s, p = both(lambda d, c=count: d["throughput"][c]["steps_per_s"])
        rows.append(("throughput", f"{count} worker process(es), steps/s", s, p, "steps/s"))
    for section, title in (("latency", "start-to-result"), ("signal", "signal-to-wake")):
        for mode, where in (("in_process", "in-process"), ("worker_process", "other process")):
            for q in ("p50", "p95", "p99"):
                s, p = both(lambda d, a=section, m=mode, k=q: d[a][m][k] * 1000)
                rows.append((title, f"{q}, worker {where}", s, p, "ms"))
    for key, label, unit, digits in (
        ("sleepers", "workflows asleep", "", 0),
        ("threads_idle", "worker threads, idle", "threads", 0),
        ("threads_asleep", "worker threads, all asleep", "threads", 0),
        ("rss_added_mb", "worker memory added by the sleepers", "MB", 1),
        ("fired_per_s", "timers fired", "timers/s", 0),
        ("finished_per_s", "woken workflows closed", "wf/s", 0),
    ):
        s, p = both(lambda d, k=key: d["sleepers"][k], digits)
        rows.append(("sleeping workflows", label, s, p, unit))
    lengths = sorted({int(k) for db in data.values() for k in db.get("resume", {})})
    for length in lengths:
        s, p = both(lambda d, n=length: d["resume"][str(n)]["resume_ms"])
        rows.append(("resume cost", f"{length:,} events, one resumption", s, p, "ms"))
    if lengths:
        s, p = both(lambda d, n=lengths[-1]: d["resume"][str(n)]["ratio"])
        rows.append(("resume cost", f"{lengths[-1]:,} events vs {lengths[0]}", s, p, "x"))
    return rows


def signals_rows(out: Outcome) -> list[Row]:
    rows: list[Row] = []
    blocks = _blocks(out.output)
    for q in ("p50", "p95", "p99"):
        cells = {}
        for db, text in blocks.items():
            match = re.search(rf"signal -> workflow observes.*?{q}\s+([\d.]+) ms", text)
            if match:
                cells[db] = match.group(1)
        rows.append(
            (
                "signal-to-wake (bench_signals)",
                f"{q}, in-process Worker",
                cells.get("sqlite", "-"),
                cells.get("postgres", "-"),
                "ms",
            )
        )
    return rows


def plans_rows(out: Outcome) -> list[Row]:
    statements = len(re.findall(r"^--- ", out.output, re.MULTILINE))
    seq = len(re.findall(r"Seq Scan on (?!pg_)", out.output))
    return [
        ("query plans (PostgreSQL)", "hot statements explained", "-", str(statements), ""),
        ("query plans (PostgreSQL)", "plans with a Seq Scan", "-", str(seq), "should be 0"),
    ]


def limit_rows(out: Outcome) -> list[Row]:
    rows: list[Row] = []
    counts = sorted({int(k) for db in out.data.values() for k in db})
    for count in counts:
        cells = [_fmt(out.data.get(db, {}).get(str(count)), 0) for db in ("sqlite", "postgres")]
        rows.append(
            (
                "ceiling (limit.py)",
                f"{count} connection(s), single-row commits",
                *cells,
                "commits/s",
            )
        )
    return rows


def ceiling_rows(outcomes: list[Outcome]) -> list[Row]:
    """Selvedge's commits per second as a fraction of the machine's ceiling, per database.

    Selvedge's rate is the write transactions per second bench_scale's throughput run
    counted on PostgreSQL (transaction ids taken), or else its throughput times the
    write transactions one of its workflows needs (an empty workflow's, plus an inline
    step's for each step); the ceiling is limit.py's best rate over its connection
    counts.
    """
    by_name = {o.step.name: o for o in outcomes}
    limit, scale = by_name.get("limit"), by_name.get("scale")
    if limit is None or scale is None:
        return []
    rows: list[Row] = []
    for count in ("1", "2", "4"):
        cells = []
        for db in ("sqlite", "postgres"):
            try:
                data = scale.data[db]
                run = data["throughput"][count]
                steps = run["steps_per_s"] / run["workflows_per_s"]
                per_workflow = (
                    data["counts"]["workflow"]["commits"]
                    + steps * data["counts"]["inline"]["commits"]
                )
                ceiling = max(limit.data[db].values())
                rate = run.get("write_transactions_per_s") or run["workflows_per_s"] * per_workflow
                cells.append(f"{rate:,.0f} ({rate / ceiling:.0%})")
            except (KeyError, TypeError, ZeroDivisionError, ValueError):
                cells.append("-")
        rows.append(
            (
                "vs the ceiling",
                f"{count} worker process(es), selvedge commits/s (share of the ceiling)",
                *cells,
                "commits/s",
            )
        )
    return rows


def dbos_rows(out: Outcome) -> list[Row]:
    rows: list[Row] = []
    for row in out.data.get("rows", []):
        ratio = row["selvedge"] / row["dbos"] if row["dbos"] else float("inf")
        rows.append(
            (
                "vs DBOS (PostgreSQL)",
                row["figure"],
                f"DBOS {_fmt(row['dbos'])}",
                f"{_fmt(row['selvedge'])} ({ratio:.2f}x)",
                row["unit"],
            )
        )
    return rows


EXTRACT = {
    "limit": limit_rows,
    "core": core_rows,
    "core-background": core_background_rows,
    "scale": scale_rows,
    "signals": signals_rows,
    "plans": plans_rows,
    "dbos": dbos_rows,
}


def print_summary(outcomes: list[Outcome]) -> None:
    rows: list[Row] = []
    for outcome in outcomes:
        extract = EXTRACT.get(outcome.step.name)
        if extract is not None:
            try:
                rows += extract(outcome)
            except Exception as error:  # a figure that cannot be read is reported, not fatal
                rows.append((outcome.step.script, f"could not read figures: {error}", "", "", ""))
    rows += ceiling_rows(outcomes)
    widths = [
        max(len(r[i]) for r in [*rows, ("section", "figure", "SQLite", "PostgreSQL", "")])
        for i in range(5)
    ]
    print("\n" + "=" * 100)
    print("Summary (vs DBOS rows: SQLite column = DBOS, PostgreSQL column = selvedge_django)")
    header = ("section", "figure", "SQLite", "PostgreSQL", "unit")
    print(
        "  ".join(
            h.ljust(w) if i < 2 or i == 4 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    last = None
    for row in rows:
        section = row[0] if row[0] != last else ""
        last = row[0]
        cells = (section, *row[1:])
        print(
            "  ".join(
                c.ljust(w) if i < 2 or i == 4 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
    print()
    print("Scripts:")
    for outcome in outcomes:
        print(f"  {outcome.step.script:<20} {outcome.status:<22} {outcome.seconds:8.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", default="", help="step names, comma-separated")
    parser.add_argument("--skip", default="", help="step names, comma-separated")
    args = parser.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    skip = {s for s in args.skip.split(",") if s}
    names = {step.name for step in STEPS}
    if (only | skip) - names:
        parser.error(f"unknown steps: {', '.join(sorted((only | skip) - names))}")
    outcomes: list[Outcome] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="selvedge-bench-all-") as tmp:
        for step in STEPS:
            if (only and step.name not in only) or step.name in skip:
                continue
            if not (BENCH / step.script).exists():
                continue
            outcomes.append(run_step(step, args.quick, Path(tmp)))
    print_summary(outcomes)
    print(f"  total {time.monotonic() - started:.1f} s")
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
