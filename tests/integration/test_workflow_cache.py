"""The workflow cache on real databases and worker threads: continued, not replayed.

The cache must change nothing but the cost: the last test runs every workflow of
the test app in a worker without the cache and in one with it, drives both the
same way (a signal to each instance parked at a receive, a cancel request to
some), and compares the recorded histories row by row.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.models import F
from django.test import override_settings

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
)
from tests.conftest import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

CACHE = {"MAX_ENTRIES": 200}
# The "manual" and "elsewhere" queues stay unserved, as in the tests of those workflows.
FAST = {
    "timer_check_interval": 0.05,
    "workflow_resumption_interval": 0.05,
    "activity_queues": [""],
}

# The input each test-app workflow is started with (None where it takes none).
INPUTS: dict[str, Any] = {
    "pause.activity": "a",
    "pause.other": "o",
    "pause.gated": None,
    "act.run": {"activity": "act.step", "input": "x", "background": True, "then": "after"},
    "act.poked_then_away": "p",
    "act.fan_out": {"n": 3, "tag": "f"},
    "act.all_ready": {"n": 2, "input": "w"},
    "act.forget": {"tag": "g"},
    "act.bad_options": {"attempts": 0},
    "test.sum3": {"a": 1, "b": 2, "c": 3},
    "test.ledger": ["one", "two"],
    "cancel.wait": {"kind": "receive"},
    "cancel.reads": None,
    "cancel.future": {"entry": "e"},
    "cancel.cleanup": None,
    "cancel.scope": {"entry": "s"},
    "cancel.scope_uncaught": None,
    "cancel.scope_choice": {"inside": True},
    "cancel.detached_scope": None,
    "cancel.in_finally": None,
    "cancel.unawaited": {"entry": "u"},
    "saga.run": {"steps": ["a", "b"], "wait": True, "fail": True},
    "can.count": {"total": 0, "batch": 2},
    "can.echo": "e",
    "can.waiter": "w",
    "can.children": 1,
    "can.stale_parent": 1,
    "can.misuse": "unencodable",
    "status.parked_flow": "v",
    "status.nap": 0.1,
    "status.ticks": 3,
    "status.tour": None,
    'status.<b>stalled</b> & "held"': None,
    "status.generations": 2,
    "inline.two_steps": None,
    "inline.then_wait": None,
    "inline.one_step": None,
    "child.echo": "echo",
    "child.waiter": None,
    "child.fail": {"mode": "raise"},
    "child.basic": {"child_id": "cmp-named-child"},
    "child.duplicate": {"child_id": "cmp-child.echo"},
    "child.errors": {"catch": True},
    # An input its activity completes with at once ("" is no file): with {} the
    # activity failed and retried with backoff, and how far each side got under load
    # decided the comparison.
    "child.ready": {"entry": "r", "hold_while": ""},
    "child.cancel_handle": None,
    "child.tree": 2,
    "child.leave_running": {"fail": False},
    "disclosure.order": {"card": "4111"},
    "fault.child": {"tag": "c"},
    "fault.flow": {"tag": "f", "sleep": 0.1},
    "fault.deep_result": 5,
    "fault.waiter": None,
    "fault.flow2": {"tag": "f2"},
    "limits.grow": {"steps": 3, "size": 10},
    "limits.inbox": 4,
    "limits.wait_many": 2,
    "limits.cancel_many": {"tasks": 2, "children": 2, "orphans": 0},
    "fair.busy": 3,
    "fair.late": "late",
    "poison.sleep": 0.1,
    "poison.wait": {"form": "receive", "seconds": 0.1},
    "resume.order": "o",
    "resume.signals": None,
    "resume.child": "c",
    "resume.parent": "p",
    "resume.caught": "c",
    "resume.reserving_child": "r",
    "resume.default_child_parent": "d",
    "flow.run": {"tag": "cache", "options": {"priority": 3}},
    "flow.backlog": {"tasks": [["cache-low", 0], ["cache-high", 50]]},
    "scale.three": "t",
    "sched.echo": 1,
    "sched.wait": 1,
    "terminate.parent": None,
    "wait.receive": {"channels": ["a", "b", "a", "c"]},
    "wait.inbox": None,
    "wait.sleep": {"seconds": 0.1, "form": "timer"},
    "wait.timer_handle": {"seconds": 0.2, "poke": True},
    "wait.bad_duration": "nan",
    "wait.receive_timeout": {"timeout": 3600, "then": "d"},
    "wait.condition": None,
    "wait.get_no_batch": {"seconds": 0.1},
    "wait.bad_predicate": "raise",
    "wait.time": {"seconds": 0.1},
    "wait.deadline": None,
    "child.catch_get": None,
    "test.flaky_flow": {"max_attempts": 3},
    "test.reject_flow": {"catch": True},
    "test.tx_flow": {},
    "test.atomic_probe": None,
    "test.streams.steps": 2,
    "test.streams.retried": 1,
    "test.streams.once": "x",
    "test.streams.closed": None,
    "test.streams.many": 3,
    "test.streams.big": 10,
}
# Sent a cancel request once parked (after the signals it was sent, if any).
CANCEL = {
    "cancel.wait",
    "cancel.future",
    "cancel.cleanup",
    "cancel.scope",
    "child.catch_get",
    "fault.waiter",
    "child.waiter",
    "terminate.parent",
    "limits.cancel_many",
}
# Not run here, each for a reason of its own test's.
SKIP = {
    "act.swallow_away": "swallows its suspension, which a parked execution never raises"
    " (the misuse is reported when it unwinds, after the cache lets it go)",
    "test.crashable": "kills its worker process",
    "child.remote": "registered only by another worker process",
    "child.of_client": "started by a client outside a worker",
    "fault.stall": "stalls until its test releases it",
    "fault.limits": "exercises payload limits with inputs of its own test",
    "poison.keys": "writes what no database stores (its execution errors back off)",
    "poison.options": "fails every execution on purpose (backs off)",
    "scale.queued": "needs a worker process on another queue",
    "terminate.everything": "waits to be terminated",
    "pause.timers": "waits for three timers, up to 30 s",
    "pause.receive": "waits for a signal its pause tests send",
    "pause.held": "waits for a signal its pause tests send",
    "terminate.timed_parent": "waits for an execution timeout",
    "wait.receive_around_hold": "holds an inline attempt until its test releases it",
    "wait.crash_timer": "kills its worker process",
    "wait.crash_receive": "kills its worker process",
    "test.hold_then_record": "holds an inline attempt until its test releases it",
    "cancel.misuse": "calls from a foreign thread (timing of its own test)",
    "test.streams.answer": "its activity waits for a threading event its test sets",
    "test.streams.crashy": "its first attempt waits until its worker process is killed",
}
MAX_SIGNALS = 5


def _resume_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("selvedge-resume-")]


def _parked(iid: str, seq: int) -> bool:
    return WorkflowInstance.objects.filter(
        instance_id=iid, lease_owner="", runnable=False, parked_seq__gte=seq
    ).exists()


def _receive(worker: Any, iid: str, payloads: list[Any]) -> None:
    """Send each payload once the instance parked at its receive (one resumption each)."""
    for n, payload in enumerate(payloads):
        wait_until(lambda n=n: _parked(iid, n + 1))  # type: ignore[misc]
        sv.signal(iid, "a", payload)


# -- continued, not replayed -------------------------------------------------------------


def test_signals_one_by_one_continue_the_parked_execution(make_worker: Any) -> None:
    replays: list[str] = []

    class Hooks(sv.hooks.WorkflowHooks):
        def on_workflow_replayed(self, event: Any) -> None:
            replays.append(event.instance_id)

    worker = make_worker(workflow_cache=CACHE, hooks=Hooks())
    iid = sv.start_workflow("wait.receive", {"channels": ["a"] * 5})
    _receive(worker, iid, [0, 1, 2, 3, 4])
    assert sv.wait_workflow(iid, timeout=20).output == [0, 1, 2, 3, 4]
    stats = worker.workflow_cache_stats()
    assert (stats["hits"], stats["misses"], replays) == (5, 0, [])
    assert stats["entries"] == 0  # it closed: nothing is kept
    wait_until(lambda: worker.workflow_cache_stats()["threads"] == 0)


def test_without_the_cache_each_signal_replays(make_worker: Any) -> None:
    replays: list[str] = []

    class Hooks(sv.hooks.WorkflowHooks):
        def on_workflow_replayed(self, event: Any) -> None:
            replays.append(event.instance_id)

    # Off explicitly: SELVEDGE_TEST_WORKFLOW_CACHE may give every worker a cache.
    worker = make_worker(hooks=Hooks(), workflow_cache={"MAX_ENTRIES": 0})
    iid = sv.start_workflow("wait.receive", {"channels": ["a"] * 3})
    _receive(worker, iid, [0, 1, 2])
    assert sv.wait_workflow(iid, timeout=20).output == [0, 1, 2]
    # Each resumption after the first has history to replay (the first had none yet).
    assert replays == [iid] * 2
    assert worker.workflow_cache_stats()["hits"] == 0


def test_a_default_worker_keeps_suspended_executions(make_worker: Any) -> None:
    # No WORKFLOW_CACHE setting (unless SELVEDGE_TEST_WORKFLOW_CACHE says otherwise).
    if os.environ.get("SELVEDGE_TEST_WORKFLOW_CACHE"):
        pytest.skip("SELVEDGE_TEST_WORKFLOW_CACHE replaces the default cache")
    assert sv.conf.get_settings().workflow_cache.max_entries == 100
    worker = make_worker()
    iid = sv.start_workflow("wait.receive", {"channels": ["a"] * 3})
    _receive(worker, iid, [0, 1, 2])
    assert sv.wait_workflow(iid, timeout=20).output == [0, 1, 2]
    assert worker.workflow_cache_stats()["hits"] == 3


# -- sleeps ------------------------------------------------------------------------------


def test_a_long_sleep_unwinds_and_keeps_no_thread(make_worker: Any) -> None:
    worker = make_worker(workflow_cache=CACHE, **FAST)
    threads = len(_resume_threads())
    ids = [sv.start_workflow("status.nap", 3600) for _ in range(5)]
    wait_until(lambda: TimerSubscription.objects.count() == 5 and all(_parked(i, 1) for i in ids))
    stats = worker.workflow_cache_stats()
    assert (stats["parked"], stats["entries"], stats["threads"]) == (0, 0, 0), stats
    assert len(_resume_threads()) == threads
    # The timers come due now: each instance replays to its end, as without a cache.
    TimerSubscription.objects.update(fire_at_ms=0)
    for iid in ids:
        assert sv.wait_workflow(iid, timeout=20).output == "rested"
    assert worker.workflow_cache_stats()["hits"] == 0


def test_a_sleep_within_the_sticky_window_stays_parked(make_worker: Any) -> None:
    worker = make_worker(workflow_cache={**CACHE, "STICKY_WINDOW": 5.0}, **FAST)
    iid = sv.start_workflow("status.nap", 0.5)
    assert sv.wait_workflow(iid, timeout=20).output == "rested"
    stats = worker.workflow_cache_stats()
    assert (stats["parked"], stats["hits"]) == (1, 1), stats


# -- what lets a parked execution go -----------------------------------------------------


def test_another_lease_in_between_replays_instead(make_worker: Any) -> None:
    worker = make_worker(workflow_cache=CACHE)
    iid = sv.start_workflow("wait.receive", {"channels": ["a", "a"]})
    _receive(worker, iid, [0])
    wait_until(lambda: _parked(iid, 2))
    # Some other worker's lease came and went (each lease takes the next epoch).
    WorkflowInstance.objects.filter(instance_id=iid).update(lease_epoch=F("lease_epoch") + 1)
    sv.signal(iid, "a", 1)
    assert sv.wait_workflow(iid, timeout=20).output == [0, 1]
    stats = worker.workflow_cache_stats()
    assert (stats["hits"], stats.get("let_go_lease")) == (1, 1), stats


def test_a_cancel_request_replays_and_is_observed(make_worker: Any) -> None:
    worker = make_worker(workflow_cache=CACHE)
    iid = sv.start_workflow("cancel.wait", {"kind": "receive"})
    wait_until(lambda: _parked(iid, 1))
    sv.cancel_workflow(iid, "stop")
    assert sv.wait_workflow(iid, timeout=20).status == "cancelled"
    assert worker.workflow_cache_stats().get("let_go_status") == 1


def test_a_redefined_workflow_replays(make_worker: Any, redefine: Any) -> None:
    worker = make_worker(workflow_cache=CACHE)
    iid = sv.start_workflow("wait.receive", {"channels": ["a", "a"]})
    wait_until(lambda: _parked(iid, 1))

    def changed(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[Any]:
        return ["new", *(ctx.receive(channel) for channel in data["channels"])]

    redefine("wait.receive", changed)
    sv.signal(iid, "a", 0)
    wait_until(lambda: _parked(iid, 2))
    sv.signal(iid, "a", 1)
    assert sv.wait_workflow(iid, timeout=20).output == ["new", 0, 1]
    stats = worker.workflow_cache_stats()
    assert stats.get("let_go_code") == 1 and stats["hits"] == 1, stats


def test_terminate_while_parked_closes_and_the_entry_is_let_go_later(make_worker: Any) -> None:
    # No sticky window: an entry may be let go for a newcomer as soon as it parked.
    worker = make_worker(workflow_cache={"MAX_ENTRIES": 1, "STICKY_WINDOW": 0})
    first = sv.start_workflow("wait.receive", {"channels": ["a"]})
    wait_until(lambda: _parked(first, 1))
    sv.terminate_workflow(first, "enough")
    assert sv.wait_workflow(first, timeout=20).status == "failed"
    # The terminated instance is never leased again: the next park takes its place.
    second = sv.start_workflow("wait.receive", {"channels": ["a"]})
    _receive(worker, second, [7])
    assert sv.wait_workflow(second, timeout=20).output == [7]
    stats = worker.workflow_cache_stats()
    assert stats.get("let_go_evicted") == 1 and stats["hits"] == 1, stats


# -- bounds ------------------------------------------------------------------------------


def test_threads_stay_within_resumptions_plus_entries(make_worker: Any) -> None:
    worker = make_worker(workflow_cache={"MAX_ENTRIES": 3}, max_concurrent_resumptions=2)
    ids = [sv.start_workflow("wait.receive", {"channels": ["a", "a"]}) for _ in range(8)]
    for iid in ids:
        wait_until(lambda iid=iid: _parked(iid, 1))  # type: ignore[misc]
    assert len(_resume_threads()) <= 2 + 3
    stats = worker.workflow_cache_stats()
    assert stats["entries"] <= 3 and stats["threads"] <= 3, stats
    for round_ in range(2):
        for iid in ids:
            wait_until(lambda iid=iid, at=round_ + 1: _parked(iid, at))  # type: ignore[misc]
            sv.signal(iid, "a", round_)
            assert len(_resume_threads()) <= 2 + 3
    for iid in ids:
        assert sv.wait_workflow(iid, timeout=30).output == [0, 1]
    assert len(_resume_threads()) <= 2 + 3
    assert worker.workflow_cache_stats()["hits"] >= 1


@pytest.fixture
def resume_connections() -> Iterator[list[str]]:
    """The names of the resume threads that open a database connection during the test."""
    from django.db.backends.signals import connection_created

    opened: list[str] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        name = threading.current_thread().name
        if name.startswith("selvedge-resume-"):
            opened.append(name)

    connection_created.connect(count, weak=False)
    try:
        yield opened
    finally:
        connection_created.disconnect(count)


def test_waiting_one_at_a_time_opens_no_connection_per_wait(
    make_worker: Any, resume_connections: list[str]
) -> None:
    # A kept execution's thread rejoins the pool when its workflow ends, so the next
    # workflow that waits does not need a new thread, nor that thread a new connection.
    worker = make_worker(workflow_cache=CACHE, max_concurrent_resumptions=2)
    for n in range(8):
        iid = sv.start_workflow("wait.receive", {"channels": ["a"]})
        _receive(worker, iid, [n])
        assert sv.wait_workflow(iid, timeout=20).output == [n]
    assert worker.workflow_cache_stats()["hits"] == 8
    assert len(resume_connections) <= 3, resume_connections


def test_the_thread_that_leaves_an_oversized_pool_is_the_coldest(
    make_worker: Any, resume_connections: list[str]
) -> None:
    # One workflow waits at a time: its thread rejoins the pool, one over its size, and
    # after SURPLUS_IDLE one thread leaves. The one that ran the waits, its connection
    # open, stays: the next waits open no connection.
    worker = make_worker(workflow_cache=CACHE, max_concurrent_resumptions=2)
    for n in range(6):
        if n == 3:  # the pool shrinks back to its size while nothing runs
            wait_until(lambda: len(_resume_threads()) == 2, timeout=10)
        iid = sv.start_workflow("wait.receive", {"channels": ["a"]})
        _receive(worker, iid, [n])
        assert sv.wait_workflow(iid, timeout=20).output == [n]
        # Its thread is back on the pool's idle stack before the next start.
        wait_until(lambda: worker.workflow_cache_stats()["threads"] == 0)
    # One connection: the thread that ran them all.
    assert len(resume_connections) == 1, resume_connections


def test_threads_beyond_the_pool_size_exit_once_idle(make_worker: Any) -> None:
    worker = make_worker(workflow_cache={"MAX_ENTRIES": 4}, max_concurrent_resumptions=2)
    ids = [sv.start_workflow("wait.receive", {"channels": ["a"]}) for _ in range(4)]
    for iid in ids:
        wait_until(lambda iid=iid: _parked(iid, 1))  # type: ignore[misc]
    assert worker.workflow_cache_stats()["threads"] == 4
    for n, iid in enumerate(ids):
        sv.signal(iid, "a", n)
    assert [sv.wait_workflow(iid, timeout=20).output for iid in ids] == [[0], [1], [2], [3]]
    # The four rejoined the pool; those beyond its two threads leave once idle.
    wait_until(lambda: len(_resume_threads()) == 2, timeout=10)
    assert worker.workflow_cache_stats()["threads"] == 0


def test_more_waiting_at_once_than_entries_declines_newcomers_instead_of_thrashing(
    make_worker: Any,
) -> None:
    worker = make_worker(workflow_cache={"MAX_ENTRIES": 2, "STICKY_WINDOW": 30})
    ids = [sv.start_workflow("wait.receive", {"channels": ["a"]}) for _ in range(4)]
    for iid in ids:
        wait_until(lambda iid=iid: _parked(iid, 1))  # type: ignore[misc]
    stats = worker.workflow_cache_stats()
    # The first two parked are kept (younger than the window); the others unwound.
    assert (stats["parked"], stats["declined"], stats["entries"]) == (2, 2, 2), stats
    assert stats.get("let_go_evicted", 0) == 0, stats
    for n, iid in enumerate(ids):
        sv.signal(iid, "a", n)
    assert [sv.wait_workflow(iid, timeout=20).output for iid in ids] == [[0], [1], [2], [3]]
    assert worker.workflow_cache_stats()["hits"] == 2


def test_an_execution_over_max_bytes_is_not_kept(make_worker: Any) -> None:
    worker = make_worker(workflow_cache={"MAX_ENTRIES": 5, "MAX_BYTES": 1024})
    iid = sv.start_workflow("wait.receive", {"channels": ["a", "a"]})
    _receive(worker, iid, [0, 1])
    assert sv.wait_workflow(iid, timeout=20).output == [0, 1]
    stats = worker.workflow_cache_stats()
    assert (stats["hits"], stats["parked"], stats["threads"]) == (0, 0, 0)
    assert stats["declined"] >= 2


def test_stopping_lets_parked_executions_go_and_another_worker_finishes(
    make_worker: Any,
) -> None:
    first = make_worker(workflow_cache=CACHE)
    iid = sv.start_workflow("wait.receive", {"channels": ["a", "a"]})
    _receive(first, iid, [0])
    wait_until(lambda: _parked(iid, 2))
    first.stop(timeout=10)
    assert first.workflow_cache_stats()["threads"] == 0
    assert _resume_threads() == []
    make_worker()
    sv.signal(iid, "a", 1)
    assert sv.wait_workflow(iid, timeout=20).output == [0, 1]


def test_a_parked_execution_runs_its_finally_once_when_it_really_leaves_it(
    make_worker: Any,
) -> None:
    name = "cache.scratch.finally"
    unwound: list[str] = []

    @sv.workflow(name=name)
    def with_cleanup(ctx: sv.WorkflowContext, _: Any) -> list[Any]:
        try:
            return [ctx.receive("a"), ctx.receive("a")]
        finally:
            unwound.append(ctx.instance_id)

    try:
        worker = make_worker(workflow_cache=CACHE)
        iid = sv.start_workflow(name, None)
        _receive(worker, iid, [0, 1])
        assert sv.wait_workflow(iid, timeout=20).output == [0, 1]
        assert worker.workflow_cache_stats()["hits"] == 2
        assert unwound == [iid]  # without the cache: once per suspension, three in all
    finally:
        registry.unregister(name, kind="workflow")


def test_a_continued_execution_past_the_history_threshold_logs_the_warning(
    make_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="selvedge_django")
    worker = make_worker(workflow_cache=CACHE, history_warning_threshold=1)
    iid = sv.start_workflow("wait.receive", {"channels": ["a"] * 3})
    _receive(worker, iid, [0, 1, 2])
    assert sv.wait_workflow(iid, timeout=20).output == [0, 1, 2]
    assert worker.workflow_cache_stats()["hits"] == 3
    warned = [r for r in caplog.records if "history events" in r.getMessage()]
    assert warned and {r.instance_id for r in warned} == {iid}  # type: ignore[attr-defined]


def test_the_cache_events_are_counted_as_metrics(make_worker: Any) -> None:
    from django.conf import settings
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from selvedge_django import metrics

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with override_settings(SELVEDGE={**settings.SELVEDGE, "METRICS": provider}):
        worker = make_worker(workflow_cache=CACHE)
        done = sv.start_workflow("wait.receive", {"channels": ["a"] * 3})
        _receive(worker, done, [0, 1, 2])
        assert sv.wait_workflow(done, timeout=20).output == [0, 1, 2]
        cancelled = sv.start_workflow("wait.receive", {"channels": ["a"]})
        wait_until(lambda: _parked(cancelled, 1))
        sv.cancel_workflow(cancelled)  # the cancel request lets the parked execution go
        assert sv.wait_workflow(cancelled, timeout=20).status == "cancelled"
        kept = sv.start_workflow("wait.receive", {"channels": ["a"]})
        wait_until(lambda: _parked(kept, 1))
        worker.stop(timeout=10)  # lets the parked execution go
    stats = worker.workflow_cache_stats()
    found: dict[tuple[str, tuple[Any, ...]], int] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if not metric.name.startswith("selvedge.workflow_cache."):
                    continue
                for point in metric.data.data_points:
                    key = (metric.name, tuple(sorted(point.attributes.items())))
                    found[key] = point.value
    provider.shutdown()
    reason = "selvedge.reason"
    assert (stats["hits"], stats["parked"], stats["misses"]) == (3, 5, 1)
    assert found == {
        (metrics.WORKFLOW_CACHE_HITS, ()): 3,
        (metrics.WORKFLOW_CACHE_PARKED, ()): 5,
        (metrics.WORKFLOW_CACHE_MISSES, ((reason, "status"),)): 1,
        (metrics.WORKFLOW_CACHE_LET_GO, ((reason, "status"),)): 1,
        (metrics.WORKFLOW_CACHE_LET_GO, ((reason, "stopped"),)): 1,
    }


# -- sticky dispatch ---------------------------------------------------------------------


def test_dispatch_passes_over_another_workers_sticky_instance_until_its_window_ends(
    tdb: None,
) -> None:
    from selvedge_django.conf import get_settings
    from selvedge_django.storage import client_codec, store_for

    settings = get_settings()
    store = store_for(settings.database, client_codec(settings), settings)
    iid = sv.start_workflow("wait.receive", {"channels": ["a"]})
    [fence] = store.instances.acquire_batch("A", 30, 10, None)
    store.release_lease(fence, runnable=True, sticky=30)
    assert store.instances.acquire_batch("B", 30, 10, None) == []
    [again] = store.instances.acquire_batch("A", 30, 10, None)
    assert again.epoch == fence.epoch + 1
    store.release_lease(again, runnable=True, sticky=30)
    WorkflowInstance.objects.filter(instance_id=iid).update(sticky_until_ms=0)  # window over
    [taken] = store.instances.acquire_batch("B", 30, 10, None)
    assert taken.owner == "B"
    store.release_lease(taken, runnable=True)  # no cache: nobody is preferred
    assert WorkflowInstance.objects.get(instance_id=iid).sticky_owner == ""


# -- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cache",
    [
        {"MAX_ENTRIES": -1},
        {"MAX_ENTRIES": True},
        {"MAX_BYTES": 0},
        {"STICKY_WINDOW": 61},
        {"STICKY_WINDOW": "2"},
        {"SIZE": 3},
        [1],
    ],
)
def test_an_invalid_workflow_cache_is_error_e005(cache: Any) -> None:
    from django.core.checks import run_checks

    with override_settings(SELVEDGE={"WORKFLOW_CACHE": cache}):
        messages = [m for m in run_checks(tags=["selvedge"]) if m.id == "selvedge.E005"]
        with pytest.raises(ImproperlyConfigured, match="WORKFLOW_CACHE"):
            sv.conf.get_settings()
    assert messages and all(m.is_serious() and m.hint for m in messages)


# -- both ways ---------------------------------------------------------------------------
_ISO = re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+(\+00:00|Z)?")


def _app_workflows() -> list[str]:
    names = [
        name
        for name in registry.registered_workflow_names()
        if registry.get_workflow(name).fn.__module__.startswith("tests.testapp.")  # type: ignore[union-attr]
    ]
    return sorted(names)


def _normal(text: str | None, iid: str) -> Any:
    if text is None:
        return None
    text = _ISO.sub("T", text.replace(iid, "ID"))
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict) and "type" in value and ("traceback" in value or "message" in value):
        return {"error": value.get("type")}  # an error envelope: its type, not its frames
    return value


def _history(iid: str) -> list[tuple[Any, ...]]:
    rows = HistoryEvent.objects.filter(instance_id=iid).order_by("seq", "key")
    return [
        (
            row.seq,
            row.key.replace(iid, "ID"),
            row.command,
            row.event_type,
            None if row.command in ("now", "sleep") else _normal(row.data, iid),
        )
        for row in rows
    ]


def _quiet(prefix: str) -> bool:
    busy = WorkflowInstance.objects.filter(instance_id__startswith=prefix, status="running")
    return not busy.exclude(lease_owner="", runnable=False).exists()


def _drive(make_worker: Any, mode: str, **overrides: Any) -> tuple[dict[str, Any], Any]:
    worker = make_worker(**FAST, **overrides)
    prefix = "cmp-"
    ids = {name: prefix + name for name in INPUTS}
    for name, value in INPUTS.items():
        sv.start_workflow(name, value, instance_id=ids[name])
    sent: dict[str, int] = dict.fromkeys(ids.values(), 0)
    cancelled: set[str] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # Quiet for a while: every instance closed or parked, nothing runnable.
        wait_until(lambda: _quiet(prefix), timeout=30)
        time.sleep(0.3)  # timers and activity workers get their turn
        if not _quiet(prefix):
            continue
        acted = False
        for name, iid in ids.items():
            row = WorkflowInstance.objects.get(instance_id=iid)
            if row.status != "running":
                continue
            match = re.search(r":receive:(.+)$", row.parked_key)
            if match and sent[iid] < MAX_SIGNALS:
                sent[iid] += 1
                sv.signal(iid, match.group(1), sent[iid])
                acted = True
            elif name in CANCEL and iid not in cancelled:
                cancelled.add(iid)
                sv.cancel_workflow(iid, "compared")
                acted = True
        if not acted:
            break
    result = {}
    for name, iid in ids.items():
        row = WorkflowInstance.objects.get(instance_id=iid)
        result[name] = (row.status, _normal(row.output, iid), _history(iid))
        if name.startswith("inline."):
            # inline.step numbers its bodies with one counter for all instances (RUNS): the
            # numbers follow the order the instances ran in, not what each one recorded.
            result[name] = json.loads(re.sub(r'"([ab]):\d+"', r'"\1:N"', json.dumps(result[name])))
    stats = worker.workflow_cache_stats()
    worker.stop(timeout=10)
    # The next run starts the same ids (and its children the same child ids) afresh.
    for model in (HistoryEvent, ActivityTask, SignalMessage, TimerSubscription, Ledger):
        model.objects.all().delete()
    WorkflowInstance.objects.all().delete()
    return result, stats


def test_every_test_app_workflow_is_compared_or_skipped_for_a_reason() -> None:
    assert set(_app_workflows()) == set(INPUTS) | set(SKIP)


def test_every_test_app_workflow_records_the_same_history_both_ways(make_worker: Any) -> None:
    without, _ = _drive(make_worker, "off", workflow_cache={"MAX_ENTRIES": 0})
    with_cache, stats = _drive(make_worker, "on", workflow_cache=CACHE)
    differ = {
        name: (without[name], with_cache[name])
        for name in INPUTS
        if without[name] != with_cache[name]
    }
    assert not differ, "\n".join(
        f"{name}:\n  without: {a}\n  with:    {b}" for name, (a, b) in differ.items()
    )
    assert stats["hits"] > 20, stats
