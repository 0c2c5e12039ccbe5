"""Workflows of the scale benchmarks (``bench/bench_scale.py``, ``bench/compare_dbos.py``).

Imported by the benchmark process after Django is set up, and by its worker
processes through ``SELVEDGE["MODULES"]`` in ``bench/scale_settings.py``. The
DBOS side of the comparison (``bench/dbos_side.py``) defines the same shapes.
"""

from __future__ import annotations

import time
from typing import Any

import selvedge_django as sv


@sv.activity(name="bench.scale.add_one")
def add_one(x: int) -> int:
    return x + 1


@sv.activity(name="bench.scale.double")
def double(x: int) -> int:
    return x * 2


@sv.activity(name="bench.scale.label")
def label(x: int) -> str:
    return f"n={x}"


@sv.workflow(name="bench.scale.three_steps")
def three_steps(ctx: sv.WorkflowContext, x: int) -> str:
    """Three trivial activities in a row (the throughput workload)."""
    return label.execute(ctx, double.execute(ctx, add_one.execute(ctx, x)))


def three_steps_output(x: int) -> str:
    return f"n={(x + 1) * 2}"


@sv.workflow(name="bench.scale.one_step")
def one_step(ctx: sv.WorkflowContext, x: int) -> int:
    """One trivial activity (the start-to-result latency workload)."""
    return add_one.execute(ctx, x)


@sv.workflow(name="bench.scale.signal_wake")
def signal_wake(ctx: sv.WorkflowContext, _: Any) -> float:
    """Wait for a signal on "go"; return the wall time at which the workflow woke.

    The value is read live after the receive returned (a benchmark probe, not a
    deterministic workflow): it is the moment workflow code ran again.
    """
    ctx.receive("go")
    return time.time()


@sv.workflow(name="bench.scale.sleep_until")
def sleep_until(ctx: sv.WorkflowContext, until: str) -> str:
    """Sleep on a durable timer until the ISO datetime ``until``."""
    from datetime import datetime

    ctx.sleep_until(datetime.fromisoformat(until))
    return until


@sv.workflow(name="bench.scale.history")
def long_history(ctx: sv.WorkflowContext, events: int) -> None:
    """Record ``events`` now() commands, then receive from "go" forever (resume cost)."""
    for _ in range(events):
        ctx.now()
    while True:
        ctx.receive("go")


# -- statement counts per durable operation (bench_scale.py --only counts) -------------

BACKGROUND_QUEUE = "bench-background"


@sv.activity(name="bench.scale.background_add_one", queue=BACKGROUND_QUEUE)
def background_add_one(x: int) -> int:
    return x + 1


@sv.workflow(name="bench.scale.units")
def units(ctx: sv.WorkflowContext, data: dict[str, Any]) -> int:
    """``count`` units of one kind: inline steps, background steps, sleeps or signals."""
    kind, count, total = data["kind"], data["count"], 0
    for i in range(count):
        if kind == "inline":
            total += add_one.execute(ctx, i)
        elif kind == "background":
            total += background_add_one.execute(ctx, i)
        elif kind == "sleep":
            ctx.sleep(0.001)
        elif kind == "signal":
            total += ctx.receive("go")
    return total
