"""Workflows of the payload-encryption tests: one secret carried through every kind of value.

``codec.carry`` takes the secret as its input, sends it to an activity and gets it
back as the result, stores it as progress and as heartbeat details (the activity
fails once after a heartbeat, so the details are stored for the retry), receives
it in a signal, starts a child with it, catches an activity's failure whose
message and details carry it, and returns it.
"""

from __future__ import annotations

from typing import Any

import selvedge_django as sv

FAST_RETRY = sv.RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.01)


@sv.activity(name="codec.echo", retry_policy=FAST_RETRY)
def echo(value: dict[str, Any]) -> dict[str, Any]:
    info = sv.activity_info()
    assert info is not None
    if info.attempt == 1:
        sv.heartbeat({"seen": value["secret"]})
        raise RuntimeError("first attempt fails after a heartbeat")
    assert info.heartbeat_details == {"seen": value["secret"]}
    return {"echo": value["secret"]}


@sv.activity(name="codec.refuse", retry_policy=sv.RetryPolicy(max_attempts=1))
def refuse(value: str) -> None:
    raise sv.ApplicationError(
        f"refused {value}", type="Refused", details={"why": value}, non_retryable=True
    )


@sv.workflow(name="codec.child")
def child(ctx: sv.WorkflowContext, value: str) -> str:
    return f"child saw {value}"


@sv.workflow(name="codec.carry")
def carry(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    secret = data["secret"]
    ctx.set_progress({"step": "echo", "about": secret})
    echoed = echo.execute(ctx, {"secret": secret})
    signalled = ctx.receive("go")
    # The child's id comes from the input, so that a fork replays the same start.
    started = ctx.start_child(child, secret, child_id=f"{data['id']}-child")
    child_said = started.get(ctx)
    try:
        refuse.execute(ctx, secret)
    except sv.ApplicationError as error:
        refused = error.message
    ctx.set_progress({"step": "done", "about": secret})
    return {"echoed": echoed, "signal": signalled, "child": child_said, "refused": refused}


@sv.workflow(name="codec.wait")
def wait(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Wait for a signal, then return the input and the payload."""
    payload = ctx.receive("go")
    return {"input": data, "payload": payload}


@sv.workflow(name="codec.queried")
def queried(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Answer the query "seen" with the input and the signal received so far."""
    seen: dict[str, Any] = {"input": data, "payload": None}
    ctx.set_query_handler("seen", lambda: seen)
    seen["payload"] = ctx.receive("go")
    return ctx.receive("done")
