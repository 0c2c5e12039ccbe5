"""Workflows of the inline-result tests (tests/integration/test_inline_results.py).

``inline.step`` runs on the workflow's thread (``act.execute``); after its body,
the hooks in ``AFTER_BODY`` run once each (a test moves the clock or takes the
lease away there, between the attempt and the write that records its result).
``RUNS`` counts the bodies per input.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import selvedge_django as sv

RUNS: Counter[str] = Counter()
AFTER_BODY: list[Callable[[], None]] = []


@sv.activity(name="inline.step", start_to_close_timeout=10)
def step(name: str) -> str:
    RUNS[name] += 1
    while AFTER_BODY:
        AFTER_BODY.pop(0)()
    return f"{name}:{RUNS[name]}"


@sv.workflow(name="inline.two_steps")
def two_steps(ctx: sv.WorkflowContext, _: Any) -> list[str]:
    return [step.execute(ctx, "a"), step.execute(ctx, "b")]


@sv.workflow(name="inline.then_wait")
def then_wait(ctx: sv.WorkflowContext, _: Any) -> list[Any]:
    """An inline step, then a wait: the suspension's release records the result."""
    first = step.execute(ctx, "a")
    return [first, ctx.receive("go")]


@sv.workflow(name="inline.one_step")
def one_step(ctx: sv.WorkflowContext, _: Any) -> str:
    """One inline step: the close records its result."""
    return step.execute(ctx, "a")
