"""Workers and worker processes: retries, rejections, holds, transactions."""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import models, transaction

import selvedge_django as sv

from ..models import Ledger
from .basics import record

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
