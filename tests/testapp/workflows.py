"""Workflows and activities the test suite (and its worker subprocesses) share."""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import models, transaction

import selvedge_django as sv

from . import schedule_flows  # noqa: F401 - registers the schedule tests' workflows
from .models import Ledger


@sv.activity(name="test.add")
def add(data: dict[str, int]) -> int:
    return data["a"] + data["b"]


@sv.activity(name="test.record")
def record(entry: str) -> str:
    Ledger.objects.create(entry=entry)
    return entry


@sv.activity(name="test.slow_record")
def slow_record(data: dict[str, Any]) -> str:
    """Record an entry after waiting for a marker file to disappear (crash tests)."""
    Ledger.objects.create(entry=f"started:{data['entry']}")
    marker = data.get("hold_while")
    deadline = time.monotonic() + 60
    while marker and os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return data["entry"]


@sv.workflow(name="test.sum3")
def sum3(ctx: sv.WorkflowContext, data: dict[str, int]) -> int:
    x = add.execute(ctx, {"a": data["a"], "b": data["b"]})
    y = add.execute(ctx, {"a": x, "b": data["c"]})
    return add.execute(ctx, {"a": y, "b": 0})


@sv.workflow(name="test.ledger")
def ledger(ctx: sv.WorkflowContext, entries: list[str]) -> list[str]:
    return [record.execute(ctx, entry) for entry in entries]


@sv.workflow(name="test.crashable")
def crashable(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    first = record.execute(ctx, "before")
    second = slow_record.execute(ctx, data)
    return f"{first}+{second}"


# -- worker and process tests (tests/test_worker.py, tests/test_processes.py) -----------

_FAST_RETRY = {"initial_interval": 0.05, "backoff_coefficient": 1.0, "max_interval": 0.05}


class FlakyError(Exception):
    """A retryable failure of ``test.flaky``."""


class InvalidOrder(Exception):
    """Listed in ``test.reject``'s non_retryable_errors."""


@sv.activity(name="test.flaky", retry_policy=sv.RetryPolicy(max_attempts=3, **_FAST_RETRY))
def flaky(data: dict[str, Any]) -> str:
    """Fail with FlakyError before attempt ``succeed_on`` (0: fail every attempt)."""
    info = sv.activity_info()
    assert info is not None
    Ledger.objects.create(entry=f"flaky:{data['tag']}:{info.attempt}")
    if data.get("succeed_on") and info.attempt >= data["succeed_on"]:
        return f"ok on attempt {info.attempt}"
    raise FlakyError(f"attempt {info.attempt} failed")


@sv.workflow(name="test.flaky_flow")
def flaky_flow(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    options = None
    if "max_attempts" in data:
        policy = sv.RetryPolicy(max_attempts=data["max_attempts"], **_FAST_RETRY)
        options = sv.ActivityOptions(retry_policy=policy)
    return flaky.execute(ctx, data, options=options)


@sv.activity(
    name="test.reject",
    retry_policy=sv.RetryPolicy(max_attempts=5, non_retryable_errors=[InvalidOrder], **_FAST_RETRY),
)
def reject(data: dict[str, Any]) -> str:
    """Fail for good: ApplicationError(non_retryable=True) or a listed error class."""
    Ledger.objects.create(entry=f"reject:{data['mode']}")
    if data["mode"] == "application":
        raise sv.ApplicationError(
            "card declined", type="PaymentDeclined", details={"code": 51}, non_retryable=True
        )
    raise InvalidOrder(f"order {data.get('order', '?')} is invalid")


@sv.workflow(name="test.reject_flow")
def reject_flow(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Call test.reject; with ``catch`` return what workflow code received instead."""
    if not data.get("catch"):
        return reject.execute(ctx, data)
    try:
        return reject.execute(ctx, data)
    except sv.ApplicationError as error:
        return {
            "class": type(error).__name__,
            "type": error.type,
            "message": error.message,
            "details": error.details,
            "non_retryable": error.non_retryable,
        }


@sv.activity(name="test.hold")
def hold(data: dict[str, Any]) -> str:
    """Record a start, then wait (heartbeating) while the marker file exists."""
    Ledger.objects.create(entry=f"started:{data['entry']}")
    deadline = time.monotonic() + 60
    while os.path.exists(data["hold_while"]) and time.monotonic() < deadline:
        sv.heartbeat()  # raises ActivityCancelled once this attempt has to stop
        time.sleep(0.02)
    Ledger.objects.create(entry=f"done:{data['entry']}")
    return data["entry"]


@sv.workflow(name="test.hold_then_record")
def hold_then_record(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    held = hold.execute(ctx, data)
    after = record.execute(ctx, f"after:{data['entry']}")
    return f"{held}+{after}"


@sv.activity(
    name="test.tx_record",
    transactional=True,
    retry_policy=sv.RetryPolicy(max_attempts=3, **_FAST_RETRY),
)
def tx_record(data: dict[str, Any]) -> str:
    """Write a Ledger row inside the attempt's transaction, then maybe fail or lose the claim."""
    from selvedge_django.models import ActivityTask

    info = sv.activity_info()
    assert info is not None
    entry = f"tx:{data['entry']}:{info.attempt}"
    Ledger.objects.create(entry=entry)
    if info.attempt in data.get("fail_on", ()):
        raise RuntimeError(f"attempt {info.attempt} failed after writing")
    if info.attempt in data.get("lose_claim_on", ()):
        # Another owner takes the task over while this attempt runs.
        ActivityTask.objects.filter(instance_id=info.instance_id, key=info.activity_id).update(
            claim_epoch=models.F("claim_epoch") + 1
        )
    return entry


@sv.workflow(name="test.tx_flow")
def tx_flow(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    return tx_record.execute(ctx, data)


@sv.activity(name="test.in_atomic")
def in_atomic(_: Any) -> bool:
    return transaction.get_connection().in_atomic_block


@sv.activity(name="test.in_atomic_tx", transactional=True)
def in_atomic_tx(_: Any) -> bool:
    return transaction.get_connection().in_atomic_block


@sv.workflow(name="test.atomic_probe")
def atomic_probe(ctx: sv.WorkflowContext, _: Any) -> list[bool]:
    return [in_atomic.execute(ctx), in_atomic_tx.execute(ctx)]


# -- many workers on one database (tests/test_scale.py) --------------------------------


@sv.activity(name="scale.step")
def scale_step(data: dict[str, Any]) -> int:
    """Record ``scale:<tag>:<i>`` (a second run of one attempt would record it twice)."""
    Ledger.objects.create(entry=f"scale:{data['tag']}:{data['i']}")
    return int(data["i"]) + 1


@sv.workflow(name="scale.three")
def scale_three(ctx: sv.WorkflowContext, tag: str) -> int:
    """Three recorded steps in a row; returns 1 + 2 + 3."""
    return sum(scale_step.execute(ctx, {"tag": tag, "i": i}) for i in range(3))


@sv.activity(name="scale.on_queue")
def scale_on_queue(data: dict[str, Any]) -> int:
    """Record which queue's task this process ran: ``scale.queue:<queue>:<tag>:<pid>``."""
    Ledger.objects.create(entry=f"scale.queue:{data['queue']}:{data['tag']}:{os.getpid()}")
    return os.getpid()


@sv.workflow(name="scale.queued")
def scale_queued(ctx: sv.WorkflowContext, data: dict[str, Any]) -> int:
    """Run scale.on_queue on ``data["queue"]``; return the pid of the process that ran it."""
    options = sv.ActivityOptions(queue=data["queue"])
    return scale_on_queue.execute(ctx, data, options=options)


# -- faults and crashes (tests/test_crash_matrix.py, tests/test_faults.py, bench/soak.py) --

FAULT_PARKED_QUEUE = "fault.parked"  # no worker of the fault tests serves it

_FAULT_RETRY = sv.RetryPolicy(
    max_attempts=5, initial_interval=0.05, backoff_coefficient=1.0, max_interval=0.05
)


class FaultStepError(Exception):
    """A retryable failure of ``fault.step``."""


@sv.activity(name="fault.step", retry_policy=_FAULT_RETRY)
def fault_step(data: dict[str, Any]) -> str:
    """Record ``fault:<tag>:<attempt>``; fail (retryably) before attempt ``succeed_on``."""
    info = sv.activity_info()
    assert info is not None
    Ledger.objects.create(entry=f"fault:{data['tag']}:{info.attempt}")
    if info.attempt < data.get("succeed_on", 1):
        raise FaultStepError(f"attempt {info.attempt} of {data['tag']} failed")
    return str(data["tag"])


@sv.workflow(name="fault.child")
def fault_child(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    return "child:" + fault_step.execute(ctx, {"tag": data["tag"]})


@sv.workflow(name="fault.flow")
def fault_flow(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Every kind of durable step once: activities (one retried), a timer, two signals on
    ``go`` (one with a timeout), a child, and a cancelled scope holding a timer and a
    task that no worker serves."""
    tag = data["tag"]
    first = fault_step.execute(ctx, {"tag": f"{tag}:first"})
    flaky = fault_step.execute(ctx, {"tag": f"{tag}:flaky", "succeed_on": 2})
    ctx.sleep(data.get("sleep", 0.1))
    signals = [ctx.receive("go"), ctx.receive_with_timeout("go", 600)]
    child = ctx.start_child("fault.child", {"tag": f"{tag}:child"}).get(ctx)
    scoped, cancel = ctx.with_cancel()
    timer = scoped.new_timer(3600)
    parked = fault_step.execute_async(
        scoped, {"tag": f"{tag}:parked"}, options=sv.ActivityOptions(queue=FAULT_PARKED_QUEUE)
    )
    cancel()
    cancelled = 0
    for handle in (timer, parked):
        try:
            handle.get(ctx)
        except sv.ScopeCancelled:
            cancelled += 1
    return {
        "first": first,
        "flaky": flaky,
        "signals": signals,
        "child": child,
        "cancelled": cancelled,
    }


@sv.activity(name="fault.hold", retry_policy=_FAULT_RETRY)
def fault_hold(data: dict[str, Any]) -> str:
    """Hold while the ``hold_while`` file exists (never heartbeating); return the attempt."""
    info = sv.activity_info()
    assert info is not None
    Ledger.objects.create(entry=f"fault.hold:{data['tag']}:{info.attempt}:start")
    deadline = time.monotonic() + 60
    while os.path.exists(data["hold_while"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    Ledger.objects.create(entry=f"fault.hold:{data['tag']}:{info.attempt}:done")
    return f"{data['tag']}:attempt {info.attempt}"


@sv.workflow(name="fault.stall")
def fault_stall(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    held = fault_hold.execute(ctx, data)
    return [held, fault_step.execute(ctx, {"tag": f"{data['tag']}:after"})]


@sv.activity(name="fault.sized", retry_policy=_FAULT_RETRY)
def fault_sized(data: dict[str, Any]) -> str:
    """Return ``size`` characters, or fail with a message and details that large."""
    Ledger.objects.create(entry=f"fault.sized:{data.get('tag', '')}")
    if data.get("fail"):
        raise sv.ApplicationError(
            "m" * data["size"],
            type="Huge",
            details={"blob": "d" * data["size"]},
            non_retryable=True,
        )
    return "x" * data["size"]


@sv.workflow(name="fault.limits")
def fault_limits(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Exercise MAX_PAYLOAD_BYTES on one path (``mode``) with a value of ``size``."""
    mode, size = data["mode"], data["size"]
    if mode == "output":
        return "o" * size
    if mode == "signal":
        return len(ctx.receive("big"))
    try:
        if mode == "activity_result":
            return len(fault_sized.execute(ctx, {"size": size, "tag": ctx.instance_id}))
        if mode == "activity_error":
            return fault_sized.execute(ctx, {"size": size, "fail": True, "tag": ctx.instance_id})
        if mode == "activity_input":
            return fault_sized.execute(ctx, {"size": 1, "pad": "i" * size})
        if mode == "child_input":
            return ctx.start_child("fault.child", {"tag": "c" * size}).get(ctx)
        if mode == "child_nul":
            return ctx.start_child("fault.child", {"tag": "nul\x00"}).get(ctx)
    except (sv.PayloadTooLarge, sv.WorkflowStartRejected, sv.ApplicationError) as error:
        # What workflow code sees, then one more step: the workflow goes on.
        after = fault_step.execute(ctx, {"tag": f"{ctx.instance_id}:after"})
        return {"error": type(error).__name__, "message": str(error)[:300], "after": after}
    raise ValueError(f"unknown mode {mode!r}")


@sv.activity(name="fault.deep", retry_policy=_FAULT_RETRY)
def fault_deep(depth: int) -> Any:
    """Return a list nested ``depth`` levels deep."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@sv.workflow(name="fault.deep_result")
def fault_deep_result(ctx: sv.WorkflowContext, depth: int) -> Any:
    """Call fault.deep and report the error the workflow sees."""
    try:
        return fault_deep.execute(ctx, depth)
    except sv.ApplicationError as error:
        return {"error": error.type, "message": error.message[:300]}
    except sv.SelvedgeError as error:
        return {"error": type(error).__name__, "message": str(error)[:300]}


# -- history and inbox limits (tests/test_limits.py) --------------------------------------


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


# -- disclosure (tests/test_history.py, tests/test_admin.py) --------------------------------


@sv.workflow(name="disclosure.order")
def disclosure_order(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Hold a secret in the input, a signal payload and an activity result."""
    approval = ctx.receive("approve")
    echoed = limits_text.execute(ctx, len(data["card"]))
    return {"approval": approval, "card": data["card"], "echo": echoed}


# -- cancellation tests (tests/test_cancellation.py) -------------------------------------

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


# -- child workflow tests (tests/test_children.py) ---------------------------------------


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


# -- waits: signals, timers, conditions and workflow time (tests/test_waits.py) ----------


@sv.activity(name="wait.manual", queue="manual")
def wait_manual(data: Any) -> Any:
    """Queued on "manual", which the wait tests' workers never serve: tests complete it."""
    return data


@sv.workflow(name="wait.receive")
def wait_receive(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[Any]:
    """Receive once from each of ``data["channels"]``, in order; return the payloads."""
    return [ctx.receive(channel) for channel in data["channels"]]


@sv.workflow(name="wait.inbox")
def wait_inbox(ctx: sv.WorkflowContext, _: Any) -> dict[str, Any]:
    """receive_async and pending on channel "c" around two batching receives of "go"."""
    seen: dict[str, Any] = {"async_empty": list(ctx.receive_async("c"))}
    seen["pending_before"] = ctx.pending("c")
    seen["go"] = ctx.receive("go")
    seen["pending_after_go"] = ctx.pending("c")
    seen["async"] = list(ctx.receive_async("c"))
    seen["pending_after_async"] = ctx.pending("c")
    ctx.receive("go")
    seen["pending_end"] = ctx.pending("c")
    return seen


@sv.workflow(name="wait.sleep")
def wait_sleep(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sleep ``seconds`` in ``form`` (sleep, timer, until, timedelta); return times around it."""
    from datetime import timedelta

    before = ctx.now()
    seconds = data["seconds"]
    form = data.get("form", "sleep")
    sleep_id = data.get("sleep_id")
    fired_at = None
    if form == "sleep":
        ctx.sleep(seconds, sleep_id=sleep_id)
    elif form == "timedelta":
        ctx.sleep(timedelta(seconds=seconds), sleep_id=sleep_id)
    elif form == "until":
        ctx.sleep_until(before + timedelta(seconds=seconds), sleep_id=sleep_id)
    else:
        fired_at = ctx.new_timer(seconds, sleep_id=sleep_id).get(ctx).isoformat()
    return {"before": before.isoformat(), "after": ctx.now().isoformat(), "fired_at": fired_at}


@sv.workflow(name="wait.timer_handle")
def wait_timer_handle(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """new_timer, optionally a receive of "poke" while it is armed, then Timer.get twice."""
    from datetime import timedelta

    timer = ctx.new_timer(data["seconds"])
    ready_before = timer.is_ready()
    if data.get("poke"):
        ctx.receive("poke")
    fired_at = timer.get(ctx)
    return {
        "key": timer.key,
        "ready_before": ready_before,
        "fired_at": fired_at.isoformat(),
        "utc": fired_at.utcoffset() == timedelta(0),
        "ready_after": timer.is_ready(),
        "get_again_equal": timer.get(ctx) == fired_at,
    }


@sv.workflow(name="wait.bad_duration")
def wait_bad_duration(ctx: sv.WorkflowContext, kind: str) -> str:
    """Issue a wait with a nonsensical duration (the run fails with TypeError/ValueError)."""
    from datetime import datetime

    if kind == "nan":
        ctx.sleep(float("nan"))
    elif kind == "inf_timeout":
        ctx.receive_with_timeout("c", float("inf"))
    elif kind == "string":
        ctx.sleep("5")  # type: ignore[arg-type]
    elif kind == "bool":
        ctx.new_timer(True)
    elif kind == "none":
        ctx.sleep(None)  # type: ignore[arg-type]
    elif kind == "naive_until":
        ctx.sleep_until(datetime(2030, 1, 1))
    elif kind == "until_not_datetime":
        ctx.sleep_until(5)  # type: ignore[arg-type]
    return "no error"


@sv.workflow(name="wait.receive_timeout")
def wait_receive_timeout(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """receive_with_timeout on "c"; then, if ``then`` names a channel, receive from it."""
    try:
        got: Any = {"signal": ctx.receive_with_timeout("c", data["timeout"])}
    except sv.ReceiveTimeout as error:
        got = {"timeout": isinstance(error, TimeoutError)}
    if data.get("then"):
        got["then"] = ctx.receive(data["then"])
    return got


@sv.workflow(name="wait.condition")
def wait_condition_flow(ctx: sv.WorkflowContext, _: Any) -> dict[str, Any]:
    """Wait for either of two activities; report readiness before and after a receive."""
    first = add.execute_async(ctx, {"a": 1, "b": 2})
    second = wait_manual.execute_async(ctx, "manual")
    ctx.wait_condition(lambda: first.is_ready() or second.is_ready())
    seen: dict[str, Any] = {"first": first.is_ready(), "second": second.is_ready()}
    ctx.receive("go")
    seen["second_after_receive"] = second.is_ready()
    seen["values"] = [first.get(ctx), second.get(ctx)]
    return seen


@sv.workflow(name="wait.get_no_batch")
def wait_get_no_batch(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Timer.get returns a fire without delivering an activity result that arrived first."""
    manual = wait_manual.execute_async(ctx, "m")
    timer = ctx.new_timer(data["seconds"])
    timer.get(ctx)
    seen: dict[str, Any] = {"manual_after_get": manual.is_ready(), "timer": timer.is_ready()}
    ctx.wait_condition(lambda: manual.is_ready())
    seen["manual_after_condition"] = manual.is_ready()
    seen["value"] = manual.get(ctx)
    return seen


@sv.workflow(name="wait.bad_predicate")
def wait_bad_predicate(ctx: sv.WorkflowContext, mode: str) -> str:
    """wait_condition with a None, command-issuing, raising or bad-pending predicate."""
    predicate: Any
    if mode == "none":
        predicate = None
    elif mode == "command":

        def predicate() -> bool:
            return ctx.now() is None

    elif mode == "pending":

        def predicate() -> bool:
            return ctx.pending("") > 0

    else:

        def predicate() -> bool:
            raise LookupError("the predicate broke")

    try:
        ctx.wait_condition(predicate)
    except Exception as error:
        return f"swallowed {type(error).__name__}"
    return "returned"


@sv.workflow(name="wait.time")
def wait_time(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    """now() twice, sleep, now(), then a timer's fire: the values workflow code saw."""
    values = [ctx.now(), ctx.now()]
    ctx.sleep(data["seconds"])
    values.append(ctx.now())
    values.append(ctx.new_timer(data["seconds"]).get(ctx))
    return [value.isoformat() for value in values]


@sv.activity(name="wait.hold")
def wait_hold(data: dict[str, Any]) -> str:
    """Record a start, then wait (heartbeating) while the marker file exists."""
    Ledger.objects.create(entry=f"started:{data['entry']}")
    deadline = time.monotonic() + 60
    while os.path.exists(data["hold_while"]) and time.monotonic() < deadline:
        sv.heartbeat()
        time.sleep(0.02)
    return str(data["entry"])


@sv.workflow(name="wait.receive_around_hold")
def wait_receive_around_hold(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[Any]:
    """Run wait.hold inline (the execution keeps its lease), then receive "during"."""
    return [wait_hold.execute(ctx, data), ctx.receive("during")]


def _crash_here(point: str) -> None:
    """SIGKILL this process at ``point`` when the worker was started to crash there."""
    import signal

    if os.environ.get("SELVEDGE_WAIT_CRASH") == point:
        os.kill(os.getpid(), signal.SIGKILL)


@sv.workflow(name="wait.crash_timer")
def wait_crash_timer(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Arm a timer, die before suspending (in the crashing worker), then wait for it."""
    timer = ctx.new_timer(data["seconds"])
    _crash_here("timer_reserved")
    return timer.get(ctx).isoformat()


@sv.workflow(name="wait.crash_receive")
def wait_crash_receive(ctx: sv.WorkflowContext, _: Any) -> list[Any]:
    """Receive twice from "c"; the crashing worker dies inside or right after the first."""
    if os.environ.get("SELVEDGE_WAIT_CRASH") == "receive_mid_commit":
        from django.db import connection

        def die_after_consuming(execute: Any, sql: str, *args: Any) -> Any:
            result = execute(sql, *args)
            if sql.lstrip().upper().startswith("UPDATE") and "consumed_seq" in sql:
                _crash_here("receive_mid_commit")  # inside the observation's transaction
            return result

        connection.execute_wrappers.append(die_after_consuming)
    first = ctx.receive("c")
    _crash_here("receive_committed")
    return [first, ctx.receive("c")]


@sv.workflow(name="wait.deadline")
def wait_deadline(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Wait for wait.manual with a one-hour schedule-to-start timeout."""
    options = sv.ActivityOptions(schedule_to_start_timeout=3600)
    try:
        return wait_manual.execute(ctx, "served", options=options)
    except sv.ActivityTimeoutError as error:
        return {"timeout": error.kind}


@sv.workflow(name="child.catch_get")
def child_catch_get(ctx: sv.WorkflowContext, _: Any) -> str:
    """Catch a cancellation observed by a blocked child.get(), then wait before returning."""
    child = ctx.start_child("child.waiter")
    try:
        child.get(ctx)
        caught = "not cancelled"
    except sv.WorkflowCancelled as error:
        caught = error.reason
    ctx.detached().receive("go")
    return caught


# -- activities at full strength (tests/test_activities.py, tests/test_activity_processes.py)


class StepError(Exception):
    """A retryable failure of ``act.step``."""


class StepRejected(Exception):
    """Listed in ``act.defaults``'s non_retryable_errors."""


def _attempt() -> sv.ActivityInfo:
    info = sv.activity_info()
    assert info is not None
    return info


@sv.activity(
    name="act.step",
    retry_policy=sv.RetryPolicy(
        max_attempts=4, initial_interval=10, backoff_coefficient=2, max_interval=25
    ),
)
def step(data: dict[str, Any]) -> Any:
    """Record attempt ``n`` as ``step:<tag>:<n>``; fail with StepError while n < fail_until."""
    info = _attempt()
    Ledger.objects.create(entry=f"step:{data['tag']}:{info.attempt}")
    if info.attempt in data.get("final_on", ()):
        raise sv.ApplicationError(f"{data['tag']} is final", type="Final", non_retryable=True)
    if info.attempt < data.get("fail_until", 0):
        raise StepError(f"attempt {info.attempt} of {data['tag']} failed")
    if info.attempt in data.get("non_json_on", ()):
        return {"tag": data["tag"], "value": {1, 2}}  # a set is not JSON
    return {"tag": data["tag"], "attempt": info.attempt, "options": info.options.to_json()}


@sv.activity(
    name="act.defaults",
    queue="act-defaults",
    start_to_close_timeout=30,
    schedule_to_start_timeout=60,
    heartbeat_timeout=10,
    retry_policy=sv.RetryPolicy(
        max_attempts=7,
        initial_interval=2,
        backoff_coefficient=3,
        max_interval=50,
        non_retryable_errors=[StepRejected],
    ),
)
def defaults(data: dict[str, Any]) -> Any:
    """Report the recorded options; raise StepRejected (non-retryable) when asked."""
    info = _attempt()
    Ledger.objects.create(entry=f"defaults:{data['tag']}:{info.attempt}")
    if data.get("reject"):
        raise StepRejected(f"{data['tag']} rejected")
    options = info.options
    assert isinstance(options, sv.ActivityOptions), type(options)
    assert isinstance(options.retry_policy, sv.RetryPolicy), options.retry_policy
    assert options.queue == "act-defaults"
    return {"attempt": info.attempt, "options": options.to_json()}


@sv.activity(name="act.wait")
def wait(data: dict[str, Any]) -> str:
    """Hold while the ``hold_while`` marker file exists (on the attempts in ``hold_on``).

    ``mode`` says how the attempt treats cancellation while it holds:
    ``heartbeat`` calls sv.heartbeat() (which raises ActivityCancelled),
    ``quiet`` heartbeats for ``heartbeat_for`` seconds, then stops heartbeating
    and raises ActivityCancelled once activity_cancelled() turns true,
    ``ignore`` never looks. ``record_end`` (default true) records the end as well.
    """
    info = _attempt()
    tag = data["tag"]
    Ledger.objects.create(entry=f"wait:{tag}:{info.attempt}:start")
    if info.attempt in data.get("hold_on", [info.attempt]):
        mode = data.get("mode", "heartbeat")
        started = time.monotonic()
        deadline = started + data.get("max_hold", 30)
        while os.path.exists(data["hold_while"]) and time.monotonic() < deadline:
            if mode == "heartbeat":
                sv.heartbeat()
            elif mode == "quiet":
                if time.monotonic() - started < data.get("heartbeat_for", 0):
                    sv.heartbeat()
                elif sv.activity_cancelled():
                    Ledger.objects.create(entry=f"wait:{tag}:{info.attempt}:cancelled")
                    sv.heartbeat()  # raises ActivityCancelled
            time.sleep(0.01)
    if data.get("record_end", True):
        Ledger.objects.create(entry=f"wait:{tag}:{info.attempt}:end")
    return f"{tag}:{info.attempt}"


@sv.activity(name="act.rendezvous")
def rendezvous(data: dict[str, Any]) -> int:
    """Arrive, then wait until all ``n`` activities of ``tag`` have arrived (proves overlap)."""
    Ledger.objects.create(entry=f"rv:{data['tag']}:{data['i']}")
    deadline = time.monotonic() + 15
    while Ledger.objects.filter(entry__startswith=f"rv:{data['tag']}:").count() < data["n"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"rendezvous {data['tag']} incomplete: activities ran one by one")
        time.sleep(0.01)
    return int(data["i"])


@sv.activity(name="act.tx_stall", transactional=True, retry_policy=sv.RetryPolicy(max_attempts=2))
def tx_stall(data: dict[str, Any]) -> str:
    """Write a Ledger row in the attempt's transaction; then fail or stall on chosen attempts."""
    info = _attempt()
    entry = f"txs:{data['tag']}:{info.attempt}"
    Ledger.objects.create(entry=entry)
    if info.attempt in data.get("fail_on", ()):
        raise StepError(f"attempt {info.attempt} failed after writing")
    if info.attempt in data.get("stall_on", ()):
        deadline = time.monotonic() + 10
        while not sv.activity_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
    return entry


@sv.activity(
    name="act.tx_long",
    transactional=True,
    retry_policy=sv.RetryPolicy(max_attempts=3, initial_interval=0.05, backoff_coefficient=1.0),
)
def tx_long(data: dict[str, Any]) -> str:
    """Write a Ledger row in the attempt's transaction, work ``seconds``, then maybe fail."""
    info = _attempt()
    entry = f"txl:{data['tag']}:{info.attempt}"
    Ledger.objects.create(entry=entry)
    time.sleep(data["seconds"])  # the work, holding the transaction open
    if info.attempt in data.get("final_on", ()):
        raise sv.ApplicationError(f"{entry} is final", type="Final", non_retryable=True)
    return entry


ACT_ACTIVITIES = {a.name: a for a in (step, defaults, wait, rendezvous, tx_stall, tx_long)}


def act_options(raw: dict[str, Any] | None) -> sv.ActivityOptions | None:
    """Build ActivityOptions from JSON (``retry_policy`` as a dict of RetryPolicy fields)."""
    if raw is None:
        return None
    fields = dict(raw)
    policy = fields.pop("retry_policy", None)
    return sv.ActivityOptions(
        **fields, retry_policy=sv.RetryPolicy(**policy) if policy is not None else None
    )


@sv.workflow(name="act.run")
def act_run(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Run one activity (``activity``) with ``input`` and per-call ``options``.

    ``async`` issues it with execute_async() and get() (which may still run it
    inline); ``background`` waits for the future to be ready first, so an activity
    worker runs it; ``then`` records a test.record entry afterwards (proves the
    workflow went on).
    """
    activity = ACT_ACTIVITIES[data["activity"]]
    options = act_options(data.get("options"))
    if data.get("background"):
        future = activity.execute_async(ctx, data.get("input"), options=options)
        ctx.wait_condition(future.is_ready)
        value = future.get(ctx)
    elif data.get("async"):
        value = activity.execute_async(ctx, data.get("input"), options=options).get(ctx)
    else:
        value = activity.execute(ctx, data.get("input"), options=options)
    if data.get("then"):
        record.execute(ctx, data["then"])
    return value


@sv.activity(name="act.signal_self")
def signal_self(channel: str) -> None:
    """Signal this activity's own workflow: input arriving during its execution."""
    sv.signal(_attempt().instance_id, channel)


@sv.workflow(name="act.poked_then_away")
def act_poked_then_away(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Signal itself (inline), then execute act.step on a queue the worker does not serve."""
    signal_self.execute(ctx, "poke")
    return step.execute(ctx, data, options=sv.ActivityOptions(queue="elsewhere"))


@sv.workflow(name="act.swallow_away")
def act_swallow_away(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Wrongly swallow the suspension of a background execute()."""
    try:
        step.execute(ctx, data, options=sv.ActivityOptions(queue="elsewhere"))
    except BaseException:  # the misuse under test
        pass
    return "swallowed"


@sv.workflow(name="act.fan_out")
def act_fan_out(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Issue ``n`` futures serially, then return each outcome; ``keys`` reports their keys."""
    n, tag = data["n"], data["tag"]
    futures = [rendezvous.execute_async(ctx, {"tag": tag, "i": i, "n": n}) for i in range(n)]
    return {"values": [f.get(ctx) for f in futures], "keys": [f.key for f in futures]}


@sv.workflow(name="act.all_ready")
def act_all_ready(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    """Issue ``n`` act.wait futures and wait for all of them without running any inline."""
    futures = [
        wait.execute_async(ctx, {**data["input"], "tag": f"{data['tag']}{i}"})
        for i in range(data["n"])
    ]
    ctx.wait_condition(lambda: all(f.is_ready() for f in futures))
    return [f.get(ctx) for f in futures]


@sv.workflow(name="act.forget")
def act_forget(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Issue an activity on a queue nobody serves and complete without awaiting it."""
    future = step.execute_async(
        ctx, {"tag": data["tag"]}, options=sv.ActivityOptions(queue="act-unserved")
    )
    return future.key


@sv.workflow(name="act.bad_options")
def act_bad_options(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    """Try invalid per-call options; return each ValueError's message (nothing is issued)."""
    messages = []
    for raw in data["attempts"]:
        try:
            step.execute(ctx, {"tag": "never"}, options=act_options(raw))
        except ValueError as error:
            messages.append(str(error))
    try:
        step.execute(
            ctx,
            {"tag": "never"},
            options=sv.ActivityOptions(
                retry_policy=sv.RetryPolicy(non_retryable_errors=[StepError])
            ),
        )
    except ValueError as error:
        messages.append(str(error))
    return messages


# -- poison instances and dispatch fairness (tests/test_poison.py, tests/test_fairness.py) --


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


# -- terminate (tests/test_terminate.py) -------------------------------------------------


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


# -- bounded statements (tests/test_limits.py) -------------------------------------------


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


# -- the second crash matrix (tests/test_crash_matrix_waits.py) -------------------------

FAULT_BG_QUEUE = "fault.bg"  # served only by that matrix's activity-only worker


@sv.activity(name="fault.tx", transactional=True, retry_policy=_FAULT_RETRY)
def fault_tx(data: dict[str, Any]) -> str:
    """Record ``fault.tx:<tag>`` in the attempt's own transaction: once, whatever fails."""
    Ledger.objects.create(entry=f"fault.tx:{data['tag']}")
    return str(data["tag"])


@sv.activity(name="fault.cancel_self", retry_policy=_FAULT_RETRY)
def fault_cancel_self(reason: str) -> None:
    """Ask for the cancellation of this attempt's own workflow."""
    info = sv.activity_info()
    assert info is not None
    sv.cancel_workflow(info.instance_id, reason)


@sv.workflow(name="fault.waiter")
def fault_waiter(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Wait for a signal that never comes (until cancelled)."""
    return ctx.receive("never")


@sv.workflow(name="fault.flow2")
def fault_flow2(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """The steps fault.flow leaves out: a transactional activity, a wait_condition delivery
    (two signals on ``w``), a background step on FAULT_BG_QUEUE (the reservation releases
    the lease), a schedule-to-start timeout only the leader's sweep records, and a
    cancellation requested from inside the run that closes it with its child."""
    tag = data["tag"]
    fault_tx.execute(ctx, {"tag": f"{tag}:tx"})
    ctx.wait_condition(lambda: ctx.pending("w") >= 2)
    ctx.receive("w")
    ctx.receive("w")
    fault_step.execute(ctx, {"tag": f"{tag}:bg"}, options=sv.ActivityOptions(queue=FAULT_BG_QUEUE))
    late = sv.ActivityOptions(queue=FAULT_PARKED_QUEUE, schedule_to_start_timeout=0.3)
    try:
        fault_step.execute(ctx, {"tag": f"{tag}:late"}, options=late)
    except sv.ActivityTimeoutError:
        pass
    ctx.start_child("fault.waiter")
    fault_cancel_self.execute(ctx, "flow2 is done")
    return ctx.receive("never")  # the cancellation ends the run here; the close cancels the child


@sv.workflow(name="poison.keys")
def poison_keys(ctx: sv.WorkflowContext, _: Any) -> list[str]:
    """Give keys and a queue that no database can store (NUL, a lone surrogate); return the
    type of each error raised (nothing may be written for any of them)."""
    attempts: list[Any] = [
        lambda: ctx.sleep(1, sleep_id="nul\x00inside"),
        lambda: ctx.new_timer(1, sleep_id="\ud800"),
        lambda: add.execute(ctx, {"a": 1, "b": 2}, activity_id="lone\udfff"),
        lambda: add.execute(ctx, {"a": 1, "b": 2}, options=sv.ActivityOptions(queue="q\x00")),
        lambda: add.execute(ctx, {"a": 1, "b": 2}, options=sv.ActivityOptions(queue="\ud800")),
    ]
    raised = []
    for attempt in attempts:
        try:
            attempt()
            raised.append("accepted")
        except (sv.HistoryKeyConflict, ValueError) as error:
            raised.append(type(error).__name__)
    return raised
