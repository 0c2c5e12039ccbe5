"""Workflows of the continue-as-new tests (tests/integration/test_continue_as_new.py and
tests/processes/test_continue_as_new_processes.py).

``RUNS`` counts each activity's bodies; ``can.count`` adds up the numbers sent on
"add", ``batch`` signals a generation, and ends with the total on "stop".
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import selvedge_django as sv

RUNS: Counter[str] = Counter()


@sv.activity(name="can.note")
def note(total: int) -> int:
    RUNS["note"] += 1
    return total


@sv.workflow(name="can.count")
def count(ctx: sv.WorkflowContext, state: dict[str, Any]) -> dict[str, Any]:
    """Take ``batch`` signals on "add", record the total with an activity (the same key in
    every generation), then continue as new with it; "stop" returns the total."""
    total = state["total"]
    for _ in range(state["batch"]):
        value = ctx.receive("add")
        if value == "stop":
            return {"total": total, "generations": state.get("generations", 1)}
        total += value
    total = note.execute(ctx, total)
    ctx.continue_as_new(
        {"total": total, "batch": state["batch"], "generations": state.get("generations", 1) + 1}
    )


@sv.workflow(name="can.echo")
def echo(ctx: sv.WorkflowContext, value: Any) -> Any:
    return value


@sv.workflow(name="can.waiter")
def waiter(ctx: sv.WorkflowContext, tag: str) -> str:
    """Wait for "go" in a detached scope (a parent's cancel request does not stop it)."""
    return f"{tag}:{ctx.detached().receive('go')}"


@sv.workflow(name="can.children")
def children(ctx: sv.WorkflowContext, round_: int) -> list[Any]:
    """Start a can.echo child under its default id each generation; continue once."""
    child = ctx.start_child(echo, f"round {round_}")
    got = [child.id, child.get(ctx)]
    if round_ == 1:
        ctx.continue_as_new(2)
    return got


@sv.workflow(name="can.stale_parent")
def stale_parent(ctx: sv.WorkflowContext, round_: int) -> str:
    """Generation 1 starts a can.waiter and continues without waiting for it (or, with
    ``round_`` 0, after "next"); generation 2 starts another under the same key, and
    returns its result."""
    child = ctx.start_child(waiter, f"gen{max(round_, 1)}")
    if round_ == 0:
        ctx.receive("next")
    if round_ <= 1:
        ctx.continue_as_new(2)
    return child.get(ctx)


@sv.workflow(name="can.misuse")
def misuse(ctx: sv.WorkflowContext, how: str) -> str:
    """Ways to get continue-as-new wrong: an unstorable input, or swallowing it."""
    if how == "unencodable":
        try:
            ctx.continue_as_new({"bad": object()})
        except sv.WorkflowStartRejected as error:
            return f"rejected: {type(error).__name__}"
    if how == "swallow":
        try:
            ctx.continue_as_new("again")
        except BaseException:  # what the test is about
            pass
        return "swallowed"
    return "nothing"
