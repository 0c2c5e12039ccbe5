"""Cancellation: requests, scopes, cleanups and misuse."""

from __future__ import annotations

import time
from typing import Any

import selvedge_django as sv

from ..models import Ledger
from .basics import add, record

UNSERVED = sv.ActivityOptions(queue="cancel.unserved")  # workers in these tests serve "" only


@sv.activity(name="cancel.stubborn")
def stubborn(data: dict[str, Any]) -> str:
    """Heartbeat until told to stop, then try to record a late result anyway."""
    Ledger.objects.create(entry=f"started:{data['entry']}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            sv.heartbeat()
        except sv.ActivityCancelled:
            Ledger.objects.create(entry=f"heartbeat-raised:{data['entry']}")
            return "late result"
        time.sleep(0.02)
    return "never stopped"


@sv.workflow(name="cancel.wait")
def cancel_wait(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Block at one kind of wait (an hour, or forever) until cancellation reaches it."""
    kind = data["kind"]
    if kind == "sleep":
        ctx.sleep(3600)
    elif kind == "receive":
        ctx.receive("work")
    elif kind == "receive_with_timeout":
        ctx.receive_with_timeout("work", 3600)
    elif kind == "wait_condition":
        ctx.wait_condition(lambda: False)
    elif kind == "timer_get":
        ctx.new_timer(3600).get(ctx)
    elif kind == "future_get":
        add.execute_async(ctx, {"a": 1, "b": 1}, options=UNSERVED).get(ctx)
    elif kind == "child_get":
        ctx.start_child("child.waiter").get(ctx)
    return "not cancelled"


@sv.workflow(name="cancel.reads")
def cancel_reads(ctx: sv.WorkflowContext, _: Any) -> dict[str, Any]:
    """After a request: reads that ignore it, a stored outcome that wins, then catch and return."""
    future = add.execute_async(ctx, {"a": 2, "b": 3})
    ctx.detached().receive("go")
    out: dict[str, Any] = {"ready": future.is_ready(), "value": future.get(ctx)}
    try:
        ctx.receive("work")
    except sv.WorkflowCancelled as error:
        out["receive"] = [type(error).__name__, error.instance_id, error.reason]
    try:
        ctx.receive_with_timeout("work", 3600)
    except sv.WorkflowCancelled as error:
        out["receive_with_timeout"] = type(error).__name__
    try:
        ctx.receive_with_timeout("work", 0)
    except sv.ReceiveTimeout as error:
        out["zero_timeout"] = type(error).__name__
    ctx.wait_condition(lambda: ctx.pending("work") == 1)  # true: no cancellation observed
    out["pending"] = ctx.pending("work")
    out["now"] = ctx.now().isoformat()
    out["receive_async"] = list(ctx.receive_async("work"))
    out["pending_after"] = ctx.pending("work")
    try:
        ctx.sleep(3600)
    except Exception:  # a Cancelled is no Exception: this must not catch it
        out["sleep"] = "caught by except Exception"
    except sv.Cancelled as error:
        out["sleep"] = type(error).__name__
    return out


@sv.workflow(name="cancel.future")
def cancel_future(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """A running activity survives the request until Future.get observes it."""
    future = stubborn.execute_async(ctx, {"entry": data["entry"]})
    ctx.detached().receive("go")
    return future.get(ctx)


@sv.workflow(name="cancel.cleanup")
def cancel_cleanup(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Run a cleanup activity in a detached scope after cancellation, then re-raise."""
    try:
        return ctx.receive("work")
    except sv.WorkflowCancelled:
        record.execute(ctx.detached(), f"cleanup:{ctx.instance_id}")
        raise


@sv.workflow(name="cancel.scope")
def cancel_scope_flow(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Cancel a scope holding a running and a queued task, a timer and a child."""
    scoped, cancel = ctx.with_cancel()
    inner, cancel_inner = scoped.with_cancel()
    running = stubborn.execute_async(scoped, {"entry": data["entry"]})
    queued = add.execute_async(inner, {"a": 1, "b": 1}, options=UNSERVED)
    timer = inner.new_timer(3600)
    child = inner.start_child("child.waiter")
    ctx.detached().new_timer(3600)  # another scope: survives the scope's cancellation
    ctx.receive("go")
    cancel()
    cancel()
    cancel_inner()  # already cancelled through its ancestor
    out: dict[str, Any] = {}
    for name, handle in (("running", running), ("queued", queued), ("timer", timer)):
        try:
            handle.get(ctx)
            out[name] = "value"
        except sv.ScopeCancelled as error:
            out[name] = type(error).__name__
    try:
        child.get(ctx)
    except sv.ScopeCancelled as error:
        out["child"] = type(error).__name__
    # Commands issued in the cancelled scope record cancellation and create nothing.
    late = add.execute_async(scoped, {"a": 5, "b": 5})
    late_child = inner.start_child("child.echo", "late")
    out["late_child_id"] = late_child.id
    for name, call in (
        ("late_activity", lambda: late.get(ctx)),
        ("late_child", lambda: late_child.get(ctx)),
        ("late_sleep", lambda: scoped.sleep(3600)),
        ("late_receive", lambda: inner.receive_with_timeout("work", 3600)),
    ):
        try:
            call()
            out[name] = "value"
        except sv.ScopeCancelled as error:
            out[name] = type(error).__name__
    ctx.receive("finish")
    cancel()
    return out


@sv.workflow(name="cancel.scope_uncaught")
def cancel_scope_uncaught(ctx: sv.WorkflowContext, _: Any) -> str:
    """A scope cancellation that escapes, with no durable request: the instance fails."""
    scoped, cancel = ctx.with_cancel()
    cancel()
    try:
        scoped.sleep(3600)
    except Exception:
        return "caught by except Exception"
    return "not cancelled"


@sv.workflow(name="cancel.scope_choice")
def cancel_scope_choice(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Arm timers inside or outside a scope (per the input), then cancel the scope."""
    scoped, cancel = ctx.with_cancel()
    for inside in data["inside"]:
        (scoped if inside else ctx).new_timer(3600)
    cancel()
    return "cancelled"


@sv.workflow(name="cancel.detached_scope")
def cancel_detached_scope(ctx: sv.WorkflowContext, _: Any) -> list[Any]:
    """with_cancel() under detached(): deaf to the durable request, with its own cancel."""
    cleanup, cancel = ctx.detached().with_cancel()
    ctx.detached().receive("go")
    out: list[Any] = [cleanup.receive("work")]  # the request does not reach this scope
    cancel()
    try:
        cleanup.receive("work")
    except sv.ScopeCancelled as error:
        out.append(type(error).__name__)
    try:
        ctx.receive("work")
    except sv.WorkflowCancelled as error:
        out.append(type(error).__name__)
    return out


@sv.workflow(name="cancel.misuse")
def cancel_misuse(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Call a scope's cancel function from a foreign thread or inside a predicate."""
    import threading

    _, cancel = ctx.with_cancel()
    if data["mode"] == "thread":
        seen: list[str] = []

        def call() -> None:
            try:
                cancel()
            except BaseException as error:  # the run fails on the workflow thread
                seen.append(type(error).__name__)

        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
        return seen
    ctx.wait_condition(lambda: cancel() is None)
    return "returned"


@sv.workflow(name="cancel.in_finally")
def cancel_in_finally(ctx: sv.WorkflowContext, _: Any) -> str:
    """Cancel a scope in a finally block: nothing is written while suspending."""
    _, cancel = ctx.with_cancel()
    try:
        ctx.receive("go")
    finally:
        cancel()
    return "done"


@sv.workflow(name="cancel.unawaited")
def cancel_unawaited(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Return with a running and a queued (detached) task, a timer and a child unfinished."""
    stubborn.execute_async(ctx, {"entry": data["entry"]})
    add.execute_async(ctx.detached(), {"a": 1, "b": 2}, options=UNSERVED)
    ctx.detached().new_timer(3600)
    ctx.start_child("child.waiter")
    ctx.detached().receive("go")
    return "returned"
