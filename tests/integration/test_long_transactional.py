"""Transactional activities that run longer than their claim's TTL.

On SQLite the attempt's transaction holds the database's write lock for the whole
body, so nobody can renew its claim meanwhile: an attempt longer than the claim TTL
used to find its claim expired at commit, roll back, and be retried until its
retries ran out (every attempt rolled back). While the attempt's transaction holds
the lock nobody else can write either, so nobody can have taken the claim over:
the attempt extends its own claim (owner and epoch still matching, its deadline
not passed) before it records its outcome. On PostgreSQL the renewer extends the
claim as usual. Either way the body's writes commit once, with the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import selvedge_django as sv
from selvedge_django.models import ActivityTask
from tests.testapp.models import Ledger

LEASE = {"TTL": 2, "RENEW_INTERVAL": 0.5, "MARGIN": 0.5, "MAX_SKEW": 0.2}


def start(tag: str, seconds: float, **extra: Any) -> str:
    data = {"activity": "act.tx_long", "input": {"tag": tag, "seconds": seconds, **extra}}
    return sv.start_workflow("act.run", data)


def entries(tag: str) -> list[str]:
    return sorted(
        Ledger.objects.filter(entry__startswith=f"txl:{tag}:").values_list("entry", flat=True)
    )


def test_a_transactional_activity_longer_than_its_claim_ttl_succeeds_once(
    make_worker: Callable[..., Any],
) -> None:
    make_worker(lease=LEASE)
    instance_id = start("long", 3.5)  # 1.75 claim TTLs
    result = sv.wait_workflow(instance_id, timeout=60)
    assert result.status == "completed", result.error
    assert result.output == "txl:long:1"
    assert entries("long") == ["txl:long:1"]
    task = ActivityTask.objects.get(instance_id=instance_id, name="act.tx_long")
    assert (task.status, task.attempts, task.failures) == ("completed", 1, 0)


def test_a_long_transactional_attempts_failure_is_its_own_not_a_lapse(
    make_worker: Callable[..., Any],
) -> None:
    """A non-retryable error after the TTL is recorded as such; its writes roll back."""
    make_worker(lease=LEASE)
    instance_id = start("final", 3.5, final_on=[1])
    result = sv.wait_workflow(instance_id, timeout=60)
    assert result.status == "failed"
    assert isinstance(result.error, sv.ApplicationError), result.error
    assert result.error.type == "Final"
    assert entries("final") == []  # rolled back with the failed attempt
    task = ActivityTask.objects.get(instance_id=instance_id, name="act.tx_long")
    assert (task.status, task.attempts, task.failures) == ("failed", 1, 1)


def test_a_transactional_attempt_past_its_deadline_still_times_out(
    make_worker: Callable[..., Any],
) -> None:
    make_worker(lease=LEASE)
    data = {
        "activity": "act.tx_long",
        "input": {"tag": "late", "seconds": 1.5},
        "options": {"start_to_close_timeout": 1, "retry_policy": {"max_attempts": 2}},
    }
    instance_id = sv.start_workflow("act.run", data)
    result = sv.wait_workflow(instance_id, timeout=60)
    assert result.status == "failed"
    assert isinstance(result.error, sv.RetryExhaustedError), result.error
    last = result.error.last_error
    assert isinstance(last, sv.ActivityTimeoutError) and last.kind == "start_to_close", last
    assert entries("late") == []  # both attempts rolled back
