"""Histories, inboxes and statements at their limits."""

from __future__ import annotations

from typing import Any

import selvedge_django as sv

from .waits import wait_manual


@sv.activity(name="limits.text")
def limits_text(size: int) -> str:
    """Return ``size`` characters."""
    return "t" * size


@sv.workflow(name="limits.grow")
def limits_grow(ctx: sv.WorkflowContext, data: dict[str, Any]) -> int:
    """Record ``steps`` commands (now(), or activities returning ``size`` characters)."""
    for _ in range(data["steps"]):
        if data.get("size"):
            limits_text.execute(ctx, data["size"])
        else:
            ctx.now()
    return data["steps"]


@sv.workflow(name="limits.inbox")
def limits_inbox(ctx: sv.WorkflowContext, count: int) -> list[Any]:
    """Receive ``count`` signals from "go", one at a time."""
    return [ctx.receive("go") for _ in range(count)]


@sv.workflow(name="limits.wait_many")
def limits_wait_many(ctx: sv.WorkflowContext, count: int) -> int:
    """Wait until ``count`` signals of "many" are delivered, in one predicate."""
    ctx.wait_condition(lambda: ctx.pending("many") >= count)
    return ctx.pending("many")


@sv.workflow(name="limits.cancel_many")
def limits_cancel_many(ctx: sv.WorkflowContext, data: dict[str, int]) -> int:
    """Issue ``tasks`` activities (never served) and ``children`` children in a scope,
    cancel the scope, then start ``orphans`` more children and close, leaving them running."""
    scoped, cancel = ctx.with_cancel()
    for _ in range(data["tasks"]):
        wait_manual.execute_async(scoped, "never run")
    for _ in range(data["children"]):
        scoped.start_child("child.waiter")
    cancel()
    for _ in range(data["orphans"]):
        ctx.start_child("child.waiter")
    return data["tasks"] + data["children"] + data["orphans"]
