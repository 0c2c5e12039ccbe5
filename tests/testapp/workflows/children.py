"""Child workflows: ids, errors, cancellation, trees."""

from __future__ import annotations

import os
import time
from typing import Any

import selvedge_django as sv

from ..models import Ledger


class ChildBroke(Exception):
    """A plain exception a child workflow raises."""


@sv.activity(name="child.hold")
def child_hold(data: dict[str, Any]) -> str:
    """Record a start, then wait while the marker file exists."""
    Ledger.objects.create(entry=f"started:{data['entry']}")
    deadline = time.monotonic() + 60
    while os.path.exists(data["hold_while"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return str(data["entry"])


@sv.workflow(name="child.echo")
def child_echo(ctx: sv.WorkflowContext, value: Any) -> Any:
    return {"echo": value, "id": ctx.instance_id}


@sv.workflow(name="child.waiter")
def child_waiter(ctx: sv.WorkflowContext, _: Any) -> Any:
    return ctx.receive("release")


@sv.workflow(name="child.fail")
def child_fail(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    if data["mode"] == "application":
        raise sv.ApplicationError("child declined", type="ChildDeclined", details={"code": 7})
    raise ChildBroke("child broke")


@sv.workflow(name="child.remote")
def child_remote(ctx: sv.WorkflowContext, value: Any) -> Any:
    """Registered only by the worker process in the test that starts it by name."""
    return {"value": value, "worker": ctx.worker_id}


@sv.workflow(name="child.basic")
def child_basic(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    by_definition = ctx.start_child(child_echo, "a")
    by_name = ctx.start_child("child.echo", "b", child_id=data["child_id"])
    return {
        "ids": [by_definition.id, by_name.id],
        "keys": [by_definition.key, by_name.key],
        "values": [by_definition.get(ctx), by_name.get(ctx)],
    }


@sv.workflow(name="child.duplicate")
def child_duplicate(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[Any]:
    try:
        ctx.start_child("child.echo", "dup", child_id=data["child_id"])
        caught: Any = "started"
    except sv.WorkflowAlreadyStarted as error:
        caught = [type(error).__name__, error.instance_id]
    ctx.receive("go")  # suspend, so the failed start is replayed from history
    return [caught, ctx.start_child("child.echo", "fresh").get(ctx)["echo"]]


@sv.workflow(name="child.errors")
def child_errors(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    child = ctx.start_child("child.fail", data)
    if not data.get("catch"):
        return child.get(ctx)
    try:
        child.get(ctx)
    except sv.ApplicationError as error:
        return {
            "class": type(error).__name__,
            "type": error.type,
            "message": error.message,
            "details": error.details,
        }
    return "no error"


@sv.workflow(name="child.ready")
def child_ready(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[Any]:
    """is_ready() reads the delivered view: a closed child is not ready until delivered."""
    child = ctx.start_child("child.echo", "r")
    child_hold.execute_async(ctx, data).get(ctx)  # Future.get delivers no batch
    before = child.is_ready()
    ctx.wait_condition(child.is_ready)
    return [before, child.is_ready(), child.get(ctx)["echo"]]


@sv.workflow(name="child.cancel_handle")
def child_cancel_handle(ctx: sv.WorkflowContext, _: Any) -> dict[str, Any]:
    waiting = ctx.start_child("child.waiter")
    done = ctx.start_child("child.echo", "kept")
    waiting.cancel(ctx)
    waiting.cancel(ctx)  # a second call on the handle takes no command position
    out: dict[str, Any] = {"ready_after_cancel": waiting.is_ready()}
    try:
        waiting.get(ctx)
    except sv.Cancelled as error:
        out["cancelled"] = type(error).__name__
    ctx.wait_condition(done.is_ready)
    done.cancel(ctx)  # a stored result wins over cancellation
    out["done"] = done.get(ctx)["echo"]
    ctx.receive("go")  # suspend: the next run replays both cancel commands
    return out


@sv.workflow(name="child.tree")
def child_tree(ctx: sv.WorkflowContext, level: int) -> Any:
    if level >= 2:
        return ctx.receive("release")
    return ctx.start_child("child.tree", level + 1).get(ctx)


@sv.workflow(name="child.leave_running")
def child_leave_running(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    children = [ctx.start_child("child.waiter") for _ in range(2)]
    if data.get("fail"):
        raise sv.ApplicationError("parent gave up", type="ParentGaveUp")
    return [child.id for child in children]


@sv.workflow(name="child.of_client")
def child_of_client(ctx: sv.WorkflowContext, _: Any) -> Any:
    child = ctx.start_child("child.waiter")
    try:
        return {"value": child.get(ctx)}
    except sv.WorkflowCancelled as error:
        return {"cancelled": [error.instance_id, error.reason]}
