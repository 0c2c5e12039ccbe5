"""Workflows of the operator tests: queries, golden histories, commands and hooks.

``ops.golden.order`` is the code the checked-in histories in ``tests/histories/``
were recorded from (and are replayed against): change it and the golden tests
say which recorded histories the change breaks, as a deploy gate would.
"""

from __future__ import annotations

from typing import Any

import selvedge_django as sv


@sv.activity(name="ops.golden.price")
def price(data: dict[str, Any]) -> dict[str, Any]:
    return {"sku": data["sku"], "cents": data["quantity"] * 250}


@sv.workflow(name="ops.golden.receipt")
def receipt(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    return f"receipt for {data['sku']}: {data['cents']} cents"


@sv.workflow(name="ops.golden.order")
def order(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Price, wait for approval, cool off for a minute, then issue a receipt."""
    state: dict[str, Any] = {"stage": "pricing"}
    ctx.set_query_handler("stage", lambda: state["stage"])
    quote = price.execute(ctx, data)
    state["stage"] = "awaiting approval"
    asked_at = ctx.now()
    approval = ctx.receive("approve")
    if approval.get("reject"):
        raise sv.ApplicationError(
            "order rejected", type="OrderRejected", details={"by": approval["by"]}
        )
    state["stage"] = "cooling off"
    ctx.sleep(60)
    state["stage"] = "issuing receipt"
    text = ctx.start_child(receipt, quote).get(ctx)
    state["stage"] = "done"
    return {
        "sku": quote["sku"],
        "total": quote["cents"],
        "approved_by": approval["by"],
        "waited": (ctx.now() - asked_at).total_seconds(),
        "receipt": text,
    }


@sv.workflow(name="ops.echo")
def echo(ctx: sv.WorkflowContext, value: Any) -> Any:
    """Return the input unchanged (closed instances for commands and prune)."""
    return value


@sv.workflow(name="ops.wait")
def wait(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Wait for one signal on "go" and return it (a running instance)."""
    return ctx.receive("go")


@sv.workflow(name="ops.fail")
def fail(ctx: sv.WorkflowContext, message: str) -> Any:
    raise sv.ApplicationError(message, type="OpsFailure")


@sv.workflow(name="ops.parent")
def parent(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Start an ops.echo child, then wait on "go" while it stays recorded as closed."""
    done = ctx.start_child(echo, "child value").get(ctx)
    return [done, ctx.receive("go")]
