#!/usr/bin/env python
"""The database's rate for the engine's own step statement, beside the machine's ceiling.

    python bench/step_limit.py [--connections 1,2,4,8] [--seconds S] [--json PATH] [--bare]

PostgreSQL only. An inline activity step costs the engine one statement: the
reservation of the next step, which carries the result of the one before (the
instance row locked and fenced, the previous task completed under its claim, its
history row given the value, the next history row and task inserted). This script
captures that statement, as the engine composes it, from one real workflow run in
this process, then has N processes (one connection each, autocommit, as the
engine runs it) execute it as fast as they can for S seconds, each on instances
of its own leased to the captured worker, every execution completing the task the
one before it reserved. Beside it, in the same run, limit.py's single-row
``UPDATE ... COMMIT`` (the ceiling ``bench/run_all.py`` divides by).

The clients are bare psycopg (no Django, no engine), so the figure is what the
statement itself costs the database and a minimal Python client: the most the
three-step workload could commit with this statement shape if the engine's own
Python cost nothing. The distance from it to ``bench_scale.py``'s write
transactions per second is the engine's share; from limit.py's ceiling to it,
the statement's. Nothing here is part of the test suite.

With ``--bare``, the statement is measured once more after every index of the task
and history tables that is neither a primary key nor unique has been dropped (the
engine needs them to find work; the step's own writes do not): its updates can then
be HOT and its inserts touch only the indexes that keep keys unique. That is the
least these rows can cost the database, whatever the engine's indexes become.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))

from bench.limit import (  # noqa: E402 - the root goes first
    TABLE,
    _pg_connect,
    add_measure_arguments,
    connection_counts,
    measure,
)

INSTANCES_PER_CONNECTION = 50
TASK_TABLE = '"selvedge_django_activitytask"'
# The tables the step statement inserts into and updates, besides the instance's.
STEP_TABLES = ("selvedge_django_activitytask", "selvedge_django_historyevent")


def capture() -> dict[str, Any]:
    """The two reservations of a real run of ``bench.scale.three_steps``: the first step's
    (nothing carried) and the second's (carrying the first step's result), with the
    values they bound."""
    from django.db import connection

    import selvedge_django as sv
    from selvedge_django.testing import run_until_idle
    from selvedge_django.worker import Worker

    statements: list[tuple[str, dict[str, Any]]] = []

    def keep(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if TASK_TABLE in sql and isinstance(params, dict) and "fence_owner" in params:
            statements.append((sql, dict(params)))
        return execute(sql, params, many, context)

    instance_id = sv.start_workflow("bench.scale.three_steps", 1)
    with connection.execute_wrapper(keep):
        run_until_idle(Worker(worker_id="step-limit"))
    first = next(s for s in statements if "claim_task_id" not in s[1])
    carry = next(s for s in statements if "claim_task_id" in s[1])
    return {
        "instance_id": instance_id,
        "first": (first[0], _plain(first[1])),
        "carry": (carry[0], _plain(carry[1])),
    }


def _plain(params: dict[str, Any]) -> dict[str, Any]:
    """The values as another process can take them: Django's choices as their strings."""
    return {
        name: value.value if isinstance(value, str) and hasattr(value, "value") else value
        for name, value in params.items()
    }


def lease_instances(target: str, captured: dict[str, Any], count: int) -> list[str]:
    """``count`` running instances like the captured one, leased to its worker."""
    params = captured["carry"][1]
    ids = [uuid.uuid4().hex for _ in range(count)]
    with _pg_connect(target) as conn:
        columns = [
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_name = 'selvedge_django_workflowinstance' ORDER BY ordinal_position"
            )
        ]
        copied = ", ".join(f'"{c}"' for c in columns if c != "instance_id")
        conn.execute(
            "INSERT INTO selvedge_django_workflowinstance (instance_id, "
            + copied
            + ") SELECT i, "
            + copied
            + " FROM selvedge_django_workflowinstance, unnest(%s::text[]) i"
            " WHERE instance_id = %s",
            [ids, captured["instance_id"]],
        )
        conn.execute(
            "UPDATE selvedge_django_workflowinstance SET status = %s, lease_owner = %s,"
            " lease_epoch = %s, lease_expires_ms = 9000000000000, cancel_requested = false,"
            " runnable = false WHERE instance_id = ANY(%s)",
            [params["fence_running"], params["fence_owner"], params["fence_epoch"], ids],
        )
    return ids


def drop_lookup_indexes(target: str) -> list[str]:
    """Drop the indexes of STEP_TABLES that neither are a primary key nor keep values
    unique; their names, sorted."""
    with _pg_connect(target) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid"
                " JOIN pg_class t ON t.oid = x.indrelid"
                " WHERE t.relname = ANY(%s) AND NOT x.indisprimary AND NOT x.indisunique"
                " ORDER BY c.relname",
                [list(STEP_TABLES)],
            )
        ]
        for name in names:
            conn.execute(f'DROP INDEX "{name}"')
    return names


def _step_writer(
    captured: dict[str, Any],
    instances: list[list[str]],
    db: str,
    target: str,
    row: int,
    start: Any,
    seconds: float,
    out: Any,
) -> None:
    """One connection running the captured reservation chain on its own instances."""
    import time
    import traceback

    from psycopg import _queries

    # The engine keeps its statements' placeholder conversion whatever their length
    # (storage/postgresql/cursor.py); bare psycopg would convert these long ones on
    # every run. Do as the engine does, so the client costs what the engine's does.
    _queries.MAX_CACHED_STATEMENT_LENGTH = 1 << 20
    _queries.MAX_CACHED_STATEMENT_PARAMS = 1 << 10

    old_id = captured["instance_id"]
    first_sql, first = captured["first"]
    carry_sql, carry = captured["carry"]
    new_key, old_key = carry["row_key"], carry["arrive_key"]
    conn = _pg_connect(target)
    conn.autocommit = True
    cursor = conn.cursor()
    # Per instance: the task its last reservation inserted and that reservation's key.
    chains: dict[str, tuple[int | None, str | None, int]] = {
        iid: (None, None, 1) for iid in instances[row - 1]
    }
    order = list(chains)
    # Each measurement starts new chains on the same instances: keys of its own.
    token = uuid.uuid4().hex[:8]

    def step(iid: str) -> None:
        task_id, key, seq = chains[iid]
        template, statement = (first, first_sql) if task_id is None else (carry, carry_sql)
        next_key = f"#{seq}.{token}:{new_key.split(':', 1)[1]}"
        params = {}
        for name, value in template.items():
            if value == old_id:
                value = iid
            elif value == new_key or name in ("row_key", "task_key"):
                value = next_key
            elif value == old_key and name == "arrive_key":
                value = key
            params[name] = value
        params["row_seq"] = params["task_seq"] = seq
        if task_id is not None:
            params["claim_task_id"] = task_id
        fetched = cursor.execute(statement, params).fetchone()
        if fetched is None or fetched[0] != 1 or (task_id is not None and fetched[5] != 1):
            raise RuntimeError(f"the reservation was refused: {fetched}")
        chains[iid] = (int(fetched[2]), next_key, seq + 1)

    try:
        for iid in order:  # warm: each chain started, the statements prepared
            step(iid)
        start.wait()
        commits = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            step(order[commits % len(order)])
            commits += 1
    except Exception:  # the parent prints nan for the count instead of waiting for it
        traceback.print_exc()
        out.put(float("nan"))
        return
    finally:
        conn.close()
    out.put(commits)


def _compare(
    results: dict[str, dict[str, float]],
    prefix: str,
    target: str,
    counts: list[int],
    seconds: float,
    writer: Any,
) -> None:
    """Measure limit.py's update and ``writer`` at each count, alternated, into
    ``results[prefix + "ceiling"]`` and ``results[prefix + "step"]``; print each pair
    and the best step rate against the best ceiling of the same pass."""
    ceilings = results[prefix + "ceiling"] = {}
    steps = results[prefix + "step"] = {}
    for count in counts:
        ceilings[str(count)] = measure("postgres", target, count, seconds)
        steps[str(count)] = measure("postgres", target, count, seconds, writer=writer)
        print(
            f"  {count:>3} connection(s)  {ceilings[str(count)]:>10,.0f}"
            f"  {steps[str(count)]:>10,.0f}"
            f"  ({steps[str(count)] / ceilings[str(count)]:.0%} of the ceiling at this count)"
        )
    best, step = max(ceilings.values()), max(steps.values())
    print(
        f"  best {prefix}step rate {step:,.0f}/s:"
        f" {step / best:.0%} of the best ceiling ({best:,.0f}/s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_measure_arguments(parser)
    parser.add_argument(
        "--bare",
        action="store_true",
        help="measure the statement again with the step tables' lookup indexes dropped",
    )
    args = parser.parse_args(argv)
    counts = connection_counts(parser, args)

    from bench.harness import bench_database

    print(f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs")
    results: dict[str, dict[str, float]] = {}
    with bench_database("postgres", "bench.scale_settings") as info:
        target = os.environ["SELVEDGE_BENCH_PG_NAME"]
        captured = capture()
        with _pg_connect(target) as conn:
            conn.execute(f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, v bigint NOT NULL)")
            conn.execute(
                f"INSERT INTO {TABLE} SELECT g, 0 FROM generate_series(1, %s) g", [max(counts)]
            )
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        ids = lease_instances(target, captured, INSTANCES_PER_CONNECTION * max(counts))
        instances = [
            ids[i * INSTANCES_PER_CONNECTION : (i + 1) * INSTANCES_PER_CONNECTION]
            for i in range(max(counts))
        ]
        step_writer = functools.partial(_step_writer, captured, instances)
        print(f"== postgres: {info['version']}, synchronous_commit = {sync} ==")
        print("  commits/s: limit.py's single-row UPDATE ... COMMIT | the engine's step statement")
        _compare(results, "", target, counts, args.seconds, step_writer)
        if args.bare:
            dropped = drop_lookup_indexes(target)
            print(f"  the same without {len(dropped)} lookup indexes: {', '.join(dropped)}")
            _compare(results, "bare ", target, counts, args.seconds, step_writer)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
