"""Mutated versions of ``ops.golden.order`` (tests/ops_workflows.py), one per kind of change.

Every checked-in history of today's ``ops.golden.order`` (``tests/histories/``)
must be reported as diverged when replayed against any of these: a command
dropped, two commands swapped, an activity renamed, and code that stops early by
raising, returning or being cancelled. Each changes the commands up to the
second one, which every golden history records (even the running one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import selvedge_django as sv
from tests.ops_workflows import price


@sv.activity(name="ops.golden.quote")
def quote(data: dict[str, Any]) -> dict[str, Any]:
    """``ops.golden.price`` under another name."""
    return price.fn(data)


def _rest(ctx: sv.WorkflowContext, data: dict[str, Any], priced: dict[str, Any]) -> Any:
    """What ``ops.golden.order`` does after pricing and asking, unchanged."""
    approval = ctx.receive("approve")
    if approval.get("reject"):
        raise sv.ApplicationError(
            "order rejected", type="OrderRejected", details={"by": approval["by"]}
        )
    ctx.sleep(60)
    text = ctx.start_child("ops.golden.receipt", priced).get(ctx)
    return {"sku": priced["sku"], "total": priced["cents"], "receipt": text}


def price_dropped(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Prices locally instead of by activity."""
    priced = {"sku": data["sku"], "cents": data["quantity"] * 250}
    ctx.now()
    return _rest(ctx, data, priced)


def now_dropped(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """No longer notes when it asked for approval."""
    priced = price.execute(ctx, data)
    return _rest(ctx, data, priced)


def swapped(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Notes the time before pricing."""
    ctx.now()
    priced = price.execute(ctx, data)
    return _rest(ctx, data, priced)


def activity_renamed(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Prices with the same code registered under another activity name."""
    priced = quote.execute(ctx, data)
    ctx.now()
    return _rest(ctx, data, priced)


def raises_early(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Rejects every order right after pricing, with the recorded rejection's error."""
    price.execute(ctx, data)
    raise sv.ApplicationError("order rejected", type="OrderRejected", details={"by": "bob"})


def returns_early(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Accepts every order right after pricing."""
    priced = price.execute(ctx, data)
    return {"sku": priced["sku"], "total": priced["cents"]}


def cancelled_early(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Gives up right after pricing, as if cancelled."""
    price.execute(ctx, data)
    raise sv.WorkflowCancelled(ctx.instance_id, "customer changed their mind")


VARIANTS: tuple[Callable[[sv.WorkflowContext, dict[str, Any]], Any], ...] = (
    price_dropped,
    now_dropped,
    swapped,
    activity_renamed,
    raises_early,
    returns_early,
    cancelled_early,
)
