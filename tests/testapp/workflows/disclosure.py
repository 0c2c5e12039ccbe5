"""Recorded values that only some admin users may see."""

from __future__ import annotations

from typing import Any

import selvedge_django as sv

from .limits import limits_text


@sv.workflow(name="disclosure.order")
def disclosure_order(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Hold a secret in the input, a signal payload and an activity result."""
    approval = ctx.receive("approve")
    echoed = limits_text.execute(ctx, len(data["card"]))
    return {"approval": approval, "card": data["card"], "echo": echoed}
