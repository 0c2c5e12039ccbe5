"""Streams: workflows that write them, and activities that write them live (SPEC section 17)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import selvedge_django as sv

# Released by a test to let the activity below write its second entry.
release = threading.Event()


@sv.workflow(name="test.streams.steps")
def steps(ctx: sv.WorkflowContext, n: int) -> list[int]:
    """Write ``n`` entries, wait for a signal, write one more and close the stream."""
    seqs = [ctx.write_stream("steps", {"step": i}) for i in range(n)]
    ctx.receive("go")
    seqs.append(ctx.write_stream("steps", {"step": "after the signal"}))
    ctx.close_stream("steps")
    return seqs


@sv.activity(name="test.streams.tokens", start_to_close_timeout=30)
def tokens(words: list[str]) -> int:
    """Write each word live; after the first, wait until the test releases it."""
    for i, word in enumerate(words):
        sv.write_stream("tokens", word)
        if i == 0:
            assert release.wait(30)
    return len(words)


@sv.workflow(name="test.streams.answer")
def answer(ctx: sv.WorkflowContext, words: list[str]) -> int:
    count = tokens.execute(ctx, words)
    ctx.close_stream("tokens")
    return count


@sv.activity(
    name="test.streams.flaky",
    retry_policy=sv.RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.01),
)
def flaky(rows: int) -> str:
    """Write ``rows`` entries per attempt; the first attempt then fails."""
    info = sv.activity_info()
    assert info is not None
    for row in range(rows):
        sv.write_stream("rows", {"row": row, "attempt": info.attempt})
    if info.attempt == 1:
        raise RuntimeError("the first attempt fails after its writes")
    return "done"


@sv.workflow(name="test.streams.retried")
def retried(ctx: sv.WorkflowContext, rows: int) -> str:
    return flaky.execute(ctx, rows)


@sv.activity(name="test.streams.once")
def once(value: str) -> int:
    return sv.write_stream("once", value)


@sv.workflow(name="test.streams.once")
def run_once(ctx: sv.WorkflowContext, value: str) -> int:
    return once.execute(ctx, value)


@sv.workflow(name="test.streams.closed")
def closed(ctx: sv.WorkflowContext, _: Any) -> str:
    ctx.write_stream("log", "one")
    ctx.close_stream("log")
    try:
        ctx.write_stream("log", "two")
    except sv.StreamClosed as error:
        return f"refused: {error.key}"
    return "written"


@sv.workflow(name="test.streams.many")
def many(ctx: sv.WorkflowContext, n: int) -> list[Any]:
    """Write ``n`` entries, reporting each refusal instead of failing."""
    outcomes: list[Any] = []
    for i in range(n):
        try:
            outcomes.append(ctx.write_stream("many", i))
        except sv.StreamLimitExceeded:
            outcomes.append("full")
    ctx.now()  # a command after the refusals: replays must keep their positions
    return outcomes


@sv.workflow(name="test.streams.big")
def big(ctx: sv.WorkflowContext, size: int) -> str:
    try:
        ctx.write_stream("big", "x" * size)
    except sv.PayloadTooLarge:
        return "too large"
    return "written"


@sv.activity(name="test.streams.crashy", start_to_close_timeout=60)
def crashy(data: dict[str, Any]) -> int:
    """Write ``n`` entries; the first attempt then waits (a test kills its worker there)."""
    info = sv.activity_info()
    assert info is not None
    for i in range(data["n"]):
        sv.write_stream("out", {"i": i, "attempt": info.attempt})
    if info.attempt == 1:
        Path(data["wrote"]).touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sv.heartbeat()
            time.sleep(0.05)
    return data["n"]


@sv.workflow(name="test.streams.crashy")
def crashy_run(ctx: sv.WorkflowContext, data: dict[str, Any]) -> int:
    return crashy.execute(ctx, data)
