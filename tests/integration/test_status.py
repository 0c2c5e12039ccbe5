"""The status report (``operations.status``): what it says about real workers and instances.

Workers are real worker threads; the instances are driven by them, or by the store's
own lease operations where a test needs an instance dispatched over and over. Every
read is bounded and walks an index: the EXPLAIN test checks the plans on each database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.models import (
    ActivityTask,
    TimerSubscription,
    WorkerHeartbeat,
    WorkflowInstance,
)
from selvedge_django.operations import status as status_module
from selvedge_django.operations.status import status_report
from selvedge_django.storage import store_for
from selvedge_django.testing import FaultInjector, run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until


def report_when(predicate: Callable[[dict[str, Any]], bool], **kwargs: Any) -> dict[str, Any]:
    """The first report for which ``predicate`` holds (polled with a deadline)."""
    found: list[dict[str, Any]] = []

    def check() -> bool:
        report = status_report(**kwargs)
        found[:] = [report]
        return predicate(report)

    wait_until(check)
    return found[0]


def worker_ids(report: dict[str, Any]) -> list[str]:
    return [w["worker_id"] for w in report["workers"]]


def test_the_report_lists_live_workers_and_the_leader_and_forgets_a_stopped_one(
    make_worker: Callable[..., Worker],
) -> None:
    first = make_worker(worker_id="status-a", activity_queues=["alpha", "beta"])
    second = make_worker(worker_id="status-b")
    report = report_when(
        lambda r: worker_ids(r) == ["status-a", "status-b"] and r["leader"] is not None
    )
    assert report["status"] == "ok"
    assert report["leader"] in ("status-a", "status-b")
    by_id = {w["worker_id"]: w for w in report["workers"]}
    assert by_id["status-a"]["queues"] == ["alpha", "beta"]
    assert by_id["status-b"]["queues"] is None
    assert [w["leader"] for w in report["workers"]].count(True) == 1
    for w in report["workers"]:
        assert w["last_seen"] and 0 <= w["last_seen_age_s"] < 60
        assert w["pid"] > 0 and w["hostname"]
    assert report["warnings"] == []

    first.stop(timeout=10)
    # A graceful stop deletes the row: not alive, and not lost either.
    report = status_report()
    assert worker_ids(report) == ["status-b"]
    assert report["lost_workers"] == []
    assert not WorkerHeartbeat.objects.filter(worker_id="status-a").exists()
    second.stop(timeout=10)
    report = status_report()
    assert report["workers"] == [] and report["leader"] is None
    assert report["warnings"] == ["no worker is alive"]


def test_queue_depths_and_the_oldest_due_task_per_queue(
    make_worker: Callable[..., Worker],
) -> None:
    # The worker serves "other" only: the three tasks stay queued on "status-parked".
    make_worker(worker_id="status-q", activity_queues=["other"])
    ids = [sv.start_workflow("status.parked_flow", n) for n in range(3)]
    wait_until(lambda: ActivityTask.objects.filter(queue="status-parked").count() == 3)
    report = status_report()
    queue = report["queues"]["status-parked"]
    assert (queue["queued"], queue["due"], queue["running"]) == (3, 3, 0)
    assert queue["oldest_queued_age_s"] is not None and queue["oldest_queued_age_s"] >= 0
    assert report["running_instances"] == 3
    # Each instance waits for its activity: suspended, not runnable.
    assert report["runnable_instances"] == 0
    for iid in ids:
        sv.cancel_workflow(iid, "done looking")


def test_runnable_instances_nobody_dispatches_are_counted_and_reported_stuck(tdb: None) -> None:
    # No worker at all: the starts stay runnable.
    ids = sorted(sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": n}) for n in range(4))
    report = status_report(stuck_after=0)
    assert report["runnable_instances"] == 4
    assert report["oldest_runnable_age_s"] is not None
    stuck = [s for s in report["stuck"] if s["reason"] == "not_dispatched"]
    assert sorted(s["instance_id"] for s in stuck) == ids
    assert "no worker is alive" in report["warnings"]
    assert "4 stuck instance(s)" in report["warnings"]
    # With the default threshold (a minute) they are not stuck yet.
    assert status_report()["stuck"] == []


def test_a_lease_that_expired_and_nobody_took_over_is_stuck(tdb: None) -> None:
    iid = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    store = store_for("default", Codec())
    fence = store.instances.acquire(iid, "gone-worker", 0.05)
    assert fence is not None
    wait_until(lambda: store.now_ms() > 100 + (store.get_instance(iid).lease_expires_ms or 0))
    stuck = status_report(stuck_after=0.01)["stuck"]
    assert [(s["instance_id"], s["reason"]) for s in stuck] == [(iid, "lease_expired")]
    assert "gone-worker" in stuck[0]["detail"]


def test_due_timers_no_worker_fires_are_counted(make_worker: Callable[..., Worker]) -> None:
    worker = make_worker(worker_id="status-t")
    iid = sv.start_workflow("status.nap", 0.2)
    wait_until(lambda: TimerSubscription.objects.filter(instance_id=iid).exists())
    worker.stop(timeout=10)
    report = report_when(lambda r: r["due_timers"] == 1)
    assert report["oldest_due_timer_age_s"] >= 0
    assert report["workers"] == []


@pytest.fixture
def faults(tdb: None) -> Iterator[FaultInjector]:
    with FaultInjector() as injector:
        yield injector


def test_an_instance_held_back_after_storage_errors_is_a_hot_loop(
    faults: FaultInjector,
) -> None:
    iid = sv.start_workflow("poison.sleep", 60)
    faults.fail_statement(operation="reserve_timer", instance_id=iid, times=10**6)
    healthy = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    run_until_idle(Worker(run_local_starts=False, execution_error_backoff=30))
    assert sv.get_workflow_result(healthy).output == 6
    hot = status_report()["hot_loops"]
    assert [(h["instance_id"], h["reason"], h["execution_errors"]) for h in hot] == [
        (iid, "execution_errors", 1)
    ]
    assert "InjectedFault" in hot[0]["last_error"]


def test_an_instance_dispatched_again_and_again_without_progress_is_a_hot_loop(
    tdb: None,
) -> None:
    iid = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    calm = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 4})
    store = store_for("default", Codec())
    # What a worker whose every execution ends at once looks like in the database.
    for _ in range(status_module.HOT_LOOP_DISPATCHES):
        fence = store.instances.acquire(iid, "spinner", 5)
        assert fence is not None
        store.release_lease(fence, runnable=True)
    hot = status_report()["hot_loops"]
    assert [(h["instance_id"], h["reason"]) for h in hot] == [(iid, "dispatched_without_progress")]
    assert hot[0]["dispatches"] == status_module.HOT_LOOP_DISPATCHES
    assert calm not in [h["instance_id"] for h in hot]


def test_many_generations_of_continue_as_new_are_not_a_hot_loop(tdb: None) -> None:
    generations = status_module.HOT_LOOP_DISPATCHES + 10
    iid = sv.start_workflow("status.generations", generations)
    run_until_idle(Worker(run_local_starts=False))
    instance = WorkflowInstance.objects.get(instance_id=iid)
    assert instance.status == "running" and instance.lease_epoch > generations
    # A signal it does not wait for makes it runnable: looked at, and found calm.
    sv.signal(iid, "other", None)
    report = status_report()
    assert report["runnable_instances"] == 1
    assert report["hot_loops"] == []


def test_instances_over_the_history_warning_threshold_are_listed(
    make_worker: Callable[..., Worker],
) -> None:
    make_worker(worker_id="status-h")
    long_one = sv.start_workflow("status.ticks", 100)
    short_one = sv.start_workflow("status.ticks", 100)
    for _ in range(8):
        sv.signal(long_one, "tick", None)
    sv.signal(short_one, "tick", None)
    with override_settings(SELVEDGE={"HISTORY_WARNING_THRESHOLD": 5}):
        report = report_when(lambda r: bool(r["long_histories"]))
        assert [h["instance_id"] for h in report["long_histories"]] == [long_one]
        assert report["long_histories"][0]["commands"] > 5
        assert report["history_warning_threshold"] == 5
    assert status_report()["long_histories"] == []


# -- the plans: every large read walks an index ----------------------------------------------


class Explainer:
    """A ``connection.execute_wrapper`` that EXPLAINs every SELECT of the app's tables
    before running it."""

    def __init__(self) -> None:
        self.plans: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith("SELECT") and '"selvedge_django_' in sql:
            prefix = "EXPLAIN " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "
            execute(prefix + sql, params, many, context)
            rows = context["cursor"].fetchall()
            self.plans.append(sql + "\n  -> " + "\n     ".join(" ".join(map(str, r)) for r in rows))
        return execute(sql, params, many, context)


def unindexed(plan: str) -> bool:
    """Whether a plan reads a table without an index, or sorts rows to find the first few."""
    statement, steps = plan.split("  -> ", 1)
    if connection.vendor == "postgresql":
        return "Seq Scan" in steps or ("ORDER BY" in statement and "Sort" in steps)
    return "TEMP B-TREE FOR ORDER BY" in steps or any(
        line.strip().startswith(("SCAN ", "|--SCAN ", "`--SCAN ")) and "INDEX" not in line
        for line in steps.splitlines()
    )


def test_every_read_of_the_report_uses_an_index(tdb: None) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # What is checked is that an index can serve each read (and its ORDER BY),
            # not which plan today's statistics favour: the tables are tiny here and
            # earlier tests leave statistics behind, so other paths are priced out.
            cursor.execute("SET enable_seqscan = off")
            cursor.execute("SET enable_bitmapscan = off")
            cursor.execute("SET enable_sort = off")
    # Some rows, so that the queues' loop and the per-queue reads run too.
    sv.start_workflow("status.parked_flow", 1)
    run_until_idle(Worker(activity_queues=["other"]))
    explainer = Explainer()
    try:
        with connection.execute_wrapper(explainer):
            status_report()
    finally:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET enable_seqscan = on")
                cursor.execute("SET enable_bitmapscan = on")
                cursor.execute("SET enable_sort = on")
    assert len(explainer.plans) >= 15
    print("\n\n".join(explainer.plans))
    bad = [plan for plan in explainer.plans if unindexed(plan)]
    assert not bad, "\n\n".join(bad)


def index_sql(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = %s", [name])
        return str(cursor.fetchone()[0])


def recreate_index(name: str, create: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f'DROP INDEX "{name}"')
        cursor.execute(create)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's INDEXED BY only")
def test_sqlite_reads_fit_the_index_of_either_django_version_or_fall_back(
    tdb: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Django 5.2 writes the ready index's condition with "runnable", 6.1 with "runnable" = 1
    (the report's hinted read failed with "no query solution" on 6.1 before); an index of
    another shape altogether makes the read fall back to the planner's choice."""
    ids = sorted(sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": n}) for n in range(2))
    ready, history = index_sql("sv_inst_ready_idx"), index_sql("sv_inst_long_history_idx")
    try:
        recreate_index("sv_inst_ready_idx", ready.replace('"runnable" AND', '"runnable" = 1 AND'))
        assert '"runnable" = 1' in index_sql("sv_inst_ready_idx")
        with override_settings(SELVEDGE={"HISTORY_WARNING_THRESHOLD": 2000}):
            report = status_report(stuck_after=0)
        assert report["runnable_instances"] == 2
        assert sorted(s["instance_id"] for s in report["stuck"]) == ids
        assert "does not fit" not in caplog.text  # the hinted reads ran as they were
        recreate_index("sv_inst_long_history_idx", history.replace(">= 1000", ">= 5000"))
        with override_settings(SELVEDGE={"HISTORY_WARNING_THRESHOLD": 2000}):
            assert status_report()["long_histories"] == []
        assert "index sv_inst_long_history_idx does not fit" in caplog.text
    finally:
        recreate_index("sv_inst_ready_idx", ready)
        recreate_index("sv_inst_long_history_idx", history)
