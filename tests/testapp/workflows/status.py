"""What the status report and the admin's timeline are tested with."""

from __future__ import annotations

from typing import Any

import selvedge_django as sv


@sv.activity(name="status.parked", queue="status-parked")
def parked(value: Any) -> Any:
    """Queued on "status-parked", which the status tests' workers never serve."""
    return value


@sv.workflow(name="status.parked_flow")
def parked_flow(ctx: sv.WorkflowContext, value: Any) -> Any:
    return parked.execute(ctx, value)


@sv.workflow(name="status.nap")
def nap(ctx: sv.WorkflowContext, seconds: float) -> str:
    ctx.sleep(seconds)
    return "rested"


@sv.workflow(name="status.ticks")
def ticks(ctx: sv.WorkflowContext, n: int) -> int:
    """Receive ``n`` "tick" signals: one command position each."""
    for _ in range(n):
        ctx.receive("tick")
    return n
