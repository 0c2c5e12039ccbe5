"""Poison instances and dispatch fairness."""

from __future__ import annotations

from typing import Any

import selvedge_django as sv

from .basics import add


@sv.workflow(name="fair.busy")
def fair_busy(ctx: sv.WorkflowContext, rounds: int) -> int:
    """Sleep a millisecond ``rounds`` times: runnable again right after each suspension."""
    for _ in range(rounds):
        ctx.sleep(0.001)
    return rounds


@sv.workflow(name="fair.late")
def fair_late(ctx: sv.WorkflowContext, tag: str) -> str:
    """Complete in one execution (a name that sorts after fair.busy)."""
    return tag


@sv.workflow(name="poison.sleep")
def poison_sleep(ctx: sv.WorkflowContext, seconds: float) -> str:
    """Arm one timer (the statement the poison tests make fail on every replay)."""
    ctx.sleep(seconds)
    return "woke"


@sv.workflow(name="poison.options")
def poison_options(ctx: sv.WorkflowContext, options: dict[str, Any]) -> str:
    """Run test.add with options built from ``options`` (a duration too long for the database)."""
    policy = options.pop("retry_policy", None)
    built = sv.ActivityOptions(**options, retry_policy=sv.RetryPolicy(**policy) if policy else None)
    return str(add.execute(ctx, {"a": 1, "b": 2}, options=built))


@sv.workflow(name="poison.wait")
def poison_wait(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Wait with a receive timeout or a sleep of ``data["seconds"]`` (too long to store)."""
    if data["form"] == "receive":
        try:
            ctx.receive_with_timeout("never", data["seconds"])
        except sv.ReceiveTimeout:
            return "timeout"
        return "received"
    ctx.sleep(data["seconds"])
    return "slept"
