"""Workflows of the recovery tests (resume, fork: tests/integration/test_resume.py).

``BROKEN`` is the bug an operator fixes before resuming: while a name is in it,
the activity of that name fails. ``RUNS`` counts each activity's bodies.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import selvedge_django as sv

BROKEN: set[str] = set()
RUNS: Counter[str] = Counter()

_TWICE = sv.RetryPolicy(max_attempts=2, initial_interval=0.01, max_interval=0.01)


@sv.activity(name="resume.reserve")
def reserve(order: str) -> str:
    RUNS["reserve"] += 1
    return f"reserved {order}"


@sv.activity(name="resume.charge", retry_policy=_TWICE)
def charge(order: str) -> str:
    RUNS["charge"] += 1
    if "charge" in BROKEN:
        raise ValueError("card declined")
    return f"charged {order}"


@sv.workflow(name="resume.order")
def order(ctx: sv.WorkflowContext, name: str) -> dict[str, Any]:
    """Reserve, wait for "go", charge (broken while BROKEN holds "charge"), done."""
    reserved = reserve.execute(ctx, name)
    go = ctx.receive("go")
    charged = charge.execute(ctx, name)
    return {"reserved": reserved, "go": go, "charged": charged}


@sv.workflow(name="resume.signals")
def signals(ctx: sv.WorkflowContext, _: Any) -> list[Any]:
    """Receive two signals on "in", then charge: the charge's failure closes it."""
    got = [ctx.receive("in"), ctx.receive("in")]
    charge.execute(ctx, "signals")
    return got


@sv.workflow(name="resume.child")
def child(ctx: sv.WorkflowContext, name: str) -> str:
    return charge.execute(ctx, name)


@sv.workflow(name="resume.parent")
def parent(ctx: sv.WorkflowContext, name: str) -> str:
    """Start a resume.child and return its result (its failure closes this run)."""
    return ctx.start_child(child, name, child_id=f"{name}-child").get(ctx)


@sv.workflow(name="resume.caught")
def caught(ctx: sv.WorkflowContext, name: str) -> str:
    """Catch the charge's failure, then fail with another error of its own."""
    try:
        charge.execute(ctx, name)
    except sv.SelvedgeError:
        pass
    if "caught" in BROKEN:
        raise sv.ApplicationError("still broken", type="Broken", non_retryable=True)
    return "recovered"


@sv.workflow(name="resume.reserving_child")
def reserving_child(ctx: sv.WorkflowContext, name: str) -> str:
    return reserve.execute(ctx, name)


@sv.workflow(name="resume.default_child_parent")
def default_child_parent(ctx: sv.WorkflowContext, name: str) -> dict[str, str]:
    """A child under its default id completes; then the charge (broken) closes the run."""
    reserved = ctx.start_child(reserving_child, name).get(ctx)
    return {"reserved": reserved, "charged": charge.execute(ctx, name)}
