"""Flow control in the store: priorities with aging, concurrency keys, queue rate limits.

Driven through the store's own dispatch and claim operations on real SQLite or
PostgreSQL, one claim at a time, with a ``ControllableClock`` that moves the
database clock for waits, lapses and rate windows. The same rules across real
worker processes: tests/processes/test_flow_control_processes.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.conf import get_settings, resolve_settings
from selvedge_django.engine.codec import Codec
from selvedge_django.models import ActivityTask, QueueClaim, WorkflowInstance
from selvedge_django.storage import Store, store_for
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests.testapp.models import Ledger


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


def store() -> Store:
    return store_for("default", Codec(), get_settings())


def next_leased() -> str | None:
    """Lease the one instance dispatch takes first (and keep it)."""
    leased = store().instances.lease_batch("dispatcher", 30, 1, None)
    return leased[0][0].instance_id if leased else None


def start_span(tag: str, priority: int | None = None, **options: Any) -> str:
    if priority is not None:
        options["priority"] = priority
    return sv.start_workflow("flow.run", {"tag": tag, "options": options}, instance_id=tag)


def queue_tasks(clock: ControllableClock) -> None:
    """Run the workflows up to their activity: reserved, queued, not claimed."""
    run_until_idle(Worker(clock=clock, activity_queues=[]))


def claim(owner: str, limit: int = 1) -> list[str]:
    return [t.claim.instance_id for t in store().tasks.claim_tasks(owner, limit, ["flow.span"])]


# -- priorities ----------------------------------------------------------------------------


def test_dispatch_takes_the_highest_priority_first_then_the_oldest(
    clock: ControllableClock,
) -> None:
    for iid, priority in [("a", 0), ("b", 10), ("c", -5), ("d", 10), ("e", 0)]:
        sv.start_workflow("test.add", {"a": 1, "b": 2}, instance_id=iid, priority=priority)
        clock.advance(1)  # age is by the millisecond: two starts within one are equals
    assert [next_leased() for _ in range(6)] == ["b", "d", "a", "e", "c", None]
    assert sv.describe("b").priority == 10
    assert sv.describe(sv.fork_workflow("b")).priority == 10  # a fork keeps it


def test_a_minute_of_waiting_is_worth_one_priority_point(clock: ControllableClock) -> None:
    sv.start_workflow("test.add", {"a": 1, "b": 2}, instance_id="old-low", priority=0)
    clock.advance(150)  # 2.5 minutes: worth 2.5 points
    sv.start_workflow("test.add", {"a": 1, "b": 2}, instance_id="new-2", priority=2)
    sv.start_workflow("test.add", {"a": 1, "b": 2}, instance_id="new-3", priority=3)
    assert [next_leased() for _ in range(3)] == ["new-3", "old-low", "new-2"]


def test_equal_priorities_that_became_ready_in_the_same_millisecond_go_oldest_first(
    clock: ControllableClock,
) -> None:
    started = [
        sv.start_workflow("test.add", {"a": n, "b": 0}, priority=50) for n in range(10)
    ]  # random ids: their order is not the order of creation
    ready_ms = WorkflowInstance.objects.get(pk=started[0]).ready_ms
    for iid in reversed(started):  # the newest row version first, where a table keeps it
        WorkflowInstance.objects.filter(pk=iid).update(ready_ms=ready_ms)
    leased = [next_leased() for _ in range(10)]
    assert [started.index(iid) for iid in leased] == list(range(10))
    assert next_leased() is None


@pytest.mark.parametrize("priority", [101, -101, 1.5, True, "1"])
def test_a_start_priority_outside_minus_100_to_100_is_rejected_with_nothing_written(
    tdb: None, priority: Any
) -> None:
    with pytest.raises(sv.WorkflowStartRejected, match="priority"):
        sv.start_workflow("test.add", {"a": 1, "b": 2}, priority=priority)
    assert not WorkflowInstance.objects.exists()


def test_claims_take_the_highest_task_priority_first_and_age_the_rest(
    clock: ControllableClock,
) -> None:
    start_span("old", priority=-1)
    queue_tasks(clock)  # a task is ready from its reservation
    clock.advance(90)  # 1.5 points
    for tag, priority in [("mid", 0), ("top", 100), ("low", -100)]:
        start_span(tag, priority=priority)
    queue_tasks(clock)
    assert ActivityTask.objects.get(instance_id="top").priority == 100
    assert [claim("w") for _ in range(5)] == [["top"], ["old"], ["mid"], ["low"], []]


def test_an_inline_claim_does_not_jump_ahead_of_higher_priority_queued_tasks(
    clock: ControllableClock,
) -> None:
    # The workflow queues ten priority 0 tasks, then ten priority 50 ones, and waits for
    # them in that order; its worker has one activity slot. Waiting for low0 must not
    # claim it inline while the priority 50 tasks wait.
    low = [f"low{n}" for n in range(10)]
    high = [f"high{n}" for n in range(10)]
    tasks = [[tag, 0] for tag in low] + [[tag, 50] for tag in high]
    sv.start_workflow("flow.backlog", {"tasks": tasks}, instance_id="backlog")
    run_until_idle(Worker(clock=clock, max_concurrent_activities=1))
    assert sv.get_workflow_result("backlog").output == [*low, *high]
    started = Ledger.objects.filter(entry__endswith=":start").order_by("id")
    assert [entry.split(":")[1] for entry in started.values_list("entry", flat=True)] == [
        *high,
        *low,
    ]


def test_an_inline_claim_takes_the_task_that_is_next_in_its_queue(
    clock: ControllableClock,
) -> None:
    tasks = [["first", 0], ["second", 0]]
    sv.start_workflow("flow.backlog", {"tasks": tasks}, instance_id="backlog")
    run_until_idle(Worker(clock=clock, activity_queues=[]))  # queued, nothing claimed
    first = ActivityTask.objects.get(instance_id="backlog", input__contains="first")
    inline = store().claim_task("backlog", first.key, "wf")
    assert inline is not None and inline.claim.task_id == first.id
    second = ActivityTask.objects.get(instance_id="backlog", input__contains="second")
    start_span("urgent", priority=1)
    queue_tasks(clock)
    assert store().claim_task("backlog", second.key, "wf") is None  # urgent goes first
    assert claim("w") == ["urgent"]
    assert store().claim_task("backlog", second.key, "wf") is not None


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"priority": 500}, ValueError),
        ({"priority": "high"}, TypeError),
        ({"concurrency_key": ""}, ValueError),
        ({"concurrency_key": "a\nb", "max_concurrency": 1}, ValueError),
        ({"concurrency_key": 7, "max_concurrency": 1}, TypeError),
        ({"concurrency_key": "k", "max_concurrency": 0}, ValueError),
        ({"max_concurrency": True}, ValueError),
    ],
)
def test_activity_options_check_flow_control_fields(
    options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        sv.ActivityOptions(**options)


def test_a_concurrency_key_without_a_limit_fails_the_call_in_the_workflow(
    clock: ControllableClock,
) -> None:
    start_span("keyed", concurrency_key="acct-1")
    queue_tasks(clock)
    result = sv.get_workflow_result("keyed")
    assert result.status == "failed"
    assert "concurrency_key but no max_concurrency" in str(result.error)
    assert not ActivityTask.objects.exists()


# -- concurrency keys ------------------------------------------------------------------------


def test_claims_keep_the_running_attempts_of_a_key_within_its_limit(
    clock: ControllableClock,
) -> None:
    for tag in ("k1", "k2", "k3"):
        start_span(tag, concurrency_key="acct", max_concurrency=2)
    start_span("free")
    start_span("other", concurrency_key="acct-2", max_concurrency=2)
    queue_tasks(clock)
    first = store().tasks.claim_tasks("w1", 10, ["flow.span"])
    taken = sorted(t.claim.instance_id for t in first)
    # Which two of "acct" go first follows the order the worker ran its dispatched
    # batch in (PostgreSQL's RETURNING keeps no order); that exactly two go, and the
    # third waits, does not.
    keyed = [tag for tag in taken if tag.startswith("k")]
    assert len(keyed) == 2 and {"free", "other"} <= set(taken) and len(taken) == 4
    (waiting,) = {"k1", "k2", "k3"} - set(keyed)
    assert claim("w2", 10) == []  # the third waits: two attempts of "acct" run
    task = ActivityTask.objects.get(instance_id=waiting)
    assert (task.status, task.attempts) == ("queued", 0)
    done = next(t for t in first if t.claim.instance_id == keyed[0])
    assert store().tasks.complete_task(done.claim, f'"{keyed[0]}"')
    assert claim("w2", 10) == [waiting]


def test_a_lapsed_attempt_frees_its_slot_and_its_task_is_claimed_again(
    clock: ControllableClock,
) -> None:
    start_span("k1", concurrency_key="acct", max_concurrency=1)
    start_span("k2", concurrency_key="acct", max_concurrency=1)
    queue_tasks(clock)
    assert claim("w1", 10) == ["k1"]
    assert claim("w1", 10) == []
    clock.advance(60)  # the claim lapsed: its attempt no longer counts
    taken = claim("w2", 10)
    assert len(taken) == 1  # the lapsed k1 (older) or k2, never both
    assert claim("w2", 10) == []


def test_max_concurrency_alone_limits_the_activity(clock: ControllableClock) -> None:
    for tag in ("a", "b"):
        start_span(tag, max_concurrency=1)
    queue_tasks(clock)
    assert ActivityTask.objects.get(instance_id="a").concurrency_key == "flow.span"
    assert claim("w", 10) == ["a"]
    assert claim("w", 10) == []


def test_the_definition_sets_flow_control_defaults_and_a_call_overrides_them(
    clock: ControllableClock,
) -> None:
    sv.start_workflow("flow.run", {"tag": "d", "activity": "flow.serial"}, instance_id="d")
    data = {"tag": "o", "activity": "flow.serial", "options": {"priority": 0, "max_concurrency": 3}}
    sv.start_workflow("flow.run", data, instance_id="o")
    queue_tasks(clock)
    defaults = ActivityTask.objects.get(instance_id="d")
    assert (defaults.priority, defaults.concurrency_key, defaults.max_concurrency) == (
        5,
        "flow.serial",
        1,
    )
    overridden = ActivityTask.objects.get(instance_id="o")
    assert (overridden.priority, overridden.max_concurrency) == (0, 3)


def test_a_keyed_task_is_not_claimed_inline_and_completes_through_a_worker(
    clock: ControllableClock,
) -> None:
    start_span("inline", concurrency_key="acct", max_concurrency=1)
    run_until_idle(Worker(clock=clock))
    assert sv.get_workflow_result("inline").output == "inline"


# -- queue rate limits -----------------------------------------------------------------------


def rate_limited(rate: str) -> Any:
    return override_settings(SELVEDGE={**settings.SELVEDGE, "QUEUE_RATE_LIMITS": {"rl": rate}})


def test_a_rate_limited_queue_claims_at_most_its_rate_per_sliding_window(
    clock: ControllableClock,
) -> None:
    def claim_and_complete(limited: Store) -> list[str]:
        """Claim what the limits let in, and complete it (no claim lapses and returns)."""
        claimed = limited.tasks.claim_tasks("w", 10, ["flow.span"])
        for task in claimed:
            assert limited.tasks.complete_task(task.claim, '"done"')
        return sorted(task.claim.instance_id for task in claimed)

    with rate_limited("2/m"):
        for n in range(5):
            start_span(f"rl-{n}", queue="rl")
        start_span("plain")
        queue_tasks(clock)
        limited = store()
        # Which of rl-0..rl-4 go in each window follows the order the worker ran its
        # dispatched batch in (PostgreSQL's RETURNING keeps no order); how many do not.
        first = claim_and_complete(limited)
        assert first[0] == "plain" and len(first) == 3
        assert claim_and_complete(limited) == []
        assert claim_and_complete(store()) == []  # the window is in the database
        clock.advance(30)
        assert claim_and_complete(store()) == []
        clock.advance(31)  # the first two claims left the window
        second = claim_and_complete(limited)
        assert len(second) == 2
        assert claim_and_complete(limited) == []
        clock.advance(61)
        last = claim_and_complete(limited)
        assert sorted([*first[1:], *second, *last]) == [f"rl-{n}" for n in range(5)]
        # Claims that left the window are forgotten by the next claim of the queue.
        assert QueueClaim.objects.filter(queue="rl").count() == 1


def test_queue_rate_limits_are_validated(tdb: None) -> None:
    for good in ({}, {"emails": "100/m", "": "1/s", "api": "3600/h"}):
        assert resolve_settings({"QUEUE_RATE_LIMITS": good}).queue_rate_limits is not None
    assert resolve_settings({"QUEUE_RATE_LIMITS": {"e": "5/s"}}).queue_rate_limits == {
        "e": (5, 1000)
    }
    for bad in ({"e": "ten/m"}, {"e": "0/m"}, {"e": "5/d"}, {"e": 5}, ["e"], {"e": "-1/s"}):
        with pytest.raises(ImproperlyConfigured, match=r"QUEUE_RATE_LIMITS|rate"):
            resolve_settings({"QUEUE_RATE_LIMITS": bad})
        with override_settings(SELVEDGE={**settings.SELVEDGE, "QUEUE_RATE_LIMITS": bad}):
            ids = [m.id for m in run_checks(tags=["selvedge"])]
        assert "selvedge.E006" in ids, bad
    assert "selvedge.E006" not in [m.id for m in run_checks(tags=["selvedge"])]
