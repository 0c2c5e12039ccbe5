"""In-process workers on the real test database: histories, retries, replay, fences, shutdown.

Every test runs real worker threads (``worker`` / ``make_worker``) or the ORM
store directly against SQLite or PostgreSQL (``SELVEDGE_TEST_DB``). Nothing is
mocked; waits poll the database with a deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.engine.codec import Codec
from selvedge_django.engine.events import Fence, HistoryRow
from selvedge_django.engine.ports import CloseRequest, TaskSpec
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from selvedge_django.storage import DjangoStore, set_clock_offset_ms, store_for
from tests.conftest import wait_until
from tests.testapp.models import Ledger
from tests.testapp.workflows import basics
from tests.testapp.workflows import worker as worker_flows

SHORT_LEASE = {"TTL": 1.5, "RENEW_INTERVAL": 0.3, "MARGIN": 0.3, "MAX_SKEW": 0.1}


# -- helpers ----------------------------------------------------------------------------


def activity_rows(instance_id: str) -> list[HistoryEvent]:
    return list(
        HistoryEvent.objects.filter(instance_id=instance_id, command="activity").order_by("seq")
    )


def ledger(prefix: str) -> list[str]:
    return sorted(Ledger.objects.filter(entry__startswith=prefix).values_list("entry", flat=True))


def instance(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def observe(seconds: float, check: Callable[[], None], interval: float = 0.05) -> int:
    """Run ``check`` repeatedly for ``seconds`` (an observation window for a safety property)."""
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline:
        check()
        rounds += 1
        time.sleep(interval)
    check()
    return rounds + 1


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """A file that holding activities wait on; removed after the test whatever happens."""
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def scratch_workflows() -> Iterator[Callable[[str], None]]:
    """Register throwaway workflows in the test; every name is unregistered afterwards."""
    names: list[str] = []

    def forget(name: str) -> None:
        registry.unregister(name, kind="workflow")
        names.append(name)

    yield forget
    for name in names:
        registry.unregister(name, kind="workflow")


@pytest.fixture
def db_clock() -> Iterator[Callable[[float], None]]:
    """Move the database clock seen by this process's stores; reset to 0 afterwards."""

    def move(seconds: float) -> None:
        set_clock_offset_ms(int(seconds * 1000))

    yield move
    set_clock_offset_ms(0)


# -- histories --------------------------------------------------------------------------


def test_several_activities_record_exactly_one_value_each(worker: Any) -> None:
    entries = ["alpha", "beta", "gamma", "delta"]
    instance_id = sv.start_workflow("test.ledger", entries)
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed"
    assert result.output == entries
    rows = list(HistoryEvent.objects.filter(instance_id=instance_id).order_by("id"))
    assert [r.command for r in rows] == ["activity"] * 4 + ["close"]
    activities, close = rows[:4], rows[4]
    assert [r.seq for r in activities] == [1, 2, 3, 4]
    assert len({r.key for r in activities}) == 4
    assert [json.loads(r.data) for r in activities] == entries
    assert {r.event_type for r in activities} == {"ActivityCompleted"}
    assert close.key == "$close"
    assert close.event_type == "WorkflowCompleted"
    assert json.loads(close.data) == entries
    # Each activity body ran once: one Ledger row per entry.
    assert ledger("") == sorted(entries)
    tasks = sv.list_activity_tasks(instance_id)
    assert [(t.name, t.status, t.attempts, t.failures) for t in tasks] == [
        ("test.record", "completed", 1, 0)
    ] * 4
    inst = instance(instance_id)
    assert inst.lease_owner == ""
    assert inst.lease_epoch == 1  # never suspended, so dispatched exactly once


def test_concurrent_activities_issued_with_execute_async(
    worker: Any, scratch_workflows: Callable[[str], None]
) -> None:
    name = "test.worker.fan_out"
    scratch_workflows(name)

    @sv.workflow(name=name)
    def fan_out(ctx: sv.WorkflowContext, n: int) -> list[int]:
        futures = [basics.add.execute_async(ctx, {"a": i, "b": 100}) for i in range(n)]
        return [f.get(ctx) for f in futures]

    instance_id = sv.start_workflow(name, 5)
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == [100, 101, 102, 103, 104]
    rows = activity_rows(instance_id)
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
    assert all(r.data is not None and r.event_type == "ActivityCompleted" for r in rows)
    assert HistoryEvent.objects.filter(instance_id=instance_id, key="$close").count() == 1
    assert HistoryEvent.objects.filter(instance_id=instance_id).count() == 6
    assert {t.attempts for t in sv.list_activity_tasks(instance_id)} == {1}


# -- activity failures and retries ------------------------------------------------------


def test_non_retryable_application_error_fails_the_workflow(worker: Any) -> None:
    instance_id = sv.start_workflow("test.reject_flow", {"mode": "application"})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "failed"
    error = result.error
    assert isinstance(error, sv.ApplicationError)
    assert error.type == "PaymentDeclined"
    assert error.message == "card declined"
    assert error.details == {"code": 51}
    assert error.non_retryable is True
    (task,) = sv.list_activity_tasks(instance_id)
    assert (task.status, task.attempts, task.failures) == ("failed", 1, 1)
    assert isinstance(task.last_error, sv.ApplicationError)
    assert task.last_error.type == "PaymentDeclined"
    assert ledger("reject:") == ["reject:application"]  # never retried
    (row,) = activity_rows(instance_id)
    assert row.event_type == "ActivityFailed"
    close = HistoryEvent.objects.get(instance_id=instance_id, key="$close")
    assert close.event_type == "WorkflowFailed"


def test_definitions_non_retryable_errors_fail_at_once_with_the_qualified_type(
    worker: Any,
) -> None:
    instance_id = sv.start_workflow("test.reject_flow", {"mode": "listed", "order": 7})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "failed"
    assert isinstance(result.error, sv.ApplicationError)
    assert result.error.type == "tests.testapp.workflows.worker.InvalidOrder"
    assert result.error.message == "order 7 is invalid"
    (task,) = sv.list_activity_tasks(instance_id)
    assert (task.status, task.attempts) == ("failed", 1)
    assert ledger("reject:") == ["reject:listed"]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (
            "application",
            {
                "class": "ApplicationError",
                "type": "PaymentDeclined",
                "message": "card declined",
                "details": {"code": 51},
                "non_retryable": True,
            },
        ),
        (
            "listed",
            {
                "class": "ApplicationError",
                "type": "tests.testapp.workflows.worker.InvalidOrder",
                "message": "order 3 is invalid",
                "details": None,
                "non_retryable": False,
            },
        ),
    ],
)
def test_workflow_code_receives_the_rebuilt_activity_error(
    worker: Any, mode: str, expected: dict[str, Any]
) -> None:
    instance_id = sv.start_workflow("test.reject_flow", {"mode": mode, "order": 3, "catch": True})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == expected


def test_retryable_error_is_retried_until_it_succeeds(worker: Any) -> None:
    instance_id = sv.start_workflow("test.flaky_flow", {"tag": "r", "succeed_on": 3})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "ok on attempt 3"
    assert ledger("flaky:r:") == ["flaky:r:1", "flaky:r:2", "flaky:r:3"]
    (task,) = sv.list_activity_tasks(instance_id)
    assert (task.name, task.status, task.attempts, task.failures) == (
        "test.flaky",
        "completed",
        3,
        2,
    )
    assert task.options.retry_policy is not None
    assert task.options.retry_policy.max_attempts == 3
    assert isinstance(task.last_error, sv.ApplicationError)
    assert task.last_error.type == "tests.testapp.workflows.worker.FlakyError"
    assert task.last_error.message == "attempt 2 failed"
    (row,) = activity_rows(instance_id)
    assert (row.event_type, json.loads(row.data)) == ("ActivityCompleted", "ok on attempt 3")


def test_retry_exhaustion_raises_retry_exhausted_with_the_last_error(worker: Any) -> None:
    instance_id = sv.start_workflow("test.flaky_flow", {"tag": "x"})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "failed"
    error = result.error
    assert isinstance(error, sv.RetryExhaustedError)
    assert error.activity == "test.flaky"
    assert error.attempts == 3
    assert isinstance(error.last_error, sv.ApplicationError)
    assert error.last_error.type == "tests.testapp.workflows.worker.FlakyError"
    assert error.last_error.message == "attempt 3 failed"
    assert ledger("flaky:x:") == ["flaky:x:1", "flaky:x:2", "flaky:x:3"]
    (task,) = sv.list_activity_tasks(instance_id)
    assert (task.status, task.attempts, task.failures) == ("failed", 3, 3)


def test_per_call_retry_policy_is_recorded_and_used(worker: Any) -> None:
    instance_id = sv.start_workflow("test.flaky_flow", {"tag": "o", "max_attempts": 2})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert isinstance(result.error, sv.RetryExhaustedError)
    assert result.error.attempts == 2
    assert ledger("flaky:o:") == ["flaky:o:1", "flaky:o:2"]
    (task,) = sv.list_activity_tasks(instance_id)
    assert task.options.retry_policy is not None
    assert task.options.retry_policy.max_attempts == 2
    assert (task.attempts, task.failures) == (2, 2)


# -- replay -----------------------------------------------------------------------------


def _v1(ctx: sv.WorkflowContext, data: dict[str, Any]) -> int:
    options = sv.ActivityOptions(queue="nd-queue")
    return basics.add.execute_async(ctx, {"a": 1, "b": 2}, options=options).get(ctx)


def _v2_other_activity(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    return basics.record.execute(ctx, "v2")


def _v2_now_first(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    return ctx.now().isoformat()


def _v2_returns_early(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    return "nothing to do"


@pytest.mark.parametrize(
    ("changed", "expected", "actual"),
    [
        (_v2_other_activity, "activity", "activity"),
        (_v2_now_first, "activity", "now"),
        (_v2_returns_early, "activity", "return"),
    ],
    ids=["other-activity", "now-instead", "returns-early"],
)
def test_changed_workflow_code_fails_replay_with_nondeterminism(
    make_worker: Callable[..., Any],
    scratch_workflows: Callable[[str], None],
    changed: Callable[..., Any],
    expected: str,
    actual: str,
) -> None:
    name = "test.worker.changing"
    scratch_workflows(name)
    sv.workflow(name=name)(_v1)
    make_worker(activity_queues=["default-only"])
    instance_id = sv.start_workflow(name, {})

    # The first execution reserves the activity on a queue nobody serves, then suspends.
    wait_until(lambda: activity_rows(instance_id) and instance(instance_id).lease_owner == "")
    (reserved,) = activity_rows(instance_id)
    assert reserved.data is None
    assert instance(instance_id).status == "running"

    # Deploy different code under the same name, then serve the queue.
    registry.unregister(name, kind="workflow")
    sv.workflow(name=name)(changed)
    make_worker(activity_queues=["nd-queue"])
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "failed"
    error = result.error
    assert isinstance(error, sv.NondeterminismError), error
    assert (error.expected, error.actual) == (expected, actual)
    assert error.key == reserved.key
    # The diverging run wrote nothing but the close: no new commands, no new tasks.
    rows = list(HistoryEvent.objects.filter(instance_id=instance_id).order_by("id"))
    assert [(r.key, r.command) for r in rows] == [(reserved.key, "activity"), ("$close", "close")]
    assert [t.name for t in sv.list_activity_tasks(instance_id)] == ["test.add"]
    assert ledger("v2") == []


def test_finally_runs_on_suspension_and_the_workflow_completes_later(
    make_worker: Callable[..., Any], scratch_workflows: Callable[[str], None]
) -> None:
    name = "test.worker.finally"
    scratch_workflows(name)
    unwound: list[str] = []

    @sv.workflow(name=name)
    def with_cleanup(ctx: sv.WorkflowContext, data: dict[str, Any]) -> int:
        try:
            options = sv.ActivityOptions(queue="fin-queue")
            return basics.add.execute_async(ctx, {"a": 20, "b": 22}, options=options).get(ctx)
        finally:
            unwound.append(ctx.instance_id)
            # Rejected without writes while suspending; runs for real on the last dispatch.
            basics.record.execute(ctx, "cleanup")

    # Without a cache: a parked execution keeps its frames (test_workflow_cache.py).
    first = make_worker(activity_queues=["default-only"], workflow_cache={"MAX_ENTRIES": 0})
    instance_id = sv.start_workflow(name, {})
    wait_until(lambda: unwound and instance(instance_id).lease_owner == "")
    first.stop()  # one worker from here on, so the cleanup activity always runs inline

    assert unwound == [instance_id]
    assert instance(instance_id).status == "running"
    assert [r.data for r in activity_rows(instance_id)] == [None]  # no cleanup command
    assert ledger("cleanup") == []

    make_worker()  # serves every queue
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == 42
    assert unwound == [instance_id, instance_id]
    rows = activity_rows(instance_id)
    assert [json.loads(r.data) for r in rows] == [42, "cleanup"]
    assert ledger("cleanup") == ["cleanup"]


# -- fencing ----------------------------------------------------------------------------


def _store() -> DjangoStore:
    store = store_for("default", Codec())
    store.options.lease_ttl = 5.0
    return store


def _spec(name: str = "test.add") -> TaskSpec:
    return TaskSpec(
        name=name,
        workflow_name="test.worker.unserved",
        input=json.dumps({"a": 1, "b": 1}),
        queue="",
        options={},
        max_attempts=5,
        schedule_to_start_timeout=None,
        start_to_close_timeout=None,
        heartbeat_timeout=None,
    )


def test_a_stale_lease_holder_is_fenced_out_and_writes_nothing(
    tdb: None, db_clock: Callable[[float], None]
) -> None:
    store = _store()
    instance_id = sv.start_workflow("test.worker.unserved", {})
    old = store.instances.acquire(instance_id, "owner-a", ttl=5)
    assert old is not None and old.epoch == 1
    assert store.instances.acquire(instance_id, "owner-b", ttl=5) is None  # still held

    db_clock(6)  # owner-a's lease has expired on the database clock
    new = store.instances.acquire(instance_id, "owner-b", ttl=5)
    assert new == Fence(instance_id, "owner-b", 2)

    with pytest.raises(sv.Fenced):
        store.record_command(old, HistoryRow("#1:now", 1, "now", "NowRecorded", '"t"'))
    with pytest.raises(sv.Fenced):
        store.reserve_activity(
            old, HistoryRow("#1:test.add", 1, "activity"), _spec(), claim_owner="owner-a"
        )
    with pytest.raises(sv.Fenced):
        store.close(old, CloseRequest("completed", "1", None))
    assert store.instances.renew_lease(old, 5) is False
    store.release_lease(old, runnable=True)

    inst = instance(instance_id)
    assert (inst.status, inst.lease_owner, inst.lease_epoch) == ("running", "owner-b", 2)
    assert not HistoryEvent.objects.filter(instance_id=instance_id).exists()
    assert not ActivityTask.objects.filter(instance_id=instance_id).exists()

    # The current holder writes normally.
    stored, claimed = store.reserve_activity(
        new, HistoryRow("#1:test.add", 1, "activity"), _spec(), claim_owner=None
    )
    assert stored.key == "#1:test.add" and claimed is None
    assert store.instances.renew_lease(new, 5) is True
    assert store.close(new, CloseRequest("completed", "1", None)) == "completed"
    inst = instance(instance_id)
    assert (inst.status, inst.lease_owner) == ("completed", "")
    assert list(
        HistoryEvent.objects.filter(instance_id=instance_id).order_by("id").values_list("key")
    ) == [("#1:test.add",), ("$close",)]


def test_an_inline_claim_that_observes_cancellation_is_still_fenced_by_the_lease(
    tdb: None, db_clock: Callable[[float], None]
) -> None:
    store = _store()
    instance_id = sv.start_workflow("test.worker.unserved", {})
    old = store.instances.acquire(instance_id, "owner-a", ttl=5)
    assert old is not None
    db_clock(6)
    new = store.instances.acquire(instance_id, "owner-b", ttl=5)
    assert new is not None
    sv.cancel_workflow(instance_id, "stop")
    row = HistoryRow("#1:test.add", 1, "activity")
    with pytest.raises(sv.Fenced):  # a cancel request does not hide a lost lease
        store.reserve_activity(old, row, _spec(), claim_owner="owner-a", observe_cancel=True)
    assert not ActivityTask.objects.filter(instance_id=instance_id).exists()

    stored, claimed = store.reserve_activity(
        new, row, _spec(), claim_owner="owner-b", observe_cancel=True
    )
    assert claimed is None and stored.event_type == "ActivityCancelled"
    task = ActivityTask.objects.get(instance_id=instance_id)
    assert (task.status, task.attempts, task.claim_owner) == ("cancelled", 0, "")
    event = HistoryEvent.objects.get(instance_id=instance_id, key=row.key)
    assert (event.event_type, event.data, event.delivered_seq) == (
        "ActivityCancelled",
        stored.data,
        None,
    )


def test_a_stale_activity_claim_cannot_complete_retry_or_renew(
    tdb: None, db_clock: Callable[[float], None]
) -> None:
    store = _store()
    instance_id = sv.start_workflow("test.worker.unserved", {})
    fence = store.instances.acquire(instance_id, "owner-a", ttl=60)
    assert fence is not None
    store.reserve_activity(fence, HistoryRow("#1:test.add", 1, "activity"), _spec(), None)
    (first,) = store.tasks.claim_tasks("worker-1", 10, ["test.add"])
    assert store.tasks.claim_tasks("worker-2", 10, ["test.add"]) == []  # claimed and alive

    db_clock(6)  # the first claim has expired
    (second,) = store.tasks.claim_tasks("worker-2", 10, ["test.add"])
    assert second.claim.epoch == first.claim.epoch + 1
    assert second.attempt == 2

    assert store.tasks.complete_task(first.claim, "99") is False
    assert store.tasks.retry_task(first.claim, '{"message": "late"}', 0.1) is False
    assert store.tasks.fail_task(first.claim, '{"message": "late"}') is False
    assert store.tasks.renew_task(first.claim, 5) is False
    row = HistoryEvent.objects.get(instance_id=instance_id, key="#1:test.add")
    assert row.data is None

    assert store.tasks.complete_task(second.claim, "2") is True
    assert store.tasks.complete_task(second.claim, "3") is False  # first value wins
    row.refresh_from_db()
    assert (row.event_type, row.data) == ("ActivityCompleted", "2")
    task = ActivityTask.objects.get(instance_id=instance_id)
    assert (task.status, task.attempts, task.claim_owner) == ("completed", 2, "worker-2")


# -- leases under real workers ----------------------------------------------------------


def test_activity_longer_than_the_lease_ttl_runs_once_with_two_workers(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    first = make_worker(lease=SHORT_LEASE, worker_id="long-a")
    instance_id = sv.start_workflow("test.crashable", {"entry": "long", "hold_while": str(marker)})
    wait_until(lambda: ledger("started:long"))
    make_worker(lease=SHORT_LEASE, worker_id="long-b")
    task = ActivityTask.objects.get(instance_id=instance_id, name="test.slow_record")
    assert (task.claim_owner, task.attempts) == (first.worker_id, 1)
    expiries: set[int] = set()

    def nobody_else_took_over() -> None:
        inst = instance(instance_id)
        assert (inst.lease_owner, inst.lease_epoch) == ("long-a", 1)
        expiries.add(inst.lease_expires_ms)
        t = ActivityTask.objects.get(id=task.id)
        assert (t.status, t.claim_owner, t.claim_epoch, t.attempts) == (
            "running",
            "long-a",
            task.claim_epoch,
            1,
        )
        assert ledger("started:long") == ["started:long"]

    observe(3 * SHORT_LEASE["TTL"], nobody_else_took_over)
    assert len(expiries) >= 3  # the lease was renewed again and again
    marker.unlink()
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "before+long"
    assert ledger("started:long") == ["started:long"]
    assert [json.loads(r.data) for r in activity_rows(instance_id)] == ["before", "long"]
    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures) == ("completed", 1, 0)
    assert instance(instance_id).lease_epoch == 1


def test_instances_of_unregistered_workflows_stay_untouched(worker: Any) -> None:
    stranger = sv.start_workflow("test.worker.registered_nowhere", {"x": 1})
    known = sv.start_workflow("test.sum3", {"a": 1, "b": 1, "c": 1})
    assert sv.wait_workflow(known, timeout=20).output == 3
    # Keep the worker polling a while longer: the stranger must stay as it was.
    later = sv.start_workflow("test.sum3", {"a": 2, "b": 2, "c": 2})
    assert sv.wait_workflow(later, timeout=20).output == 6

    inst = instance(stranger)
    assert inst.status == "running"
    assert inst.runnable is True
    assert (inst.lease_owner, inst.lease_epoch, inst.lease_expires_ms) == ("", 0, None)
    assert not HistoryEvent.objects.filter(instance_id=stranger).exists()
    assert not ActivityTask.objects.filter(instance_id=stranger).exists()
    assert sv.describe(stranger).status == "running"


def test_stop_releases_leases_and_claims_for_another_worker(
    make_worker: Callable[..., Any], scratch_workflows: Callable[[str], None], marker: Path
) -> None:
    name = "test.worker.hold_pair"
    scratch_workflows(name)

    @sv.workflow(name=name)
    def hold_pair(ctx: sv.WorkflowContext, tag: str) -> list[str]:
        # The workflow thread runs one held attempt inline; the activity pool runs the other.
        futures = [
            worker_flows.hold.execute_async(ctx, {"entry": f"{tag}{i}", "hold_while": str(marker)})
            for i in range(2)
        ]
        held = [f.get(ctx) for f in futures]
        return [*held, basics.record.execute(ctx, f"after:{tag}")]

    first = make_worker(worker_id="stopping")
    inline_id = sv.start_workflow(
        "test.hold_then_record", {"entry": "inline", "hold_while": str(marker)}
    )
    pair_id = sv.start_workflow(name, "pair")
    wait_until(lambda: len(ledger("started:")) == 3)
    assert ActivityTask.objects.filter(claim_owner="stopping", status="running").count() == 3

    first.stop(timeout=1.5)

    assert not first.started
    assert list(WorkflowInstance.objects.exclude(lease_owner="").values_list("instance_id")) == []
    assert list(ActivityTask.objects.exclude(claim_owner="").values_list("key", "status")) == []
    tasks = ActivityTask.objects.filter(name="test.hold")
    # Released, not failed: no retry budget was used.
    assert sorted(tasks.values_list("status", "attempts", "failures")) == [("queued", 1, 0)] * 3
    assert ledger("done:") == []  # the attempts stopped early
    assert {instance(i).status for i in (inline_id, pair_id)} == {"running"}

    marker.unlink()
    make_worker(worker_id="successor")
    inline = sv.wait_workflow(inline_id, timeout=20)
    pair = sv.wait_workflow(pair_id, timeout=20)

    assert inline.status == "completed", inline.error
    assert inline.output == "inline+after:inline"
    assert pair.status == "completed", pair.error
    assert pair.output == ["pair0", "pair1", "after:pair"]
    assert sorted(tasks.values_list("attempts", flat=True)) == [2, 2, 2]
    assert ledger("done:") == ["done:inline", "done:pair0", "done:pair1"]
    assert ledger("after:") == ["after:inline", "after:pair"]


def test_stop_of_an_idle_worker_leaves_nothing_held(worker: Any) -> None:
    instance_id = sv.start_workflow("test.sum3", {"a": 0, "b": 0, "c": 1})
    assert sv.wait_workflow(instance_id, timeout=20).output == 1
    worker.stop(timeout=5)
    assert not worker.started
    assert not WorkflowInstance.objects.exclude(lease_owner="").exists()
    assert not ActivityTask.objects.exclude(claim_owner="").filter(status="running").exists()


# -- transactional activities -----------------------------------------------------------


def test_activities_run_in_a_transaction_only_when_transactional(worker: Any) -> None:
    instance_id = sv.start_workflow("test.atomic_probe", None)
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == [False, True]


def test_transactional_activity_commits_its_writes_with_its_result(worker: Any) -> None:
    instance_id = sv.start_workflow("test.tx_flow", {"entry": "ok"})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "tx:ok:1"
    assert ledger("tx:ok") == ["tx:ok:1"]
    (row,) = activity_rows(instance_id)
    assert json.loads(row.data) == "tx:ok:1"


def test_failed_transactional_attempt_leaves_no_writes_but_keeps_its_failure(
    worker: Any,
) -> None:
    instance_id = sv.start_workflow("test.tx_flow", {"entry": "retry", "fail_on": [1, 2]})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "tx:retry:3"
    assert ledger("tx:retry") == ["tx:retry:3"]  # attempts 1 and 2 rolled back
    (task,) = sv.list_activity_tasks(instance_id)
    # The failure records were not rolled back with the attempts' writes.
    assert (task.attempts, task.failures) == (3, 2)
    assert isinstance(task.last_error, sv.ApplicationError)
    assert task.last_error.message == "attempt 2 failed after writing"


def test_failing_transactional_activity_leaves_no_writes_at_all(worker: Any) -> None:
    instance_id = sv.start_workflow("test.tx_flow", {"entry": "never", "fail_on": [1, 2, 3]})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert isinstance(result.error, sv.RetryExhaustedError)
    assert result.error.attempts == 3
    assert ledger("tx:never") == []


def test_fenced_out_transactional_attempt_rolls_back_its_writes(
    make_worker: Callable[..., Any],
) -> None:
    make_worker(lease=SHORT_LEASE)
    instance_id = sv.start_workflow("test.tx_flow", {"entry": "lost", "lose_claim_on": [1]})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    # Attempt 1 lost its claim before committing: its row and result were discarded.
    assert result.output == "tx:lost:2"
    assert ledger("tx:lost") == ["tx:lost:2"]
    (row,) = activity_rows(instance_id)
    assert json.loads(row.data) == "tx:lost:2"
    (task,) = sv.list_activity_tasks(instance_id)
    assert (task.status, task.attempts) == ("completed", 2)
