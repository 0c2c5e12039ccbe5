"""Activities at full strength: options, heartbeats, transactions."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import selvedge_django as sv

from ..models import Ledger
from .basics import record


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
    With ``details`` the heartbeats carry ``{"attempt": n, "beats": k}`` and the
    start records the heartbeat details the attempt was handed
    (``wait:<tag>:<n>:from:<JSON>``); the attempts in ``fail_on`` raise StepError
    once they stop holding.
    """
    info = _attempt()
    tag = data["tag"]
    Ledger.objects.create(entry=f"wait:{tag}:{info.attempt}:start")
    if data.get("details"):
        handed = json.dumps(info.heartbeat_details, sort_keys=True)
        Ledger.objects.create(entry=f"wait:{tag}:{info.attempt}:from:{handed}")
    beats = 0
    if info.attempt in data.get("hold_on", [info.attempt]):
        mode = data.get("mode", "heartbeat")
        started = time.monotonic()
        deadline = started + data.get("max_hold", 30)
        while os.path.exists(data["hold_while"]) and time.monotonic() < deadline:
            if mode == "heartbeat" and data.get("details"):
                beats += 1
                sv.heartbeat({"attempt": info.attempt, "beats": beats})
            elif mode == "heartbeat":
                sv.heartbeat()
            elif mode == "quiet":
                if time.monotonic() - started < data.get("heartbeat_for", 0):
                    sv.heartbeat()
                elif sv.activity_cancelled():
                    Ledger.objects.create(entry=f"wait:{tag}:{info.attempt}:cancelled")
                    sv.heartbeat()  # raises ActivityCancelled
            time.sleep(0.01)
    if info.attempt in data.get("fail_on", ()):
        raise StepError(f"attempt {info.attempt} of {tag} failed after {beats} heartbeats")
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
