"""Slots, DST, jitter and the firing plan: pure rules, computed without a clock or database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import selvedge_django as sv
from selvedge_django.schedules.slots import (
    SlotRule,
    check_cron,
    check_timezone,
    iso_ms,
    jitter_offset_ms,
    plan,
    slot_id,
    trigger_id,
)

MINUTE = 60_000
HOUR = 60 * MINUTE


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def slots(rule: SlotRule, after: str, count: int) -> list[str]:
    found: list[str] = []
    at = ms(after)
    for _ in range(count):
        nxt = rule.next_after(at)
        assert nxt is not None
        found.append(iso_ms(nxt))
        at = nxt
    return found


# -- ids ---------------------------------------------------------------------------------


def test_a_slots_run_id_is_the_name_and_the_slot_in_iso_8601_utc() -> None:
    assert slot_id("nightly", ms("2030-01-02T03:04:05+00:00")) == "nightly@2030-01-02T03:04:05Z"
    # A trigger's id has milliseconds, so it never takes a slot's id.
    assert trigger_id("nightly", ms("2030-01-02T03:04:05+00:00")) == (
        "nightly@2030-01-02T03:04:05.000Z"
    )
    assert trigger_id("n", ms("2030-01-02T03:04:05.042+00:00")) == "n@2030-01-02T03:04:05.042Z"


# -- intervals ---------------------------------------------------------------------------


def test_interval_slots_count_from_the_epoch_or_from_start_at() -> None:
    every_15m = SlotRule(None, 15 * MINUTE)
    assert slots(every_15m, "2030-01-01T10:07:00+00:00", 3) == [
        "2030-01-01T10:15:00Z",
        "2030-01-01T10:30:00Z",
        "2030-01-01T10:45:00Z",
    ]
    anchored = SlotRule(None, HOUR, start_ms=ms("2030-01-01T00:20:00+00:00"))
    assert slots(anchored, "2029-06-01T00:00:00+00:00", 2) == [
        "2030-01-01T00:20:00Z",
        "2030-01-01T01:20:00Z",
    ]
    # A slot exactly at the instant is not "after" it, but is "from" it.
    assert anchored.next_after(ms("2030-01-01T01:20:00+00:00")) == ms("2030-01-01T02:20:00+00:00")
    assert anchored.first_from(ms("2030-01-01T01:20:00+00:00")) == ms("2030-01-01T01:20:00+00:00")


def test_intervals_ignore_dst() -> None:
    hourly = SlotRule(None, HOUR, timezone="Europe/Paris")
    assert slots(hourly, "2030-03-31T00:30:00+00:00", 3) == [
        "2030-03-31T01:00:00Z",
        "2030-03-31T02:00:00Z",
        "2030-03-31T03:00:00Z",
    ]


def test_end_at_is_the_last_moment_a_slot_may_have() -> None:
    rule = SlotRule(None, HOUR, end_ms=ms("2030-01-01T02:00:00+00:00"))
    assert rule.next_after(ms("2030-01-01T01:30:00+00:00")) == ms("2030-01-01T02:00:00+00:00")
    assert rule.next_after(ms("2030-01-01T02:00:00+00:00")) is None
    cron = SlotRule("0 * * * *", None, end_ms=ms("2030-01-01T02:00:00+00:00"))
    assert cron.next_after(ms("2030-01-01T02:00:00+00:00")) is None


# -- cron and DST ----------------------------------------------------------------------------


def test_cron_in_utc() -> None:
    rule = SlotRule("*/20 9-10 * * MON-FRI", None)
    assert slots(rule, "2030-01-04T10:30:00+00:00", 4) == [  # a Friday
        "2030-01-04T10:40:00Z",
        "2030-01-07T09:00:00Z",  # Monday
        "2030-01-07T09:20:00Z",
        "2030-01-07T09:40:00Z",
    ]


def test_paris_spring_forward_skips_the_slot_that_does_not_exist() -> None:
    # 2030-03-31: 02:00 CET becomes 03:00 CEST; 02:30 that night never happens.
    daily = SlotRule("30 2 * * *", None, timezone="Europe/Paris")
    assert slots(daily, "2030-03-29T12:00:00+00:00", 3) == [
        "2030-03-30T01:30:00Z",  # 02:30 CET
        "2030-04-01T00:30:00Z",  # 02:30 CEST; none on the 31st
        "2030-04-02T00:30:00Z",
    ]
    half_hourly = SlotRule("*/30 * * * *", None, timezone="Europe/Paris")
    assert slots(half_hourly, "2030-03-31T00:10:00+00:00", 3) == [
        "2030-03-31T00:30:00Z",  # 01:30 CET
        "2030-03-31T01:00:00Z",  # 03:00 CEST: 02:00 and 02:30 do not exist
        "2030-03-31T01:30:00Z",
    ]


def test_paris_fall_back_fires_a_fixed_time_once_and_a_wildcard_in_both_passes() -> None:
    # 2030-10-27: 03:00 CEST becomes 02:00 CET; 02:00-02:59 happens twice.
    daily = SlotRule("30 2 * * *", None, timezone="Europe/Paris")
    assert slots(daily, "2030-10-26T12:00:00+00:00", 2) == [
        "2030-10-27T00:30:00Z",  # the first 02:30 (CEST) only
        "2030-10-28T01:30:00Z",
    ]
    hourly = SlotRule("0 * * * *", None, timezone="Europe/Paris")
    assert slots(hourly, "2030-10-26T23:30:00+00:00", 4) == [
        "2030-10-27T00:00:00Z",  # 02:00 CEST
        "2030-10-27T01:00:00Z",  # 02:00 CET: the hour field is "*", so the second pass too
        "2030-10-27T02:00:00Z",  # 03:00 CET
        "2030-10-27T03:00:00Z",
    ]


def test_new_york_spring_forward_and_fall_back() -> None:
    # 2030-03-10: 02:00 EST becomes 03:00 EDT.
    daily = SlotRule("30 2 * * *", None, timezone="America/New_York")
    assert slots(daily, "2030-03-09T00:00:00+00:00", 2) == [
        "2030-03-09T07:30:00Z",
        "2030-03-11T06:30:00Z",  # none on the 10th
    ]
    hourly = SlotRule("0 * * * *", None, timezone="America/New_York")
    assert slots(hourly, "2030-03-10T05:30:00+00:00", 2) == [
        "2030-03-10T06:00:00Z",  # 01:00 EST
        "2030-03-10T07:00:00Z",  # 03:00 EDT
    ]
    # 2030-11-03: 02:00 EDT becomes 01:00 EST; 01:00-01:59 happens twice.
    quarterly = SlotRule("0,15,30,45 1 * * *", None, timezone="America/New_York")
    assert slots(quarterly, "2030-11-03T04:50:00+00:00", 5) == [
        "2030-11-03T05:00:00Z",  # 01:00 EDT
        "2030-11-03T05:15:00Z",
        "2030-11-03T05:30:00Z",
        "2030-11-03T05:45:00Z",
        "2030-11-04T06:00:00Z",  # fixed times: the second pass (06:00-06:45Z) fires nothing
    ]
    # The same search from inside the second pass finds the next day.
    assert quarterly.next_after(ms("2030-11-03T06:20:00+00:00")) == ms("2030-11-04T06:00:00+00:00")


def test_wildcard_expressions_fire_in_both_passes_of_the_repeated_hour() -> None:
    # 2030-11-03 in New York: 02:00 EDT becomes 01:00 EST; 01:00-01:59 happens twice.
    # */15 runs every quarter hour of real time, without a one-hour gap (as Vixie cron).
    quarterly = SlotRule("*/15 * * * *", None, timezone="America/New_York")
    assert slots(quarterly, "2030-11-03T04:50:00+00:00", 10) == [
        "2030-11-03T05:00:00Z",  # 01:00 EDT
        "2030-11-03T05:15:00Z",
        "2030-11-03T05:30:00Z",
        "2030-11-03T05:45:00Z",
        "2030-11-03T06:00:00Z",  # 01:00 EST, the second pass
        "2030-11-03T06:15:00Z",
        "2030-11-03T06:30:00Z",
        "2030-11-03T06:45:00Z",
        "2030-11-03T07:00:00Z",  # 02:00 EST
        "2030-11-03T07:15:00Z",
    ]
    # A wildcard minute with a fixed hour is wildcard too (Vixie cron: minute or hour "*").
    in_the_hour = SlotRule("*/30 1 * * *", None, timezone="America/New_York")
    assert slots(in_the_hour, "2030-11-03T04:50:00+00:00", 5) == [
        "2030-11-03T05:00:00Z",
        "2030-11-03T05:30:00Z",
        "2030-11-03T06:00:00Z",
        "2030-11-03T06:30:00Z",
        "2030-11-04T06:00:00Z",
    ]
    # Paris, 2030-10-27: 03:00 CEST becomes 02:00 CET; "0 */2" names 02:00 twice.
    two_hourly = SlotRule("0 */2 * * *", None, timezone="Europe/Paris")
    assert slots(two_hourly, "2030-10-26T21:30:00+00:00", 4) == [
        "2030-10-26T22:00:00Z",  # 00:00 CEST
        "2030-10-27T00:00:00Z",  # 02:00 CEST
        "2030-10-27T01:00:00Z",  # 02:00 CET
        "2030-10-27T03:00:00Z",  # 04:00 CET
    ]


def test_a_fixed_time_fires_once_in_the_repeated_hour() -> None:
    for expression in ("30 1 * * *", "0,30 1 * * *", "15 1-2 * * *"):
        rule = SlotRule(expression, None, timezone="America/New_York")
        found = slots(rule, "2030-11-03T04:50:00+00:00", 3)
        assert "2030-11-03T06:30:00Z" not in found and "2030-11-03T06:15:00Z" not in found
        assert found[0] in ("2030-11-03T05:30:00Z", "2030-11-03T05:00:00Z", "2030-11-03T05:15:00Z")


def test_the_search_from_inside_either_pass_finds_the_next_slot_in_real_time() -> None:
    quarterly = SlotRule("*/15 * * * *", None, timezone="America/New_York")
    # 01:50 EDT, late in the first pass: next is 01:00 EST, an hour of wall time back.
    assert slots(quarterly, "2030-11-03T05:50:00+00:00", 2) == [
        "2030-11-03T06:00:00Z",
        "2030-11-03T06:15:00Z",
    ]
    # 01:20 EST, the second pass.
    assert slots(quarterly, "2030-11-03T06:20:00+00:00", 2) == [
        "2030-11-03T06:30:00Z",
        "2030-11-03T06:45:00Z",
    ]
    # Lord Howe Island repeats half an hour (01:30-01:59) on 2030-04-07.
    lord_howe = SlotRule("*/20 * * * *", None, timezone="Australia/Lord_Howe")
    assert slots(lord_howe, "2030-04-06T14:30:00+00:00", 5) == [
        "2030-04-06T14:40:00Z",  # 01:40 +11
        "2030-04-06T15:10:00Z",  # 01:40 +10:30, the second pass
        "2030-04-06T15:30:00Z",  # 02:00 +10:30
        "2030-04-06T15:50:00Z",
        "2030-04-06T16:10:00Z",
    ]


def test_both_passes_have_their_own_run_ids_and_other_ids_do_not_change() -> None:
    quarterly = SlotRule("*/15 * * * *", None, timezone="America/New_York")
    found = slots(quarterly, "2030-11-03T04:50:00+00:00", 8)
    ids = [slot_id("q", ms(text.replace("Z", "+00:00"))) for text in found]
    assert len(set(ids)) == 8
    assert ids[1] == "q@2030-11-03T05:15:00Z" and ids[5] == "q@2030-11-03T06:15:00Z"  # 01:15 twice
    # Away from the repeated hour the slots (and so the ids) are what they always were.
    assert slots(quarterly, "2030-11-03T07:50:00+00:00", 2) == [
        "2030-11-03T08:00:00Z",
        "2030-11-03T08:15:00Z",
    ]


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(ms("2029-01-01T00:00:00+00:00"), ms("2032-01-01T00:00:00+00:00")),
    expression=st.sampled_from(["*/7 * * * *", "0 */3 * * *", "30 1,2,3 * * *", "0 0 * * 0"]),
    zone=st.sampled_from(["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "UTC"]),
)
def test_cron_slots_increase_and_each_local_time_fires_once_or_once_per_pass(
    start: int, expression: str, zone: str
) -> None:
    from zoneinfo import ZoneInfo

    from selvedge_django.schedules.slots import is_wildcard

    rule = SlotRule(expression, None, timezone=zone)
    at = start
    seen_local: set[object] = set()
    for _ in range(20):
        nxt = rule.next_after(at)
        assert nxt is not None and nxt > at and nxt % 1000 == 0
        local = datetime.fromtimestamp(nxt / 1000, UTC).astimezone(ZoneInfo(zone))
        wall = local.replace(tzinfo=None)
        # A repeated wall time fires once, or once per pass for a wildcard expression.
        key = (wall, local.fold) if is_wildcard(expression) else wall
        assert key not in seen_local
        seen_local.add(key)
        # No slot was passed over: nothing matches between two slots.
        assert rule.next_after(at) == nxt
        at = nxt


TRANSITIONS_2030 = [
    ("Europe/Paris", "2030-03-31T01:00:00+00:00"),
    ("Europe/Paris", "2030-10-27T01:00:00+00:00"),
    ("America/New_York", "2030-03-10T07:00:00+00:00"),
    ("America/New_York", "2030-11-03T06:00:00+00:00"),
    ("Australia/Lord_Howe", "2030-04-06T15:00:00+00:00"),  # back half an hour
    ("Australia/Lord_Howe", "2030-10-05T15:30:00+00:00"),
]


@pytest.mark.parametrize(("zone", "transition"), TRANSITIONS_2030)
@pytest.mark.parametrize(
    "expression",
    ["*/7 * * * *", "0 */2 * * *", "*/20 1 * * *", "17 * * * *", "30 1,2 * * *", "0-59 1-2 * * *"],
)
def test_slots_are_every_minute_whose_wall_clock_matches_by_brute_force(
    zone: str, transition: str, expression: str
) -> None:
    """Over each minute of real time around a DST change: a wildcard expression's slots
    are the minutes whose local wall time matches, in both passes of a repeated time;
    a fixed expression's are the first occurrence of each matching wall time."""
    from zoneinfo import ZoneInfo

    from cronsim import CronSim

    from selvedge_django.schedules.slots import is_wildcard

    tz = ZoneInfo(zone)
    begin = ms(transition) - 3 * HOUR
    end = ms(transition) + 3 * HOUR
    expected: list[int] = []
    for instant in range(begin + MINUTE, end + 1, MINUTE):
        local = datetime.fromtimestamp(instant / 1000, UTC).astimezone(tz)
        wall = local.replace(tzinfo=None)
        matches = next(CronSim(expression, wall - timedelta(minutes=1))) == wall
        if matches and (local.fold == 0 or is_wildcard(expression)):
            expected.append(instant)
    rule = SlotRule(expression, None, timezone=zone)
    found: list[int] = []
    slot = rule.next_after(begin)
    while slot is not None and slot <= end:
        found.append(slot)
        slot = rule.next_after(slot)
    assert [iso_ms(s) for s in found] == [iso_ms(s) for s in expected]


# -- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 * * * *",  # six fields (seconds)
        "@daily",
        "* * * *",
        "61 * * * *",
        "*/0 * * * *",
        "0 0 30 2 *",  # never
        "a b c d e",
        "0 0 * * MON#9",
        "",
        "0 0 * * *; rm -rf /",
        "1" * 300,
    ],
)
def test_invalid_cron_expressions_are_refused(expression: str) -> None:
    with pytest.raises(sv.InvalidSchedule):
        check_cron(expression)


def test_valid_cron_expressions_are_normalised() -> None:
    assert check_cron(" 0  9 * * mon-fri ") == "0 9 * * mon-fri"
    assert check_cron("0 0 L * *") == "0 0 L * *"


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../../etc/passwd", "", 5, None, "x" * 100])
def test_unknown_timezones_are_refused(zone: object) -> None:
    with pytest.raises(sv.InvalidSchedule):
        check_timezone(zone)


HOST_DEPENDENT_ZONES = [
    "localtime",  # whatever /etc/localtime is on the host that reads it
    "Factory",
    "posixrules",
    "posix/Europe/Paris",
    "right/Europe/Paris",  # leap seconds counted: slots seconds off
]


@pytest.mark.parametrize("zone", HOST_DEPENDENT_ZONES)
def test_host_dependent_timezone_names_are_refused(zone: str) -> None:
    with pytest.raises(sv.InvalidSchedule, match="IANA"):
        check_timezone(zone)


@pytest.mark.parametrize(
    "zone", ["UTC", "Europe/Paris", "America/New_York", "US/Eastern", "Etc/GMT+5"]
)
def test_iana_timezone_names_are_accepted(zone: str) -> None:
    assert check_timezone(zone).key == zone


@pytest.mark.parametrize("zone", HOST_DEPENDENT_ZONES)
def test_a_cron_rule_in_a_host_dependent_timezone_has_no_slots_to_compute(zone: str) -> None:
    # A stored row written before names were checked (or by hand) computes nothing.
    with pytest.raises(sv.InvalidSchedule):
        SlotRule("0 3 * * *", None, timezone=zone).next_after(ms("2030-01-01T00:00:00+00:00"))


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_any_text_is_a_cron_expression_or_invalid_schedule(text: str) -> None:
    try:
        check_cron(text)
    except sv.InvalidSchedule:
        pass


# -- jitter ---------------------------------------------------------------------------------


def test_jitter_is_fixed_per_slot_and_below_the_jitter() -> None:
    offsets = {jitter_offset_ms("s", slot * MINUTE, 30_000) for slot in range(200)}
    assert all(0 <= offset < 30_000 for offset in offsets)
    assert len(offsets) > 150  # spread out
    assert jitter_offset_ms("s", MINUTE, 30_000) == jitter_offset_ms("s", MINUTE, 30_000)
    assert jitter_offset_ms("s", MINUTE, 0) == 0


# -- the plan -------------------------------------------------------------------------------

EVERY_MINUTE = SlotRule(None, MINUTE)
T0 = ms("2030-01-01T12:00:00+00:00")


def make_plan(
    overlap: str = "skip",
    *,
    next_slot: int | None = T0,
    buffered: int | None = None,
    running: bool = False,
    now: int = T0 + 500,
    catchup: int = 5 * MINUTE,
    rule: SlotRule = EVERY_MINUTE,
) -> object:
    return plan(
        name="p",
        rule=rule,
        overlap=overlap,
        catchup_ms=catchup,
        jitter_ms=0,
        next_slot_ms=next_slot,
        buffered_slot_ms=buffered,
        last_running=running,
        now_ms=now,
    )


def test_a_due_slot_starts_and_the_next_one_is_waited_for() -> None:
    decided = make_plan()
    assert decided.starts == [T0] and decided.next_slot_ms == T0 + MINUTE
    nothing = make_plan(now=T0 - 1)
    assert nothing.starts == [] and not nothing.changes(T0, None)


def test_slots_missed_beyond_the_catchup_window_are_skipped_and_counted() -> None:
    # Down for 10 minutes with a 3-minute window: 7 missed, the last 3 in time.
    decided = make_plan("allow_all", now=T0 + 9 * MINUTE + 500, catchup=3 * MINUTE)
    assert decided.missed == 7
    assert decided.starts == [T0 + 7 * MINUTE, T0 + 8 * MINUTE, T0 + 9 * MINUTE]
    assert decided.next_slot_ms == T0 + 10 * MINUTE


def test_a_long_outage_of_an_interval_is_counted_at_once() -> None:
    every_second = SlotRule(None, 1000)
    decided = make_plan(rule=every_second, now=T0 + 365 * 24 * HOUR, catchup=10_000)
    assert decided.missed == 365 * 24 * 3600 - 10
    assert len(decided.starts) == 1  # skip: the first in-time slot; the rest overlap


def test_a_long_outage_of_a_cron_schedule_is_worked_off_in_bounded_plans() -> None:
    cron = SlotRule("* * * * *", None)
    decided = make_plan(rule=cron, now=T0 + 30 * 24 * HOUR, catchup=MINUTE)
    assert decided.missed == 1000 and decided.starts == []
    assert decided.next_slot_ms == T0 + 1000 * MINUTE  # the rest in the next plans


def test_skip_drops_slots_while_the_last_run_runs() -> None:
    decided = make_plan("skip", running=True)
    assert decided.starts == [] and decided.overlap_skipped == 1
    # Three slots in time after an outage: the oldest starts, the others overlap it.
    caught_up = make_plan("skip", now=T0 + 2 * MINUTE + 1, catchup=3 * MINUTE)
    assert caught_up.starts == [T0] and caught_up.overlap_skipped == 2


def test_buffer_one_keeps_one_slot_until_the_last_run_closes() -> None:
    held = make_plan("buffer_one", running=True, now=T0 + MINUTE + 1)
    assert held.starts == [] and held.buffered_slot_ms == T0 and held.overlap_skipped == 1
    released = make_plan("buffer_one", next_slot=T0 + 2 * MINUTE, buffered=T0, now=T0 + MINUTE + 10)
    assert released.starts == [T0] and released.buffered_slot_ms is None
    still = make_plan("buffer_one", next_slot=T0 + 2 * MINUTE, buffered=T0, running=True)
    assert not still.changes(T0 + 2 * MINUTE, T0)


def test_allow_all_starts_every_slot() -> None:
    decided = make_plan("allow_all", running=True, now=T0 + MINUTE + 1)
    assert decided.starts == [T0, T0 + MINUTE]


def test_cancel_other_cancels_the_last_run_and_starts_the_newest_slot_after_it() -> None:
    decided = make_plan("cancel_other", running=True, now=T0 + MINUTE + 1)
    assert decided.cancel_last and decided.starts == []
    assert decided.buffered_slot_ms == T0 + MINUTE and decided.overlap_skipped == 1
    after = make_plan(
        "cancel_other", next_slot=T0 + 2 * MINUTE, buffered=T0 + MINUTE, now=T0 + MINUTE + 50
    )
    assert after.starts == [T0 + MINUTE] and not after.cancel_last
    idle = make_plan("cancel_other")
    assert idle.starts == [T0] and not idle.cancel_last


def test_a_schedule_with_no_slot_left_plans_nothing() -> None:
    decided = make_plan(next_slot=None)
    assert not decided.changes(None, None)
