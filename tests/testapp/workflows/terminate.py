"""Terminate: what it cancels, deletes and closes."""

from __future__ import annotations

from typing import Any

import selvedge_django as sv

from .waits import wait_manual


@sv.workflow(name="terminate.everything")
def terminate_everything(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Leave a child, a queued activity (on the unserved "manual" queue) and a timer
    behind, then wait for a signal that never comes."""
    ctx.start_child("child.waiter")
    wait_manual.execute_async(ctx, "never run")
    ctx.new_timer(3600)
    return ctx.receive("never")


@sv.workflow(name="terminate.parent")
def terminate_parent(ctx: sv.WorkflowContext, _: Any) -> dict[str, str]:
    """Wait for a child.waiter child; report what its get() raised."""
    child = ctx.start_child("child.waiter")
    try:
        child.get(ctx)
    except sv.WorkflowTerminated as error:
        return {"error": type(error).__name__, "reason": error.reason, "id": error.instance_id}
    return {"error": ""}


@sv.workflow(name="terminate.timed_parent")
def terminate_timed_parent(ctx: sv.WorkflowContext, seconds: float) -> dict[str, str]:
    """Wait for a child.waiter child started with an execution timeout of ``seconds``;
    report what its get() raised."""
    child = ctx.start_child("child.waiter", execution_timeout=seconds)
    try:
        child.get(ctx)
    except sv.WorkflowTerminated as error:
        return {"error": type(error).__name__, "reason": error.reason, "id": error.instance_id}
    return {"error": ""}
