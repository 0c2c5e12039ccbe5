#!/usr/bin/env python
"""What a NOTIFY inside a commit costs on PostgreSQL, as connections grow.

    python bench/bench_notify.py [--connections 1,4,16] [--seconds S] [--json PATH]

Each of N processes commits, as fast as it can, a single-row ``UPDATE`` of its own
row (the ceiling of ``bench/limit.py``), in three ways:

* ``none``: the update alone;
* ``inside``: the update and a ``pg_notify`` in one statement, so the commit notifies
  (how a write that makes work available wakes workers: they must not hear of it
  before it commits, nor miss it if it commits);
* ``after``: the update, committed, then ``pg_notify`` in a statement of its own (how
  the engine sends a waiter's hint: a close for ``wait_workflow``, a stream entry).

PostgreSQL takes one database-wide lock when a transaction that notified commits and
holds it until the commit's WAL is flushed: notifying commits run one at a time and
cannot share a flush, so ``inside`` stops scaling with connections. A statement that
only notifies writes no WAL (its commit is not flushed) and holds the lock briefly.
Nobody listens here; a listener adds the cost of reading the queue, not of the lock.
Figures are commits per second, and each mode against ``none`` in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.limit import (  # noqa: E402 - path first
    TABLE,
    _pg_connect,
    add_measure_arguments,
    connection_counts,
    measure,
    setup,
    teardown,
)

MODES = ("none", "inside", "after")


def _writer(mode: str, target: str, row: int, start: Any, seconds: float, out: Any) -> None:
    """One connection committing single-row updates, notifying as ``mode`` says."""
    conn = _pg_connect(target)
    conn.autocommit = True  # every statement is its own transaction
    update = f"UPDATE {TABLE} SET v = v + 1 WHERE id = %s"
    inside = f"WITH u AS ({update} RETURNING id) SELECT pg_notify('bench_notify', 'x') FROM u"

    def commit_one() -> None:
        if mode == "inside":
            conn.execute(inside, [row])
            return
        conn.execute(update, [row])
        if mode == "after":
            conn.execute("SELECT pg_notify('bench_notify', 'x')")

    commit_one()  # warm: the connection and the row are ready before the clock starts
    start.wait()
    commits = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        commit_one()
        commits += 1
    conn.close()
    out.put(commits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_measure_arguments(parser, connections="1,4,16", seconds=3.0)
    args = parser.parse_args(argv)
    counts = connection_counts(parser, args)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        target, described = setup("postgres", max(counts), Path(tmp))
        try:
            print(f"{described}; commits per second, each mode against 'none' in the same run")
            print(f"  {'connections':>11}  " + "  ".join(f"{m:>16}" for m in MODES))
            for count in counts:
                rates = {m: measure(m, target, count, args.seconds, _writer) for m in MODES}
                figures[str(count)] = rates
                cells = [f"{rates[m]:8.0f} ({rates[m] / rates['none']:4.2f}x)" for m in MODES]
                print(f"  {count:>11}  " + "  ".join(f"{c:>16}" for c in cells), flush=True)
        finally:
            teardown("postgres", target)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
