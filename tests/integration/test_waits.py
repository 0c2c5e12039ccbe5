"""Waits on the real test database: signals, timers, timed receives, conditions, workflow time.

Most tests drive an unstarted ``Worker`` with ``run_until_idle`` on the
``selvedge_clock`` (a ControllableClock installed as ``SELVEDGE["CLOCK"]``), so
every interleaving is exact and no test waits for a timer: advancing the clock
moves workflow time, timer expiry and the database clock together. The races
that need real threads use a started worker. Crash tests with real worker
processes are in ``test_wait_processes.py``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.engine.codec import Codec
from selvedge_django.models import (
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.storage import set_clock_offset_ms, store_for
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp.models import Ledger

T0 = datetime(2030, 1, 1, tzinfo=UTC)  # where a fresh ControllableClock starts
WEEK = 7 * 24 * 3600


# -- helpers ----------------------------------------------------------------------------


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(seconds: float) -> str:
    return at(seconds).isoformat()


def rows(instance_id: str, command: str | None = None) -> list[HistoryEvent]:
    qs = HistoryEvent.objects.filter(instance_id=instance_id)
    if command is not None:
        qs = qs.filter(command=command)
    return list(qs.order_by("id"))


def history_state(instance_id: str) -> list[tuple[Any, ...]]:
    """Everything a late arrival could change in an instance's history."""
    return [
        (r.key, r.seq, r.command, r.event_type, r.data, r.reservation, r.delivered_seq)
        for r in rows(instance_id)
    ]


def inst(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def parked(instance_id: str) -> bool:
    """Dispatched at least once, running, unleased and not runnable: waiting for input."""
    i = inst(instance_id)
    return i.status == "running" and i.lease_owner == "" and not i.runnable and i.lease_epoch > 0


def timers(instance_id: str) -> list[TimerSubscription]:
    return list(TimerSubscription.objects.filter(instance_id=instance_id))


def signals(instance_id: str) -> list[SignalMessage]:
    return list(SignalMessage.objects.filter(instance_id=instance_id).order_by("id"))


def result_of(instance_id: str) -> sv.WorkflowResult:
    result = sv.get_workflow_result(instance_id)
    assert result.status != "running", "the workflow is still running"
    return result


def output_of(instance_id: str) -> Any:
    result = result_of(instance_id)
    assert result.status == "completed", result.error
    return result.output


def complete_manual(instance_id: str, value: Any) -> None:
    """Complete the instance's ``wait.manual`` task as another worker would (an arrival)."""
    store = store_for("default", Codec())
    (row,) = [r for r in rows(instance_id, "activity") if "wait.manual" in (r.reservation or "")]
    claimed = store.claim_task(instance_id, row.key, "another-worker")
    assert claimed is not None
    assert store.tasks.complete_task(claimed.claim, json.dumps(value))


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def stepper(clock: ControllableClock) -> Worker:
    """An unstarted Worker on the controllable clock; it never serves queue "manual"."""
    return Worker(activity_queues=[""])


def run(worker: Worker) -> int:
    return run_until_idle(worker)


@pytest.fixture
def scratch_workflow() -> Iterator[Callable[[str, Callable[..., Any]], None]]:
    """(Re)define a throwaway workflow under a name; it is unregistered afterwards."""
    names: set[str] = set()

    def define(name: str, fn: Callable[..., Any]) -> None:
        registry.unregister(name, kind="workflow")
        sv.workflow(name=name)(fn)
        names.add(name)

    yield define
    for name in names:
        registry.unregister(name, kind="workflow")


# -- 1. signals -------------------------------------------------------------------------


def test_a_signal_wakes_a_parked_receive_and_replay_returns_the_recorded_payload(
    worker: Any,
) -> None:
    instance_id = sv.start_workflow("wait.receive", {"channels": ["c", "c"]})
    wait_until(lambda: parked(instance_id))
    assert rows(instance_id) == []  # an empty inbox suspends without writing

    sv.signal(instance_id, "c", {"n": 1})
    wait_until(lambda: len(rows(instance_id, "receive")) == 1 and parked(instance_id))
    sv.signal(instance_id, "c", [2])
    result = sv.wait_workflow(instance_id, timeout=20)

    # The execution that received [2] replayed the first receive: the signal was
    # already consumed, so {"n": 1} can only have come from the recorded payload.
    assert result.status == "completed", result.error
    assert result.output == [{"n": 1}, [2]]
    received = rows(instance_id, "receive")
    assert [(r.seq, r.event_type, json.loads(r.data or "")) for r in received] == [
        (1, "SignalReceived", {"n": 1}),
        (2, "SignalReceived", [2]),
    ]
    assert [(s.consumed_seq, s.consumed_key) for s in signals(instance_id)] == [
        (1, received[0].key),
        (2, received[1].key),
    ]
    assert inst(instance_id).lease_epoch >= 3
    sv.replay_instance(instance_id)


def test_each_channel_keeps_its_own_order_and_signals_are_accepted_from_creation(
    stepper: Worker,
) -> None:
    instance_id = sv.start_workflow("wait.receive", {"channels": ["b", "a", "a", "b"]})
    for channel, payload in [("a", "a1"), ("b", "b1"), ("a", "a2"), ("b", "b2")]:
        sv.signal(instance_id, channel, payload)
    run(stepper)

    assert output_of(instance_id) == ["b1", "a1", "a2", "b2"]
    assert inst(instance_id).lease_epoch == 1  # all four were there for the first execution
    by_payload = {json.loads(s.payload): s.consumed_seq for s in signals(instance_id)}
    assert by_payload == {"b1": 1, "a1": 2, "a2": 3, "b2": 4}


def test_a_signal_commits_or_rolls_back_with_the_callers_transaction(stepper: Worker) -> None:
    instance_id = sv.start_workflow("wait.receive", {"channels": ["c"]})
    run(stepper)
    assert parked(instance_id)

    with pytest.raises(RuntimeError, match="caller failed"), transaction.atomic():
        sv.signal(instance_id, "c", "rolled back")
        assert len(signals(instance_id)) == 1
        raise RuntimeError("caller failed")
    assert signals(instance_id) == []
    assert parked(instance_id)
    assert run(stepper) == 0

    with transaction.atomic():
        sv.signal(instance_id, "c", "committed")
    assert inst(instance_id).runnable
    run(stepper)
    assert output_of(instance_id) == ["committed"]


@pytest.mark.parametrize(
    "channel",
    ["", "x" * 256, "é" * 128, 5, None, b"c"],
    ids=["empty", "256-ascii", "256-bytes-128-chars", "int", "none", "bytes"],
)
def test_bad_channels_are_rejected_before_anything_is_written(
    stepper: Worker, channel: Any
) -> None:
    instance_id = sv.start_workflow("wait.receive", {"channels": ["c"]})
    run(stepper)

    with pytest.raises(sv.InvalidSignalChannel):
        sv.signal(instance_id, channel, "payload")
    with pytest.raises(sv.InvalidSignalChannel):
        sv.signal("no-such-instance", channel, "payload")
    assert signals(instance_id) == []
    assert parked(instance_id)


@pytest.mark.parametrize(
    "payload",
    [object(), {1, 2}, math.nan, {"k": math.inf}, b"bytes"],
    ids=["object", "set", "nan", "inf", "bytes"],
)
def test_unencodable_payloads_are_rejected_before_anything_is_written(
    stepper: Worker, payload: Any
) -> None:
    instance_id = sv.start_workflow("wait.receive", {"channels": ["c"]})
    run(stepper)

    with pytest.raises(sv.InvalidSignalPayload) as info:
        sv.signal(instance_id, "c", payload)
    assert isinstance(info.value, sv.SelvedgeError)
    assert signals(instance_id) == []
    assert parked(instance_id)


def test_channels_are_one_to_255_utf8_bytes_and_pass_through_unchanged(stepper: Worker) -> None:
    longest = "é" * 127 + "a"  # 255 bytes
    odd = " Ünï cødé / ✓ "
    instance_id = sv.start_workflow("wait.receive", {"channels": [longest, "x", odd]})
    sv.signal(instance_id, odd, 3)
    sv.signal(instance_id, "x", 2)
    sv.signal(instance_id, longest, None)
    run(stepper)

    assert output_of(instance_id) == [None, 2, 3]
    assert {s.channel for s in signals(instance_id)} == {longest, "x", odd}


def test_signals_to_unknown_or_closed_instances_raise_and_write_nothing(
    stepper: Worker,
) -> None:
    with pytest.raises(sv.WorkflowNotFound) as missing:
        sv.signal("no-such-instance", "c", 1)
    assert isinstance(missing.value, LookupError)

    completed = sv.start_workflow("wait.receive", {"channels": []})
    failed = sv.start_workflow("wait.bad_predicate", "none")
    cancelled = sv.start_workflow("wait.receive", {"channels": ["c"]})
    run(stepper)
    sv.cancel_workflow(cancelled, "no longer needed")
    run(stepper)

    for instance_id, error_class, status in [
        (completed, sv.WorkflowAlreadyCompleted, "completed"),
        (failed, sv.WorkflowAlreadyFailed, "failed"),
        (cancelled, sv.WorkflowAlreadyCancelled, "cancelled"),
    ]:
        assert inst(instance_id).status == status
        with pytest.raises(error_class) as info:
            sv.signal(instance_id, "c", "too late")
        assert isinstance(info.value, sv.InstanceClosed)
        assert (info.value.instance_id, info.value.status) == (instance_id, status)
        assert signals(instance_id) == []
        assert not inst(instance_id).runnable


def test_receive_async_and_pending_read_the_delivered_view(stepper: Worker) -> None:
    instance_id = sv.start_workflow("wait.inbox", None)
    sv.signal(instance_id, "c", "c1")
    run(stepper)  # c1 arrived but was never delivered: receive_async finds nothing
    assert parked(instance_id)  # waiting for "go"
    (none_row,) = rows(instance_id, "receive")
    assert (none_row.seq, none_row.event_type) == (1, "SignalNone")
    assert [(s.delivered_seq, s.consumed_seq) for s in signals(instance_id)] == [(None, None)]

    sv.signal(instance_id, "c", "c2")
    sv.signal(instance_id, "go", 1)
    run(stepper)  # the receive of "go" delivers c1 and c2; waiting for the second "go"
    assert parked(instance_id)
    # A signal that arrives now must not change what the earlier positions saw.
    sv.signal(instance_id, "c", "c3")
    sv.signal(instance_id, "go", 2)
    run(stepper)

    assert output_of(instance_id) == {
        "async_empty": [None, False],
        "pending_before": 0,
        "go": 1,
        "pending_after_go": 2,
        "async": ["c1", True],
        "pending_after_async": 1,
        "pending_end": 2,
    }
    go_rows = [r for r in rows(instance_id, "receive") if r.key.endswith(":go")]
    first_go, second_go = (r.seq for r in go_rows)
    by_payload = {
        json.loads(s.payload): (s.delivered_seq, s.consumed_seq)
        for s in signals(instance_id)
        if s.channel == "c"
    }
    assert by_payload["c1"] == (first_go, first_go + 1)  # consumed by receive_async
    assert by_payload["c2"] == (first_go, None)
    assert by_payload["c3"] == (second_go, None)
    sv.replay_instance(instance_id)


def test_receive_async_and_pending_ignore_cancellation_and_receive_observes_it_first(
    stepper: Worker,
) -> None:
    instance_id = sv.start_workflow("wait.inbox", None)
    sv.signal(instance_id, "go", "pending but second to cancellation")
    sv.cancel_workflow(instance_id, "before the first dispatch")
    run(stepper)

    result = result_of(instance_id)
    assert result.status == "cancelled"
    assert isinstance(result.error, sv.WorkflowCancelled)
    assert [(r.seq, r.event_type) for r in rows(instance_id, "receive")] == [
        (1, "SignalNone"),  # receive_async went ahead
        (2, "SignalCancelled"),  # receive saw the request before the pending signal
    ]
    assert [s.consumed_seq for s in signals(instance_id)] == [None]


# -- 2. timers --------------------------------------------------------------------------


def test_a_week_long_sleep_is_tested_in_milliseconds(
    stepper: Worker, clock: ControllableClock
) -> None:
    started = time.monotonic()
    instance_id = sv.start_workflow("wait.sleep", {"seconds": WEEK})
    run(stepper)

    assert parked(instance_id)
    (timer,) = timers(instance_id)
    (sleep_row,) = rows(instance_id, "sleep")
    assert timer.expires_at == at(WEEK)
    assert json.loads(sleep_row.reservation or "") == {"expires_at": iso(WEEK)}
    assert sleep_row.data is None

    clock.advance(timedelta(seconds=WEEK - 1))
    assert run(stepper) == 0  # not due yet: nothing fires, nothing runs
    assert parked(instance_id)

    clock.advance(1)
    run(stepper)
    assert output_of(instance_id) == {"before": iso(0), "after": iso(WEEK), "fired_at": None}
    sleep_row.refresh_from_db()
    assert (sleep_row.event_type, json.loads(sleep_row.data or "")) == ("TimerExpired", iso(WEEK))
    assert timers(instance_id) == []
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("form", ["sleep", "timedelta", "until", "timer"])
def test_every_timer_form_records_its_expiry_at_reservation_and_fires_on_the_clock(
    stepper: Worker, clock: ControllableClock, form: str
) -> None:
    clock.advance(10)
    instance_id = sv.start_workflow("wait.sleep", {"seconds": 90, "form": form})
    run(stepper)

    (sleep_row,) = rows(instance_id, "sleep")
    assert (sleep_row.key, sleep_row.seq) == ("#2:sleep", 2)
    assert json.loads(sleep_row.reservation or "") == {"expires_at": iso(100)}
    assert [t.expires_at for t in timers(instance_id)] == [at(100)]

    # The timer fires 90 s after its arming on the database clock, which the testing
    # clock moves (real time moves it too: a margin for the milliseconds that passed).
    clock.advance(89)
    assert run(stepper) == 0
    clock.advance(1)
    run(stepper)

    assert output_of(instance_id) == {
        "before": iso(10),
        "after": iso(100),
        "fired_at": iso(100) if form == "timer" else None,
    }


def test_timer_handle_key_readiness_and_get_keep_the_first_expiry_on_replay(
    stepper: Worker, clock: ControllableClock
) -> None:
    instance_id = sv.start_workflow("wait.timer_handle", {"seconds": 60, "poke": True})
    run(stepper)
    (armed,) = timers(instance_id)
    reserved = history_state(instance_id)

    # A signal halfway makes the instance replay past new_timer with a later clock.
    clock.advance(30)
    sv.signal(instance_id, "poke", None)
    run(stepper)
    assert parked(instance_id)
    (still_armed,) = timers(instance_id)
    assert (still_armed.id, still_armed.expires_at) == (armed.id, at(60))
    assert history_state(instance_id)[0] == reserved[0]  # the sleep row did not change

    clock.advance(30)
    run(stepper)
    assert output_of(instance_id) == {
        "key": "#1:sleep",
        "ready_before": False,
        "fired_at": iso(60),
        "utc": True,
        "ready_after": True,
        "get_again_equal": True,
    }
    assert inst(instance_id).lease_epoch == 3
    sv.replay_instance(instance_id)


def _nap_with_sleep(ctx: sv.WorkflowContext, _: Any) -> str:
    ctx.sleep(60)
    return ctx.now().isoformat()


def _nap_with_timer(ctx: sv.WorkflowContext, _: Any) -> str:
    ctx.new_timer(60).get(ctx)
    return ctx.now().isoformat()


@pytest.mark.parametrize(
    ("before", "after"),
    [(_nap_with_sleep, _nap_with_timer), (_nap_with_timer, _nap_with_sleep)],
    ids=["sleep-then-timer-code", "timer-then-sleep-code"],
)
def test_sleep_and_new_timer_get_share_one_command_across_a_deploy(
    stepper: Worker,
    clock: ControllableClock,
    scratch_workflow: Callable[[str, Callable[..., Any]], None],
    before: Callable[..., Any],
    after: Callable[..., Any],
) -> None:
    scratch_workflow("wait.scratch.nap", before)
    instance_id = sv.start_workflow("wait.scratch.nap", None)
    run(stepper)
    assert [(r.key, r.command) for r in rows(instance_id)] == [("#1:sleep", "sleep")]

    scratch_workflow("wait.scratch.nap", after)  # the other form replays the same history
    clock.advance(60)
    run(stepper)

    assert output_of(instance_id) == iso(60)
    assert [(r.key, r.command) for r in rows(instance_id)] == [
        ("#1:sleep", "sleep"),
        ("#2:now", "now"),
        ("$close", "close"),
    ]


@pytest.mark.parametrize(
    ("form", "seconds"),
    [("sleep", 0), ("sleep", -5), ("timedelta", -0.001), ("until", -3600), ("timer", 0)],
)
def test_nonpositive_durations_expire_at_once_without_a_timer(
    stepper: Worker, clock: ControllableClock, form: str, seconds: float
) -> None:
    clock.advance(7)
    instance_id = sv.start_workflow("wait.sleep", {"seconds": seconds, "form": form})
    run(stepper)

    assert output_of(instance_id) == {
        "before": iso(7),
        "after": iso(7),
        "fired_at": iso(7) if form == "timer" else None,
    }
    (sleep_row,) = rows(instance_id, "sleep")
    assert (sleep_row.event_type, json.loads(sleep_row.data or "")) == ("TimerExpired", iso(7))
    assert sleep_row.delivered_seq == sleep_row.seq
    assert inst(instance_id).lease_epoch == 1  # never suspended
    assert TimerSubscription.objects.count() == 0


@pytest.mark.parametrize(
    ("kind", "error_type", "message"),
    [
        ("nan", "ValueError", "finite"),
        ("inf_timeout", "ValueError", "finite"),
        ("string", "TypeError", "seconds or a timedelta"),
        ("bool", "TypeError", "seconds or a timedelta"),
        ("none", "TypeError", "seconds or a timedelta"),
        ("naive_until", "ValueError", "aware"),
        ("until_not_datetime", "TypeError", "datetime"),
    ],
)
def test_nonsensical_durations_fail_the_run_with_a_clear_error(
    stepper: Worker, kind: str, error_type: str, message: str
) -> None:
    instance_id = sv.start_workflow("wait.bad_duration", kind)
    run(stepper)

    result = result_of(instance_id)
    assert result.status == "failed"
    assert isinstance(result.error, sv.ApplicationError)
    assert result.error.type == error_type
    assert message in result.error.message
    assert [r.command for r in rows(instance_id)] == ["close"]
    assert TimerSubscription.objects.count() == 0


def test_the_timer_poller_fires_due_timers_in_bounded_batches(clock: ControllableClock) -> None:
    worker = Worker(activity_queues=[""], max_timers_per_batch=2)
    ids = [sv.start_workflow("wait.sleep", {"seconds": 10 + i}) for i in range(5)]
    run(worker)
    assert all(parked(i) for i in ids)
    assert TimerSubscription.objects.count() == 5

    clock.advance(14)
    assert [worker.timer_poller.run_once() for _ in range(4)] == [2, 2, 1, 0]
    assert TimerSubscription.objects.count() == 0
    # Oldest expiry first; each fire is an arrival that makes its instance runnable.
    for n, instance_id in enumerate(ids):
        (sleep_row,) = rows(instance_id, "sleep")
        assert json.loads(sleep_row.data or "") == iso(10 + n)
        assert sleep_row.delivered_seq is None
        assert inst(instance_id).runnable
    run(worker)
    assert [output_of(i)["after"] for i in ids] == [iso(14)] * 5


def test_the_timer_poller_waits_for_the_next_expiry_or_its_check_interval(
    clock: ControllableClock,
) -> None:
    worker = Worker(activity_queues=[""], timer_check_interval=30)
    poller = worker.timer_poller
    assert poller.interval == 30
    assert poller.next_delay(30) == 30  # nothing armed

    started = time.monotonic()
    sv.start_workflow("wait.sleep", {"seconds": 20})
    sv.start_workflow("wait.sleep", {"seconds": 3600})
    run(worker)
    # Measured on the database clock, which also moves in real time: the delay is
    # short of 20 s by at most the real time this test has taken so far.
    delay = poller.next_delay(30)
    elapsed = time.monotonic() - started
    assert 20 - elapsed - 0.01 <= delay <= 20.01
    clock.advance(10)  # half-way: real time would have to pass 10 s to make it due
    assert poller.run_once() == 0  # not due yet: the round reads the next fire time
    delay = poller.next_delay(30)
    elapsed = time.monotonic() - started
    assert 10 - elapsed - 0.01 <= delay <= 10.01
    clock.advance(10)
    assert poller.run_once() == 1
    assert poller.next_delay(30) == 30  # the next one is an hour away


def test_a_fire_for_a_closed_instance_is_discarded_without_history_or_wake(
    stepper: Worker,
) -> None:
    instance_id = sv.start_workflow("wait.receive_timeout", {"timeout": 30})
    run(stepper)
    sv.cancel_workflow(instance_id, "closing")
    run(stepper)
    assert inst(instance_id).status == "cancelled"
    (receive_row,) = rows(instance_id, "receive")
    before = (history_state(instance_id), inst(instance_id).updated_at)
    # Subscriptions that outlived their instance's close (as if a fire raced the close):
    # one for the timed receive, one for a sleep.
    for key in (receive_row.key, "#9:sleep"):
        TimerSubscription.objects.create(
            instance_id=instance_id, key=key, expires_at=at(0), fire_at_ms=0
        )

    assert stepper.timer_poller.run_once() == 2
    assert timers(instance_id) == []
    assert (history_state(instance_id), inst(instance_id).updated_at) == before
    assert not inst(instance_id).runnable
    assert inst(instance_id).status == "cancelled"


def test_a_cancelled_instances_armed_timer_never_wakes_it(
    stepper: Worker, clock: ControllableClock
) -> None:
    instance_id = sv.start_workflow("wait.sleep", {"seconds": 60})
    run(stepper)
    assert len(timers(instance_id)) == 1

    sv.cancel_workflow(instance_id, "stop")
    run(stepper)
    result = result_of(instance_id)
    assert result.status == "cancelled"
    assert isinstance(result.error, sv.WorkflowCancelled)
    (sleep_row,) = rows(instance_id, "sleep")
    assert sleep_row.event_type == "TimerCancelled"
    assert timers(instance_id) == []  # retired by the cancellation's own transaction
    closed = (history_state(instance_id), inst(instance_id).updated_at)

    clock.advance(3600)
    assert run(stepper) == 0
    assert (history_state(instance_id), inst(instance_id).updated_at) == closed
    assert not inst(instance_id).runnable


# -- 3. receive_with_timeout ------------------------------------------------------------


def test_receive_with_timeout_raises_receive_timeout_when_the_timer_fires(
    stepper: Worker, clock: ControllableClock
) -> None:
    instance_id = sv.start_workflow("wait.receive_timeout", {"timeout": 30})
    run(stepper)
    (receive_row,) = rows(instance_id, "receive")
    assert json.loads(receive_row.reservation or "") == {"expires_at": iso(30)}
    assert receive_row.data is None
    assert [t.expires_at for t in timers(instance_id)] == [at(30)]

    clock.advance(29)  # a margin for the real time that moved the database clock too
    assert run(stepper) == 0
    clock.advance(1)
    run(stepper)

    assert output_of(instance_id) == {"timeout": True}  # ReceiveTimeout is a TimeoutError
    receive_row.refresh_from_db()
    assert receive_row.event_type == "SignalTimeout"
    assert timers(instance_id) == []


def test_a_signal_before_the_timeout_retires_the_timer_in_its_observation(
    stepper: Worker, clock: ControllableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stepper.runtime.store
    original = store.observe
    around: list[tuple[int, int]] = []

    def observe(fence: Any, observation: Any) -> Any:
        count = TimerSubscription.objects.filter(instance_id=fence.instance_id).count
        before = count()
        result = original(fence, observation)
        around.append((before, count()))
        return result

    monkeypatch.setattr(store, "observe", observe)
    instance_id = sv.start_workflow("wait.receive_timeout", {"timeout": 30})
    run(stepper)
    clock.advance(10)
    sv.signal(instance_id, "c", "in time")
    run(stepper)

    assert output_of(instance_id) == {"signal": "in time"}
    assert around == [(1, 0)]  # one transaction consumed the signal and deleted the timer
    (receive_row,) = rows(instance_id, "receive")
    assert (receive_row.event_type, json.loads(receive_row.data or "")) == (
        "SignalReceived",
        "in time",
    )
    closed = (history_state(instance_id), inst(instance_id).updated_at)

    # The old expiry passes: nothing fires, nothing wakes, nothing changes.
    clock.advance(60)
    assert run(stepper) == 0
    assert (history_state(instance_id), inst(instance_id).updated_at) == closed


def test_when_signal_and_timer_both_arrived_before_dispatch_the_signal_wins(
    stepper: Worker, clock: ControllableClock
) -> None:
    instance_id = sv.start_workflow("wait.receive_timeout", {"timeout": 30})
    run(stepper)
    clock.advance(30)
    assert stepper.timer_poller.run_once() == 1
    (fired,) = timers(instance_id)
    assert fired.fired  # the fire arrived (the instance is runnable) but is not observed yet
    assert inst(instance_id).runnable
    sv.signal(instance_id, "c", "second to arrive")

    run(stepper)

    assert output_of(instance_id) == {"signal": "second to arrive"}
    assert timers(instance_id) == []
    (signal,) = signals(instance_id)
    (receive_row,) = rows(instance_id, "receive")
    assert (signal.consumed_seq, signal.consumed_key) == (receive_row.seq, receive_row.key)
    assert receive_row.event_type == "SignalReceived"
    sv.replay_instance(instance_id)


def test_cancellation_wins_over_a_pending_signal_and_a_fired_timer(
    stepper: Worker, clock: ControllableClock
) -> None:
    instance_id = sv.start_workflow("wait.receive_timeout", {"timeout": 30})
    run(stepper)
    sv.signal(instance_id, "c", "not consumed")
    clock.advance(30)
    assert stepper.timer_poller.run_once() == 1
    sv.cancel_workflow(instance_id, "changed my mind")

    run(stepper)

    result = result_of(instance_id)
    assert result.status == "cancelled"
    assert isinstance(result.error, sv.WorkflowCancelled)
    assert result.error.reason == "changed my mind"
    (receive_row,) = rows(instance_id, "receive")
    assert receive_row.event_type == "SignalCancelled"
    assert [s.consumed_seq for s in signals(instance_id)] == [None]
    assert timers(instance_id) == []


@pytest.mark.parametrize("timeout", [0, -1.5, timedelta(seconds=-1)], ids=str)
def test_a_nonpositive_timeout_records_an_immediate_timeout_and_consumes_nothing(
    stepper: Worker, timeout: Any
) -> None:
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    instance_id = sv.start_workflow("wait.receive_timeout", {"timeout": seconds, "then": "c"})
    sv.signal(instance_id, "c", "still there")
    run(stepper)

    assert output_of(instance_id) == {"timeout": True, "then": "still there"}
    timed_out, received = rows(instance_id, "receive")
    assert (timed_out.seq, timed_out.event_type, timed_out.reservation) == (
        1,
        "SignalTimeout",
        None,
    )
    assert (received.seq, received.event_type) == (2, "SignalReceived")
    assert [s.consumed_seq for s in signals(instance_id)] == [2]
    assert TimerSubscription.objects.count() == 0
    assert inst(instance_id).lease_epoch == 1


# -- 4. arrival versus delivery ---------------------------------------------------------


def test_wait_condition_delivers_exactly_the_arrivals_its_predicate_saw(
    stepper: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance_id = sv.start_workflow("wait.condition", None)
    store = stepper.runtime.store
    original = store.observe

    def observe(fence: Any, observation: Any) -> Any:
        if observation.record is not None and observation.record.command == "await":
            # The predicate was true on the first activity alone; the second activity's
            # result arrives before the await's delivery batch commits.
            complete_manual(instance_id, "manual")
        return original(fence, observation)

    monkeypatch.setattr(store, "observe", observe)
    run(stepper)
    assert parked(instance_id)  # waiting for "go"

    first, second = rows(instance_id, "activity")
    (await_row,) = rows(instance_id, "await")
    assert first.delivered_seq == await_row.seq
    assert json.loads(second.data or "") == "manual"  # arrived ...
    assert second.delivered_seq is None  # ... but not delivered by that batch

    sv.signal(instance_id, "go", None)
    run(stepper)

    assert output_of(instance_id) == {
        "first": True,
        "second": False,
        "second_after_receive": True,
        "values": [3, "manual"],
    }
    second.refresh_from_db()
    (receive_row,) = rows(instance_id, "receive")
    assert second.delivered_seq == receive_row.seq
    sv.replay_instance(instance_id)


def test_get_never_delivers_a_batch_and_replay_keeps_earlier_readiness(
    stepper: Worker, clock: ControllableClock
) -> None:
    instance_id = sv.start_workflow("wait.get_no_batch", {"seconds": 5})
    run(stepper)
    assert parked(instance_id)  # in Timer.get
    complete_manual(instance_id, "m")  # the activity result arrives first ...
    clock.advance(5)  # ... then the timer fires

    run(stepper)

    assert output_of(instance_id) == {
        "manual_after_get": False,
        "timer": True,
        "manual_after_condition": True,
        "value": "m",
    }
    manual, sleep_row, await_row = (rows(instance_id, c)[0] for c in ("activity", "sleep", "await"))
    assert manual.delivered_seq == await_row.seq
    assert sleep_row.delivered_seq == await_row.seq
    sv.replay_instance(instance_id)


@pytest.mark.parametrize(
    ("mode", "error_class", "error_type"),
    [
        ("none", sv.ApplicationError, "TypeError"),
        ("command", sv.NondeterminismError, None),
        ("raise", sv.ApplicationError, "LookupError"),
        ("pending", sv.ApplicationError, "selvedge_django.exceptions.InvalidSignalChannel"),
    ],
)
def test_bad_predicates_fail_the_run_even_when_the_error_is_caught(
    stepper: Worker, mode: str, error_class: type[BaseException], error_type: str | None
) -> None:
    instance_id = sv.start_workflow("wait.bad_predicate", mode)
    run(stepper)

    result = result_of(instance_id)
    assert result.status == "failed"
    assert isinstance(result.error, error_class), result.error
    if error_type is not None:
        assert isinstance(result.error, sv.ApplicationError)
        assert result.error.type == error_type
    assert [r.command for r in rows(instance_id)] == ["close"]


# -- 5. workflow time -------------------------------------------------------------------


def test_now_records_one_observation_per_live_call_on_the_configured_clock(
    stepper: Worker, clock: ControllableClock
) -> None:
    clock.advance(5)
    instance_id = sv.start_workflow("wait.time", {"seconds": 10})
    run(stepper)
    clock.advance(10)
    run(stepper)
    clock.advance(10)
    run(stepper)

    values = output_of(instance_id)
    assert values == [iso(5), iso(5), iso(15), iso(25)]
    assert all(datetime.fromisoformat(v).utcoffset() == timedelta(0) for v in values)
    now_rows = rows(instance_id, "now")
    assert [(r.seq, r.event_type, json.loads(r.data or "")) for r in now_rows] == [
        (1, "NowRecorded", iso(5)),
        (2, "NowRecorded", iso(5)),
        (4, "NowRecorded", iso(15)),
    ]
    assert inst(instance_id).lease_epoch == 3  # two replays wrote no further observations


class SettableClock:
    """A workflow clock a test can move in either direction."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def test_workflow_time_never_goes_below_earlier_values_or_observed_timer_expiries(
    tdb: None,
) -> None:
    wall = SettableClock(at(100))
    worker = Worker(activity_queues=[""], clock=wall)
    worker.resumptions.inline = True
    instance_id = sv.start_workflow("wait.time", {"seconds": 10})
    assert worker.dispatcher.run_once() == 1  # now() twice at +100, then sleeps until +110
    assert [t.expires_at for t in timers(instance_id)] == [at(110)]

    try:
        # Timers fire by the database clock, 10 s after their arming there.
        set_clock_offset_ms(11_000)
        wall.now = at(200)
        assert worker.timer_poller.run_once() == 1
        wall.now = at(0)  # the clock steps back before the next execution
        assert worker.dispatcher.run_once() == 1
        # now() after the sleep returned the observed expiry, and the next timer's base
        # is it.
        (now_row,) = [r for r in rows(instance_id, "now") if r.seq == 4]
        assert json.loads(now_row.data or "") == iso(110)
        assert [t.expires_at for t in timers(instance_id)] == [at(120)]

        set_clock_offset_ms(22_000)
        wall.now = at(300)
        assert worker.timer_poller.run_once() == 1
        wall.now = at(0)
        assert worker.dispatcher.run_once() == 1
        assert output_of(instance_id) == [iso(100), iso(100), iso(110), iso(120)]
    finally:
        set_clock_offset_ms(0)


UNWOUND: list[str] = []


@sv.workflow(name="wait.time.unwinding")
def now_while_unwinding(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Ask for the time in a ``finally`` block that runs while the execution suspends."""
    try:
        return ctx.receive("go")
    finally:
        try:
            UNWOUND.append(ctx.now().isoformat())
        except BaseException as error:  # the suspension, raised again
            what = "an Exception" if isinstance(error, Exception) else "the suspension"
            UNWOUND.append(f"rejected with {what}")
            raise


def test_now_while_the_execution_unwinds_is_rejected_without_a_write(
    stepper: Worker, clock: ControllableClock
) -> None:
    UNWOUND.clear()
    instance_id = sv.start_workflow(now_while_unwinding)
    run(stepper)
    assert inst(instance_id).status == "running"
    assert UNWOUND[:] == ["rejected with the suspension"]
    assert rows(instance_id, "now") == []  # nothing recorded while unwinding
    sv.signal(instance_id, "go", "went")
    run(stepper)
    # The resumed run returns normally, so its finally block records the time.
    assert output_of(instance_id) == "went"
    assert UNWOUND[1:] == [iso(0)]
    assert [r.seq for r in rows(instance_id, "now")] == [2]
    sv.replay_instance(instance_id)


# -- races ------------------------------------------------------------------------------


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """A file that wait.hold waits on; removed after the test whatever happens."""
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def test_a_signal_sent_while_an_execution_holds_the_lease_is_received_by_its_next_receive(
    worker: Any, marker: Path
) -> None:
    instance_id = sv.start_workflow(
        "wait.receive_around_hold", {"entry": "leased", "hold_while": str(marker)}
    )
    wait_until(lambda: Ledger.objects.filter(entry="started:leased").exists())
    assert inst(instance_id).lease_owner == worker.worker_id

    sv.signal(instance_id, "during", "sent under the lease")
    (pending,) = signals(instance_id)
    assert pending.consumed_seq is None
    marker.unlink()
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == ["leased", "sent under the lease"]
    assert inst(instance_id).lease_epoch == 1  # the same execution received it


def test_a_signal_arriving_while_an_execution_suspends_keeps_the_instance_runnable(
    stepper: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance_id = sv.start_workflow("wait.receive", {"channels": ["c"]})
    store = stepper.runtime.store
    original = store.release_lease
    sent: list[str] = []

    def release_lease(fence: Any, *args: Any, **kwargs: Any) -> Any:
        if not sent:  # the receive found the inbox empty; the signal beats the release
            sent.append(sv.signal(instance_id, "c", "just in time") or "sent")
        return original(fence, *args, **kwargs)

    monkeypatch.setattr(store, "release_lease", release_lease)
    run(stepper)

    assert sent
    assert output_of(instance_id) == ["just in time"]
    assert inst(instance_id).lease_epoch == 2


# -- 6. testing without waiting ---------------------------------------------------------


def test_the_controllable_clock_drives_activity_deadlines_too(
    stepper: Worker, clock: ControllableClock
) -> None:
    instance_id = sv.start_workflow("wait.deadline", None)
    run(stepper)  # the task waits on a queue nobody serves, for at most an hour
    assert parked(instance_id)

    clock.advance(3599)
    assert run(stepper) == 0
    assert [t.status for t in sv.list_activity_tasks(instance_id)] == ["queued"]

    clock.advance(2)
    run(stepper)
    assert output_of(instance_id) == {"timeout": "schedule_to_start"}
    assert [t.status for t in sv.list_activity_tasks(instance_id)] == ["failed"]


def test_the_pytest_plugin_provides_the_clock_and_a_started_worker(
    selvedge_worker: Worker,
) -> None:
    assert selvedge_worker.started
    instance_id = sv.start_workflow("wait.receive", {"channels": ["c"]})
    sv.signal(instance_id, "c", "via the plugin's worker")
    assert sv.wait_workflow(instance_id, timeout=20).output == ["via the plugin's worker"]
