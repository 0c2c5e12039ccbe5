"""Workflows the schedule tests start."""

from __future__ import annotations

from typing import Any

import selvedge_django as sv


@sv.workflow(name="sched.echo")
def echo(ctx: sv.WorkflowContext, value: Any) -> dict[str, Any]:
    """Return the input and the run's own id (which names its slot)."""
    return {"input": value, "instance_id": ctx.instance_id}


@sv.workflow(name="sched.wait")
def wait(ctx: sv.WorkflowContext, value: Any) -> Any:
    """Run until signalled on ``done`` (a run that overlaps the next slot)."""
    return ctx.receive("done")
