"""Flow control across two real ``runselvedge worker`` processes on one database.

Priorities show in the order in which attempts start; a concurrency key never has
more overlapping attempts than its ``max_concurrency`` (each attempt records its
start and end in the database, so the ledger's id order is the real order); a
rate-limited queue never has more claims in a period than its rate plus one (the
tasks' claim times are on the database clock).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import selvedge_django as sv
from selvedge_django.models import ActivityTask
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Ledger


def overrides(**values: Any) -> dict[str, str]:
    return {"SELVEDGE_TEST_OVERRIDES": json.dumps(values)}


def start_span(tag: str, *, start_priority: int = 0, hold: float = 0.0, **options: Any) -> str:
    """Start ``flow.run`` (at ``start_priority``) running flow.span with ``options``."""
    data = {"tag": tag, "hold": hold, "options": options}
    return sv.start_workflow("flow.run", data, instance_id=tag, priority=start_priority)


def events() -> list[tuple[str, str]]:
    """(tag, "start" or "end") of every attempt, in the order they were recorded."""
    rows = Ledger.objects.filter(entry__startswith="flow:").order_by("id")
    return [tuple(entry.split(":")[1:3]) for entry in rows.values_list("entry", flat=True)]  # type: ignore[misc]


def all_completed(ids: list[str]) -> Callable[[], bool]:
    def check() -> bool:
        return all(sv.describe(iid).status == "completed" for iid in ids)

    return check


def inversions(order: list[str]) -> int:
    """Pairs of a low-priority tag before a high-priority one."""
    return sum(
        1
        for i, first in enumerate(order)
        for second in order[i + 1 :]
        if first.startswith("lo") and second.startswith("hi")
    )


def test_two_workers_dispatch_the_higher_priority_instances_first(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    ids = []
    for n in range(4):  # low ones first: they are older
        ids.append(start_span(f"lo-{n}", start_priority=-50, hold=0.1))
        ids.append(start_span(f"hi-{n}", start_priority=50, hold=0.1))
    one_at_a_time = overrides(MAX_CONCURRENT_RESUMPTIONS=1, MAX_CONCURRENT_ACTIVITIES=1)
    first = worker_process("--worker-id", "prio-a", env=one_at_a_time)
    second = worker_process("--worker-id", "prio-b", env=one_at_a_time)
    wait_until(all_completed(ids), timeout=60)
    started = [tag for tag, event in events() if event == "start"]
    assert sorted(started) == sorted(ids)
    # Each worker takes one instance at a time, the highest priority first: only the
    # two workers' last high and first low picks can cross.
    assert inversions(started) <= 1, started
    assert first.terminate() == 0 and second.terminate() == 0


def test_two_workers_claim_the_higher_priority_tasks_first(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    # Workers that serve another queue reserve the tasks without running them.
    ids = [
        start_span(tag, queue="prio", priority=60 if tag.startswith("hi") else -60)
        for tag in ("lo-0", "hi-0", "lo-1", "hi-1", "lo-2", "hi-2")
    ]
    reserver = worker_process("--worker-id", "reserve", "--queues", "other")
    wait_until(lambda: ActivityTask.objects.filter(queue="prio").count() == len(ids), timeout=30)
    assert reserver.terminate() == 0
    assert ActivityTask.objects.get(instance_id="hi-0").priority == 60

    one_at_a_time = overrides(MAX_CONCURRENT_ACTIVITIES=1)
    first = worker_process("--worker-id", "claim-a", "--queues", "prio", env=one_at_a_time)
    second = worker_process("--worker-id", "claim-b", "--queues", "prio", env=one_at_a_time)
    wait_until(all_completed(ids), timeout=60)
    started = [tag for tag, event in events() if event == "start"]
    assert sorted(started) == sorted(ids)
    assert inversions(started) <= 1, started
    assert first.terminate() == 0 and second.terminate() == 0


def test_a_concurrency_key_never_has_more_overlapping_attempts_than_its_limit(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    ids = [
        start_span(f"acct-{n}", hold=0.5, concurrency_key="acct", max_concurrency=2)
        for n in range(8)
    ]
    wide = overrides(MAX_CONCURRENT_ACTIVITIES=4)
    first = worker_process("--worker-id", "key-a", env=wide)
    second = worker_process("--worker-id", "key-b", env=wide)
    wait_until(all_completed(ids), timeout=90)
    running = most = 0
    for _, event in events():
        running += 1 if event == "start" else -1
        most = max(most, running)
    assert most == 2, events()
    owners = set(ActivityTask.objects.filter(queue="").values_list("claim_owner", flat=True))
    assert owners <= {"key-a", "key-b"}
    assert first.terminate() == 0 and second.terminate() == 0


def test_a_rate_limited_queue_claims_no_more_than_its_rate_per_period(
    worker_process: Callable[..., WorkerProcess],
) -> None:
    ids = [start_span(f"rl-{n}", queue="rl") for n in range(12)]
    limited = overrides(QUEUE_RATE_LIMITS={"rl": "3/s"}, MAX_CONCURRENT_ACTIVITIES=4)
    first = worker_process("--worker-id", "rate-a", env=limited)
    second = worker_process("--worker-id", "rate-b", env=limited)
    wait_until(all_completed(ids), timeout=90)
    claimed = sorted(
        ActivityTask.objects.filter(queue="rl").values_list("claim_started_ms", flat=True)
    )
    assert len(claimed) == 12
    busiest = max(sum(1 for t in claimed if start <= t < start + 1000) for start in claimed)
    assert busiest <= 3 + 1, [t - claimed[0] for t in claimed]
    # Twelve claims at three a second take at least three seconds after the first.
    assert claimed[-1] - claimed[0] >= 3000 - 100, claimed
    assert first.terminate() == 0 and second.terminate() == 0
