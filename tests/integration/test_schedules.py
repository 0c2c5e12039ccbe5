"""Schedules on the real database: runs, ids, pause, trigger, backfill, overlap, DST, settings.

The leader's duty runs in the test's thread (an unstarted Worker's
``leader.schedules.run_once()``, as ``run_until_idle`` does); the database clock
is moved with the testing clock, so a slot a week away comes due at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.models import Schedule, WorkflowInstance
from selvedge_django.schedules import schedule_store
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker

MINUTE = timedelta(minutes=1)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def db_now() -> datetime:
    return datetime.fromtimestamp(schedule_store().now_ms() / 1000, UTC)


class Leader:
    """Drives one worker's leader duties and executions in the test's thread."""

    def __init__(self, clock: ControllableClock) -> None:
        self.clock = clock
        self.worker = Worker()

    def move_to(self, moment: datetime) -> None:
        """Move the database clock to ``moment`` (forward only)."""
        delta = moment - db_now()
        if delta > timedelta(0):
            self.clock.advance(delta)

    def fire(self) -> int:
        """Run the schedule duty until it has nothing left to do."""
        total = 0
        while done := self.worker.leader.schedules.run_once():
            total += done
        return total

    def at(self, moment: datetime) -> int:
        self.move_to(moment)
        return self.fire()

    def run(self) -> None:
        run_until_idle(self.worker)


@pytest.fixture
def leader(tdb: None, selvedge_clock: ControllableClock) -> Leader:
    return Leader(selvedge_clock)


def next_minute() -> datetime:
    now = db_now()
    return now.replace(second=0, microsecond=0) + MINUTE


def runs(name: str) -> list[str]:
    return list(
        WorkflowInstance.objects.filter(instance_id__startswith=f"{name}@")
        .order_by("instance_id")
        .values_list("instance_id", flat=True)
    )


def status(instance_id: str) -> str:
    return WorkflowInstance.objects.get(instance_id=instance_id).status


# -- creating and describing -----------------------------------------------------------------


def test_create_describe_list_and_delete(leader: Leader) -> None:
    start = next_minute()
    created = sv.create_schedule(
        "every-minute",
        "sched.echo",
        interval=60,
        input={"n": 1},
        start_at=start,
        catchup_window=timedelta(minutes=5),
    )
    assert created.next_run_at == start and created.last_run_at is None
    described = sv.describe_schedule("every-minute")
    assert described.workflow_name == "sched.echo"
    assert described.interval == MINUTE and described.cron is None
    assert described.timezone == "UTC" and described.overlap == "skip"
    assert described.catchup_window == timedelta(minutes=5)
    assert described.recent_instance_ids == [] and described.input == {"n": 1}
    assert [s.name for s in sv.list_schedules()] == ["every-minute"]
    assert described.to_json()["next_run_at"] == start.isoformat()

    sv.delete_schedule("every-minute")
    assert sv.list_schedules() == []
    with pytest.raises(sv.ScheduleNotFound):
        sv.describe_schedule("every-minute")
    with pytest.raises(sv.ScheduleNotFound):
        sv.delete_schedule("every-minute")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of cron and interval"),
        ({"cron": "* * * * *", "interval": 60}, "exactly one"),
        ({"cron": "0 0 * * * *"}, "five fields"),
        ({"interval": 0}, "interval"),
        ({"interval": 1.5}, "whole number of seconds"),
        ({"interval": 60, "timezone": "Nowhere/Else"}, "unknown timezone"),
        ({"cron": "0 3 * * *", "timezone": "localtime"}, "IANA"),
        ({"cron": "0 3 * * *", "timezone": "posix/Europe/Paris"}, "IANA"),
        ({"interval": 60, "timezone": "Factory"}, "IANA"),
        ({"interval": 60, "overlap": "queue"}, "overlap"),
        ({"interval": 60, "catchup_window": 1}, "catchup_window"),
        ({"interval": 60, "jitter": 60}, "jitter"),
        ({"cron": "* * * * *", "jitter": 90}, "not be longer than the catchup_window"),
        ({"interval": 60, "input": object()}, "JSON"),
        ({"interval": 60, "input": "a\x00b"}, "NUL"),
        ({"interval": 60, "start_at": datetime(2030, 1, 1)}, "timezone-aware"),
        (
            {
                "interval": 60,
                "start_at": datetime(2030, 1, 2, tzinfo=UTC),
                "end_at": datetime(2030, 1, 1, tzinfo=UTC),
            },
            "not be earlier than start_at",
        ),
        ({"interval": 60, "paused": "yes"}, "paused"),
    ],
)
def test_invalid_definitions_raise_invalid_schedule_and_write_nothing(
    tdb: None, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(sv.InvalidSchedule, match=message):
        sv.create_schedule("bad", "sched.echo", **kwargs)
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("name", ["", "has space", "@at", "x" * 201, "a\x00", "-lead", 7])
def test_invalid_names_are_refused(tdb: None, name: Any) -> None:
    with pytest.raises(sv.InvalidSchedule):
        sv.create_schedule(name, "sched.echo", interval=60)
    with pytest.raises(sv.ScheduleNotFound):
        sv.pause_schedule(name)


def test_a_taken_name_raises_schedule_already_exists(tdb: None) -> None:
    sv.create_schedule("twice", "sched.echo", interval=60)
    with pytest.raises(sv.ScheduleAlreadyExists):
        sv.create_schedule("twice", "sched.echo", cron="* * * * *")
    assert sv.describe_schedule("twice").interval == MINUTE


def test_the_default_timezone_is_settings_time_zone(tdb: None) -> None:
    with override_settings(TIME_ZONE="Europe/Paris"):
        sv.create_schedule("local", "sched.echo", cron="0 9 * * *")
    assert sv.describe_schedule("local").timezone == "Europe/Paris"


# -- runs and their ids ------------------------------------------------------------------


def test_interval_runs_have_the_slot_ids_and_carry_the_input(leader: Leader) -> None:
    start = next_minute()
    sv.create_schedule("tick", "sched.echo", interval=60, input={"hello": "world"})
    assert leader.fire() == 0  # nothing due yet
    for step in range(3):
        assert leader.at(start + step * MINUTE + timedelta(milliseconds=300)) == 1
        leader.run()  # each run closes before the next slot (overlap "skip")
    expected = [f"tick@{iso(start + step * MINUTE)}" for step in range(3)]
    assert runs("tick") == expected
    for run_id in expected:
        result = sv.get_workflow_result(run_id)
        assert result.status == "completed"
        assert result.output == {"input": {"hello": "world"}, "instance_id": run_id}
    described = sv.describe_schedule("tick")
    assert described.recent_instance_ids == list(reversed(expected))
    assert described.last_run_id == expected[-1] and described.runs_started == 3
    assert described.next_run_at == start + 3 * MINUTE
    assert described.missed_runs == 0 and described.overlap_skipped_runs == 0


def test_a_slot_whose_run_already_exists_counts_as_started(leader: Leader) -> None:
    """The start is idempotent: an existing id (started before, by any path) is that slot's
    run; nothing is started twice and the schedule moves on."""
    start = next_minute()
    sv.create_schedule("dup", "sched.echo", interval=60)
    first = f"dup@{iso(start)}"
    sv.start_workflow("sched.echo", "by hand", instance_id=first)
    assert leader.at(start + timedelta(milliseconds=200)) == 1
    assert runs("dup") == [first]
    described = sv.describe_schedule("dup")
    assert described.last_run_id == first and described.runs_started == 0
    assert described.next_run_at == start + MINUTE
    assert WorkflowInstance.objects.get(instance_id=first).input == "by hand"


def test_missed_slots_beyond_the_catchup_window_are_skipped_and_counted(leader: Leader) -> None:
    start = next_minute()
    sv.create_schedule("late", "sched.echo", interval=60, overlap="allow_all", catchup_window=150)
    # No leader for ten minutes: the slots of the last 150 seconds start, the rest are counted.
    assert leader.at(start + 9 * MINUTE + timedelta(seconds=1)) == 1
    assert runs("late") == [f"late@{iso(start + n * MINUTE)}" for n in (7, 8, 9)]
    described = sv.describe_schedule("late")
    assert described.missed_runs == 7 and described.runs_started == 3


def test_start_at_and_end_at_bound_the_slots(leader: Leader) -> None:
    start = next_minute() + 2 * MINUTE
    sv.create_schedule(
        "bounded",
        "sched.echo",
        cron="* * * * *",
        start_at=start,
        end_at=start + MINUTE,
        overlap="allow_all",
    )
    assert leader.at(start - timedelta(seconds=30)) == 0
    leader.at(start + timedelta(seconds=1))
    leader.at(start + MINUTE + timedelta(seconds=1))
    leader.at(start + 2 * MINUTE + timedelta(seconds=1))
    assert runs("bounded") == [f"bounded@{iso(start)}", f"bounded@{iso(start + MINUTE)}"]
    assert sv.describe_schedule("bounded").next_run_at is None


def test_jitter_delays_a_run_but_its_id_names_the_slot(leader: Leader) -> None:
    start = next_minute()
    sv.create_schedule("spread", "sched.echo", interval=60, jitter=50)
    due = sv.describe_schedule("spread").next_run_at
    assert due is not None and start <= due < start + timedelta(seconds=50)
    if due - start > timedelta(seconds=2):  # real time moves on too: leave it a second
        assert leader.at(due - timedelta(seconds=1)) == 0
    assert leader.at(due + timedelta(milliseconds=200)) == 1
    assert runs("spread") == [f"spread@{iso(start)}"]


def test_a_schedule_that_cannot_be_planned_is_recorded_and_the_others_go_on(
    leader: Leader,
) -> None:
    start = next_minute()
    sv.create_schedule("broken", "sched.echo", interval=60)
    sv.create_schedule("fine", "sched.echo", interval=60)
    Schedule.objects.filter(name="broken").update(timezone="Nowhere/Else", interval_ms=None)
    assert leader.at(start + timedelta(milliseconds=200)) == 2
    assert runs("fine") == [f"fine@{iso(start)}"] and runs("broken") == []
    broken = sv.describe_schedule("broken")
    assert "Nowhere/Else" in broken.last_error or "Error" in broken.last_error
    assert broken.next_run_at is not None and broken.next_run_at > db_now()  # retried later
    assert leader.fire() == 0  # not again at once: an error does not spin


def test_host_dependent_timezones_are_refused_at_every_boundary(
    leader: Leader, code_schedules: Callable[[dict[str, Any]], Any]
) -> None:
    with override_settings(TIME_ZONE="localtime"), pytest.raises(sv.InvalidSchedule, match="IANA"):
        sv.create_schedule("host", "sched.echo", cron="0 3 * * *")  # the default zone too
    sv.create_schedule("host", "sched.echo", cron="0 3 * * *", timezone="Europe/Paris")
    with pytest.raises(sv.InvalidSchedule, match="IANA"):
        sv.update_schedule("host", timezone="right/Europe/Paris")
    assert sv.describe_schedule("host").timezone == "Europe/Paris"
    code_schedules(
        {"host-code": {"workflow": "sched.echo", "cron": "0 3 * * *", "timezone": "localtime"}}
    )
    errors = [m for m in run_checks(tags=["selvedge"]) if m.id == "selvedge.E004"]
    assert len(errors) == 1 and "localtime" in errors[0].msg
    with pytest.raises(ImproperlyConfigured, match="localtime"):
        Worker().start()
    assert [row.name for row in Schedule.objects.all()] == ["host"]


def test_a_stored_host_dependent_timezone_computes_no_slot_and_writes_nothing(
    leader: Leader,
) -> None:
    """A row written before the names were checked (or by hand) is refused when loaded:
    the leader records the error and starts nothing; backfill and unpause raise
    InvalidSchedule and write nothing; a valid zone set with update_schedule repairs it."""
    start = next_minute()
    sv.create_schedule("stored", "sched.echo", cron="* * * * *", timezone="Europe/Paris")
    sv.create_schedule("fine", "sched.echo", interval=60)
    Schedule.objects.filter(name="stored").update(timezone="localtime")
    assert leader.at(start + timedelta(milliseconds=200)) == 2
    assert runs("stored") == [] and runs("fine") == [f"fine@{iso(start)}"]
    assert "localtime" in sv.describe_schedule("stored").last_error
    version = Schedule.objects.get(name="stored").version
    with pytest.raises(sv.InvalidSchedule, match="IANA"):
        sv.backfill_schedule("stored", start - 3 * MINUTE, start)
    sv.pause_schedule("stored")
    with pytest.raises(sv.InvalidSchedule, match="IANA"):
        sv.unpause_schedule("stored")
    assert runs("stored") == [] and Schedule.objects.get(name="stored").paused
    assert Schedule.objects.get(name="stored").version == version + 1  # the pause only
    repaired = sv.update_schedule("stored", timezone="Europe/Paris", paused=False)
    assert repaired.timezone == "Europe/Paris" and repaired.next_run_at is not None


def test_the_leader_fires_the_start_hooks(leader: Leader) -> None:
    from selvedge_django.signals import workflow_started

    seen: list[str] = []

    def record(sender: Any, instance_id: str, **kwargs: Any) -> None:
        seen.append(instance_id)

    workflow_started.connect(record, dispatch_uid="schedule-hook-test")
    try:
        start = next_minute()
        sv.create_schedule("hooked", "sched.echo", interval=60)
        leader.at(start + timedelta(milliseconds=200))
    finally:
        workflow_started.disconnect(dispatch_uid="schedule-hook-test")
    assert seen == [f"hooked@{iso(start)}"]


# -- pause, unpause, trigger, backfill ---------------------------------------------------


def test_pause_and_unpause(leader: Leader) -> None:
    start = next_minute()
    sv.create_schedule("pausable", "sched.echo", interval=60)
    sv.pause_schedule("pausable")
    sv.pause_schedule("pausable")  # idempotent
    assert sv.describe_schedule("pausable").next_run_at is None
    assert leader.at(start + 3 * MINUTE + timedelta(seconds=1)) == 0
    assert runs("pausable") == []

    sv.unpause_schedule("pausable")
    described = sv.describe_schedule("pausable")
    # From the first slot after the unpause: the paused slots are neither run nor missed.
    assert not described.paused and described.next_run_at == start + 4 * MINUTE
    assert leader.at(start + 4 * MINUTE + timedelta(seconds=1)) == 1
    assert runs("pausable") == [f"pausable@{iso(start + 4 * MINUTE)}"]
    assert sv.describe_schedule("pausable").missed_runs == 0


def test_trigger_starts_a_run_now_even_when_paused(leader: Leader) -> None:
    sv.create_schedule("manual", "sched.echo", cron="0 0 1 1 *", paused=True, input=5)
    now = db_now()
    first = sv.trigger_schedule("manual")
    second = sv.trigger_schedule("manual")
    assert first != second and first.startswith("manual@") and first.endswith("Z")
    moment = datetime.strptime(first.split("@", 1)[1], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert abs(moment.replace(tzinfo=UTC) - now) < timedelta(seconds=5)
    assert "." in first  # milliseconds: never a slot's id
    described = sv.describe_schedule("manual")
    assert described.recent_instance_ids == [second, first]
    assert described.last_run_id == second and described.runs_started == 2
    assert described.last_run_at is not None
    leader.run()
    assert sv.get_workflow_result(first).output == {"input": 5, "instance_id": first}
    with pytest.raises(sv.ScheduleNotFound):
        sv.trigger_schedule("nope")


def test_trigger_inside_a_transaction_commits_with_it(leader: Leader) -> None:
    sv.create_schedule("atomic", "sched.echo", interval=3600)
    with pytest.raises(RuntimeError), transaction.atomic():
        sv.trigger_schedule("atomic")
        raise RuntimeError("roll back")
    assert runs("atomic") == []
    assert sv.describe_schedule("atomic").runs_started == 0


def test_backfill_is_idempotent(leader: Leader) -> None:
    sv.create_schedule("hourly", "sched.echo", cron="0 * * * *")
    now = db_now()
    top = now.replace(minute=0, second=0, microsecond=0)
    start, end = top - timedelta(hours=3), top
    ids = sv.backfill_schedule("hourly", start, end)
    expected = [f"hourly@{iso(top - timedelta(hours=h))}" for h in (3, 2, 1)]
    assert ids == expected
    assert runs("hourly") == expected
    assert sv.backfill_schedule("hourly", start, end) == expected  # starts nothing more
    assert runs("hourly") == expected
    assert sv.describe_schedule("hourly").runs_started == 3
    # Slots after now are left to the schedule.
    later = sv.backfill_schedule("hourly", top, top + timedelta(hours=5))
    assert later == ([f"hourly@{iso(top)}"] if top <= now else [])
    with pytest.raises(sv.InvalidSchedule):
        sv.backfill_schedule("hourly", end, start)
    with pytest.raises(sv.InvalidSchedule, match="in parts"):
        sv.backfill_schedule("hourly", top - timedelta(days=60), top)
    with pytest.raises(sv.InvalidSchedule, match="timezone-aware"):
        sv.backfill_schedule("hourly", datetime(2030, 1, 1), datetime(2030, 1, 2))


def test_update_changes_the_definition_and_recounts_the_next_slot(leader: Leader) -> None:
    start = next_minute()
    sv.create_schedule("change-me", "sched.echo", interval=60, input=1)
    leader.at(start + timedelta(milliseconds=100))
    updated = sv.update_schedule("change-me", cron="30 * * * *", input=2, overlap="allow_all")
    assert updated.cron == "30 * * * *" and updated.interval is None
    assert updated.input == 2 and updated.overlap == "allow_all"
    assert updated.next_run_at is not None and updated.next_run_at.minute == 30
    assert updated.runs_started == 1  # the counters stay
    with pytest.raises(sv.InvalidSchedule, match="unknown schedule fields"):
        sv.update_schedule("change-me", colour="red")
    with pytest.raises(sv.InvalidSchedule):
        sv.update_schedule("change-me", timezone="Nowhere/Else")
    assert sv.describe_schedule("change-me").timezone == "UTC"
    back = sv.update_schedule("change-me", interval=120)
    assert back.interval == timedelta(minutes=2) and back.cron is None


def test_async_twins(leader: Leader) -> None:
    async def flow() -> tuple[str, list[str]]:
        await sv.acreate_schedule("async", "sched.echo", interval=60)
        await sv.apause_schedule("async")
        await sv.aunpause_schedule("async")
        await sv.aupdate_schedule("async", input=3)
        run_id = await sv.atrigger_schedule("async")
        described = await sv.adescribe_schedule("async")
        names = [s.name for s in await sv.alist_schedules()]
        await sv.abackfill_schedule("async", now - timedelta(minutes=2), now)
        await sv.adelete_schedule("async")
        assert described.input == 3
        await sync_to_async(connections.close_all)()  # the thread's connection, as a view's
        return run_id, names

    now = db_now()
    run_id, names = asyncio.run(flow())
    assert names == ["async"] and run_id.startswith("async@")


# -- overlap policies -------------------------------------------------------------------------


@pytest.fixture
def waiting(leader: Leader) -> Callable[[str], tuple[datetime, str]]:
    """Create a schedule of sched.wait (runs until signalled) and start its first slot."""

    def make(overlap: str) -> tuple[datetime, str]:
        start = next_minute()
        sv.create_schedule("over", "sched.wait", interval=60, overlap=overlap, catchup_window=600)
        leader.at(start + timedelta(milliseconds=100))
        leader.run()
        first = f"over@{iso(start)}"
        assert status(first) == "running"
        return start, first

    return make


def finish(leader: Leader, run_id: str) -> None:
    sv.signal(run_id, "done", "ok")
    leader.run()
    assert status(run_id) == "completed"


def test_skip_starts_nothing_while_the_last_run_runs(
    leader: Leader, waiting: Callable[[str], tuple[datetime, str]]
) -> None:
    start, first = waiting("skip")
    leader.at(start + MINUTE + timedelta(milliseconds=100))
    leader.at(start + 2 * MINUTE + timedelta(milliseconds=100))
    assert runs("over") == [first]
    assert sv.describe_schedule("over").overlap_skipped_runs == 2
    finish(leader, first)
    leader.at(start + 3 * MINUTE + timedelta(milliseconds=100))
    assert runs("over") == [first, f"over@{iso(start + 3 * MINUTE)}"]


def test_buffer_one_starts_one_held_slot_when_the_last_run_closes(
    leader: Leader, waiting: Callable[[str], tuple[datetime, str]]
) -> None:
    start, first = waiting("buffer_one")
    leader.at(start + MINUTE + timedelta(milliseconds=100))
    leader.at(start + 2 * MINUTE + timedelta(milliseconds=100))
    assert runs("over") == [first]
    described = sv.describe_schedule("over")
    assert described.buffered_slot_at == start + MINUTE
    assert described.overlap_skipped_runs == 1
    assert leader.fire() == 0  # still running: nothing to do, nothing written
    finish(leader, first)  # run_until_idle does the leader's duties too
    # The held slot started as soon as the last run closed.
    assert runs("over") == [first, f"over@{iso(start + MINUTE)}"]
    assert sv.describe_schedule("over").buffered_slot_at is None


def test_allow_all_starts_every_slot(
    leader: Leader, waiting: Callable[[str], tuple[datetime, str]]
) -> None:
    start, first = waiting("allow_all")
    leader.at(start + MINUTE + timedelta(milliseconds=100))
    leader.at(start + 2 * MINUTE + timedelta(milliseconds=100))
    assert runs("over") == [first, *(f"over@{iso(start + n * MINUTE)}" for n in (1, 2))]
    assert sv.describe_schedule("over").overlap_skipped_runs == 0


def test_cancel_other_cancels_the_last_run_then_starts_the_new_slot(
    leader: Leader, waiting: Callable[[str], tuple[datetime, str]]
) -> None:
    start, first = waiting("cancel_other")
    leader.at(start + MINUTE + timedelta(milliseconds=100))
    assert runs("over") == [first]  # not yet: the last run is asked to cancel first
    assert WorkflowInstance.objects.get(instance_id=first).cancel_requested
    leader.run()  # the cancellation closes the last run, then the slot starts
    assert status(first) == "cancelled"
    second = f"over@{iso(start + MINUTE)}"
    assert runs("over") == [first, second]
    leader.run()
    assert status(second) == "running"


# -- DST, computed on the moved database clock -------------------------------------------------


def walk(leader: Leader, name: str, start: datetime, end: datetime, step: timedelta) -> list[str]:
    moment = start
    while moment <= end:
        leader.at(moment)
        moment += step
    return runs(name)


def test_paris_spring_forward_on_the_database_clock(leader: Leader) -> None:
    leader.move_to(datetime(2030, 3, 30, 23, 40, tzinfo=UTC))
    sv.create_schedule(
        "paris",
        "sched.echo",
        cron="0,30 1-3 * * *",
        timezone="Europe/Paris",
        catchup_window=3600,
        overlap="allow_all",
    )
    found = walk(
        leader,
        "paris",
        datetime(2030, 3, 30, 23, 50, tzinfo=UTC),
        datetime(2030, 3, 31, 2, 10, tzinfo=UTC),
        timedelta(minutes=10),
    )
    # 01:00, 01:30 CET; 02:00 and 02:30 do not exist; 03:00, 03:30 CEST.
    assert found == [
        "paris@2030-03-31T00:00:00Z",
        "paris@2030-03-31T00:30:00Z",
        "paris@2030-03-31T01:00:00Z",
        "paris@2030-03-31T01:30:00Z",
    ]
    assert sv.describe_schedule("paris").missed_runs == 0


def test_new_york_fall_back_on_the_database_clock(leader: Leader) -> None:
    leader.move_to(datetime(2030, 11, 3, 4, 30, tzinfo=UTC))
    sv.create_schedule(
        "ny",
        "sched.echo",
        cron="0,30 1 * * *",
        timezone="America/New_York",
        catchup_window=3600,
        overlap="allow_all",
    )
    found = walk(
        leader,
        "ny",
        datetime(2030, 11, 3, 4, 40, tzinfo=UTC),
        datetime(2030, 11, 3, 7, 10, tzinfo=UTC),
        timedelta(minutes=10),
    )
    # 01:00 and 01:30 EDT only; the repeated 01:00-01:59 EST starts nothing.
    assert found == ["ny@2030-11-03T05:00:00Z", "ny@2030-11-03T05:30:00Z"]
    assert sv.describe_schedule("ny").next_run_at == datetime(2030, 11, 4, 6, 0, tzinfo=UTC)


def test_a_wildcard_schedule_runs_through_the_repeated_hour_on_the_database_clock(
    leader: Leader,
) -> None:
    leader.move_to(datetime(2030, 11, 3, 4, 31, tzinfo=UTC))
    sv.create_schedule(
        "ny-quarter",
        "sched.echo",
        cron="*/15 * * * *",
        timezone="America/New_York",
        catchup_window=3600,
        overlap="allow_all",
    )
    found = walk(
        leader,
        "ny-quarter",
        datetime(2030, 11, 3, 4, 40, tzinfo=UTC),
        datetime(2030, 11, 3, 7, 10, tzinfo=UTC),
        timedelta(minutes=5),
    )
    # Every quarter hour of real time: 00:45 and 01:00-01:45 EDT, 01:00-01:45 EST, 02:00 EST.
    expected = [
        f"ny-quarter@2030-11-03T{hour:02d}:{minute:02d}:00Z"
        for hour in (5, 6)
        for minute in (0, 15, 30, 45)
    ]
    assert found == [
        "ny-quarter@2030-11-03T04:45:00Z",
        *expected,
        "ny-quarter@2030-11-03T07:00:00Z",
    ]
    described = sv.describe_schedule("ny-quarter")
    assert described.runs_started == 10 and described.missed_runs == 0
    assert described.next_run_at == datetime(2030, 11, 3, 7, 15, tzinfo=UTC)


# -- code-defined schedules -------------------------------------------------------------------


@pytest.fixture
def code_schedules(tdb: None) -> Iterator[Callable[[dict[str, Any]], Any]]:
    """Set SELVEDGE["SCHEDULES"] for the test (the rest of SELVEDGE as it is)."""
    from django.conf import settings

    stack: list[Any] = []

    def define(schedules: dict[str, Any]) -> Any:
        raw = {**settings.SELVEDGE, "SCHEDULES": schedules}
        context = override_settings(SELVEDGE=raw)
        context.enable()
        stack.append(context)
        return context

    yield define
    for context in reversed(stack):
        context.disable()


def test_code_defined_schedules_are_created_and_updated_when_a_worker_starts(
    code_schedules: Callable[[dict[str, Any]], Any],
) -> None:
    code_schedules(
        {"report": {"workflow": "sched.echo", "cron": "0 6 * * *", "input": {"to": "ops"}}}
    )
    worker = Worker()
    worker.start()
    worker.stop(timeout=10)
    described = sv.describe_schedule("report")
    assert described.source == "settings" and described.cron == "0 6 * * *"
    assert described.input == {"to": "ops"}

    sv.pause_schedule("report")  # an operator's pause survives the next start
    code_schedules({"report": {"workflow": "sched.echo", "cron": "0 7 * * *"}})
    worker = Worker()
    worker.start()
    worker.stop(timeout=10)
    described = sv.describe_schedule("report")
    assert described.cron == "0 7 * * *" and described.input is None and described.paused

    version = Schedule.objects.get(name="report").version
    Worker().leader.schedules.sync()  # unchanged: nothing written
    assert Schedule.objects.get(name="report").version == version


def test_invalid_code_schedules_fail_the_system_check_and_the_worker_start(
    code_schedules: Callable[[dict[str, Any]], Any],
) -> None:
    code_schedules({"broken": {"workflow": "sched.echo", "cron": "every day"}})
    errors = [m for m in run_checks(tags=["selvedge"]) if m.id == "selvedge.E004"]
    assert len(errors) == 1 and "broken" in errors[0].msg
    with pytest.raises(ImproperlyConfigured, match="broken"):
        Worker().start()
    assert not Schedule.objects.exists()


def test_a_code_schedule_for_an_unregistered_workflow_is_a_warning(
    code_schedules: Callable[[dict[str, Any]], Any],
) -> None:
    code_schedules({"elsewhere": {"workflow": "other.service.flow", "interval": 60}})
    warnings = [m for m in run_checks(tags=["selvedge"]) if m.id == "selvedge.W004"]
    assert len(warnings) == 1 and "other.service.flow" in warnings[0].msg


# -- prune as a built-in schedule -------------------------------------------------------------


def test_prune_runs_as_a_built_in_schedule(leader: Leader) -> None:
    from django.utils import timezone

    old = timezone.now() - timedelta(days=40)
    for n in range(3):
        WorkflowInstance.objects.create(
            instance_id=f"old-{n}",
            workflow_name="sched.echo",
            status="completed",
            started_at=old,
            updated_at=old,
            closed_at=old,
        )
    sv.start_workflow("sched.wait", None, instance_id="still-running")
    start = next_minute()
    sv.create_schedule(
        "prune", "selvedge.prune", cron="* * * * *", input={"older_than": "30d", "batch_size": 2}
    )
    leader.at(start + timedelta(milliseconds=200))
    leader.run()
    run_id = f"prune@{iso(start)}"
    result = sv.get_workflow_result(run_id)
    assert result.status == "completed", result.error
    assert result.output == {"deleted": 3}
    assert not WorkflowInstance.objects.filter(instance_id__startswith="old-").exists()
    assert status("still-running") == "running"


def test_prune_refuses_bad_options_without_retrying(leader: Leader) -> None:
    sv.create_schedule("bad-prune", "selvedge.prune", interval=3600, input={"older": "30d"})
    run_id = sv.trigger_schedule("bad-prune")
    leader.run()
    result = sv.get_workflow_result(run_id)
    assert result.status == "failed" and "unknown selvedge.prune options" in str(result.error)
    tasks = sv.list_activity_tasks(run_id)
    assert [task.attempts for task in tasks] == [1]
