"""When a schedule's runs are due: slots, DST, jitter, run ids and the firing plan.

Pure Python (no Django, no database), so every rule here is tested without
waiting for a clock. Times are Unix milliseconds; slots fall on whole seconds.

* A *slot* is a moment a schedule names: a match of its five-field cron
  expression in its IANA timezone, or ``start_at + k * interval`` (from the Unix
  epoch without ``start_at``). The run of a slot is the instance
  ``<schedule name>@<slot as ISO 8601 UTC>``, so a slot starts at most once.
* DST: cron fields are matched against the local wall clock. A local time that
  does not exist (the hour skipped when clocks go forward) is no slot at all. A
  local time that exists twice (the hour repeated when clocks go back) is a slot
  in both passes for a wildcard expression (minute or hour field starting with
  ``*``, :func:`is_wildcard`), else one slot, at its first occurrence, as in Vixie
  cron. Intervals are absolute and ignore DST.
* :func:`plan` decides what the leader does with one schedule at one moment:
  which slots start, which missed the catch-up window, which the overlap policy
  skips or buffers, and whether the last run is asked to cancel.
"""

from __future__ import annotations

import functools
import hashlib
import re
import zoneinfo
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ..exceptions import InvalidSchedule

__all__ = [
    "OVERLAP_POLICIES",
    "Plan",
    "SlotRule",
    "check_cron",
    "check_timezone",
    "is_wildcard",
    "iso_ms",
    "jitter_offset_ms",
    "plan",
    "slot_id",
    "trigger_id",
]

OVERLAP_POLICIES = ("skip", "buffer_one", "allow_all", "cancel_other")

# A cron candidate is skipped when its local time does not exist (a DST gap) or
# lies before the starting instant (inside a repeated hour); a gap is at most a day
# of minutes, so this bounds the search for the next slot of any valid expression.
MAX_CANDIDATES = 10_000
# Most slots one plan walks through (missed or due); a longer backlog is worked off
# over several plans, each committed, so one call stays bounded.
MAX_SLOTS_PER_PLAN = 1_000

_CRON_CHARS = re.compile(r"[0-9A-Za-z*/,\-#\s]+")


# -- run ids ----------------------------------------------------------------------------


def iso_ms(ms: int, *, millis: bool = False) -> str:
    """Unix milliseconds as ISO 8601 UTC: ``2030-01-01T00:00:00Z`` (``.000Z`` with millis)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    if millis:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def slot_id(name: str, slot_ms: int) -> str:
    """The instance id of a slot's run: ``<name>@<slot as ISO 8601 UTC>``."""
    return f"{name}@{iso_ms(slot_ms)}"


def trigger_id(name: str, at_ms: int) -> str:
    """The instance id of a run triggered at ``at_ms``: like a slot's, with milliseconds.

    A slot's id never has milliseconds, so a triggered run never takes a slot's id.
    """
    return f"{name}@{iso_ms(at_ms, millis=True)}"


def jitter_offset_ms(name: str, slot_ms: int, jitter_ms: int) -> int:
    """How long after its slot a run starts: the same for a slot every time, below ``jitter_ms``."""
    if jitter_ms <= 0:
        return 0
    digest = hashlib.sha256(f"{name}@{slot_ms}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % jitter_ms


# -- validation of the parts ---------------------------------------------------------------


# Names the zoneinfo database of a host may hold that mean different things on
# different hosts: the host's own zone, placeholders, and the copies under posix/
# (the same zones) and right/ (clocks that count leap seconds).
_HOST_DEPENDENT = frozenset({"localtime", "Factory", "posixrules"})
_HOST_DEPENDENT_PREFIXES = ("posix/", "right/")


@functools.cache
def _iana_names() -> frozenset[str]:
    """The IANA time zone names accepted: zoneinfo's list without host-dependent ones."""
    return frozenset(
        name
        for name in zoneinfo.available_timezones()
        if name not in _HOST_DEPENDENT and not name.startswith(_HOST_DEPENDENT_PREFIXES)
    )


def check_timezone(name: object) -> ZoneInfo:
    """Return the IANA timezone ``name``; raise InvalidSchedule for anything else.

    Only names of the IANA time zone database are accepted (``Europe/Paris``,
    ``UTC``, ``US/Eastern``): not ``localtime``, ``Factory``, ``posixrules`` or
    the ``posix/`` and ``right/`` copies, which depend on the host that reads them,
    so that every leader computes the same slots.
    """
    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise InvalidSchedule(f"timezone must be an IANA name such as 'Europe/Paris', not {name!r}")
    if name in _HOST_DEPENDENT or name.startswith(_HOST_DEPENDENT_PREFIXES):
        raise InvalidSchedule(
            f"timezone {name!r} depends on the host; use an IANA name such as 'Europe/Paris'"[:300]
        )
    if name not in _iana_names():
        raise InvalidSchedule(
            f"unknown timezone {name!r} (use an IANA name such as 'Europe/Paris')"[:300]
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(
            f"unknown timezone {name!r} (use an IANA name such as 'Europe/Paris')"[:300]
        ) from None


def check_cron(expression: object) -> str:
    """Return a five-field cron expression, normalised; raise InvalidSchedule otherwise."""
    if not isinstance(expression, str) or not 1 <= len(expression) <= 255:
        raise InvalidSchedule(f"cron must be a five-field expression, not {expression!r}"[:300])
    if not _CRON_CHARS.fullmatch(expression):
        raise InvalidSchedule(f"cron {expression!r} contains characters cron does not use"[:300])
    fields = expression.split()
    if len(fields) != 5:
        raise InvalidSchedule(
            f"cron must have five fields (minute hour day-of-month month day-of-week),"
            f" not {len(fields)}: {expression!r}"[:300]
        )
    normalised = " ".join(fields)
    try:
        CronSim(normalised, datetime(2000, 1, 1))
    except (CronSimError, ValueError, IndexError) as error:
        raise InvalidSchedule(f"invalid cron {expression!r}: {error}"[:300]) from None
    return normalised


# -- slots ------------------------------------------------------------------------------


def is_wildcard(cron: str) -> bool:
    """Whether a cron expression runs in both passes of a repeated hour.

    Vixie cron's rule (and cronie's): an expression whose minute or hour field
    starts with ``*`` (``*``, ``*/15``) is a wildcard job and runs at each matching
    wall time, in the first pass and again in the second; any other expression
    names fixed times, and a fixed time runs once, at its first occurrence.
    """
    minute, hour = cron.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def _offset(moment: datetime) -> timedelta:
    return moment.utcoffset() or timedelta(0)


def _instant(wall: datetime, zone: ZoneInfo, fold: int) -> int | None:
    """Unix ms of the local time ``wall`` (pass ``fold`` of a repeated time).

    None when ``wall`` does not exist (a DST gap). Outside a repeated time both
    folds give the same instant.
    """
    utc = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
    back = utc.astimezone(zone)
    if back.replace(tzinfo=None) != wall or back.fold != fold:
        return None
    return int(utc.timestamp()) * 1000


@dataclass(frozen=True)
class SlotRule:
    """The slots of one schedule: cron in ``timezone``, or every ``interval_ms``.

    ``start_ms`` and ``end_ms`` bound them (both inclusive); an interval is counted
    from ``start_ms`` (else from the Unix epoch).
    """

    cron: str | None
    interval_ms: int | None
    timezone: str = "UTC"
    start_ms: int | None = None
    end_ms: int | None = None

    def next_after(self, after_ms: int) -> int | None:
        """The first slot strictly after ``after_ms``; None when there is none."""
        if self.start_ms is not None and after_ms < self.start_ms:
            after_ms = self.start_ms - 1
        if self.interval_ms is not None:
            anchor = self.start_ms if self.start_ms is not None else 0
            if after_ms < anchor:
                slot = anchor
            else:
                slot = anchor + ((after_ms - anchor) // self.interval_ms + 1) * self.interval_ms
        else:
            found = self._next_cron(after_ms)
            if found is None:
                return None
            slot = found
        if self.end_ms is not None and slot > self.end_ms:
            return None
        return slot

    def first_from(self, at_ms: int) -> int | None:
        """The first slot at or after ``at_ms``."""
        return self.next_after(at_ms - 1)

    def _next_cron(self, after_ms: int) -> int | None:
        assert self.cron is not None
        zone = check_timezone(self.timezone)  # a stored row may predate the check
        both_passes = is_wildcard(self.cron)
        after = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(zone)
        # Matched against the local wall clock, without the library's own DST rules:
        # a naive datetime is plain calendar arithmetic.
        local = after.replace(tzinfo=None)
        if both_passes and after.fold == 0:
            # Inside the first pass of a repeated hour, the second pass's slots have
            # earlier wall times than ``after``: search from as far back as it repeats.
            back = _offset(after) - _offset(after.replace(fold=1))
            if back > timedelta(0):
                local -= back
        candidates = CronSim(self.cron, local)
        second: int | None = None  # the first second-pass slot after ``after_ms`` seen
        for _ in range(MAX_CANDIDATES):
            try:
                wall = next(candidates)
            except StopIteration:  # no match within 50 years
                return second
            first = _instant(wall, zone, 0)
            if first is None:
                continue  # skipped by a DST gap: this local time does not exist
            if first > after_ms:
                # First passes are in order, and a second pass lies after its first.
                return first if second is None else min(first, second)
            if both_passes and second is None:
                repeat = _instant(wall, zone, 1)
                if repeat is not None and repeat > after_ms:
                    second = repeat  # second passes are in order too
        return second

    def between(self, start_ms: int, end_ms: int, limit: int) -> list[int]:
        """The slots in ``[start_ms, end_ms)``; InvalidSchedule if more than ``limit``."""
        slots: list[int] = []
        slot = self.first_from(start_ms)
        while slot is not None and slot < end_ms:
            if len(slots) == limit:
                raise InvalidSchedule(
                    f"the range holds more than {limit} slots; backfill it in parts"
                )
            slots.append(slot)
            slot = self.next_after(slot)
        return slots

    def count_before(self, slot: int, before_ms: int, cap: int) -> tuple[int, int | None]:
        """Count the slots from ``slot`` on that lie before ``before_ms`` (at most ``cap``).

        Returns the count and the first slot not counted (None: no more slots).
        """
        if slot >= before_ms:
            return 0, slot
        if self.interval_ms is not None:
            count = (before_ms - 1 - slot) // self.interval_ms + 1
            if self.end_ms is not None:
                count = min(count, (self.end_ms - slot) // self.interval_ms + 1)
            following = self.next_after(slot + (count - 1) * self.interval_ms)
            return count, following
        count = 0
        current: int | None = slot
        while current is not None and current < before_ms and count < cap:
            count += 1
            current = self.next_after(current)
        return count, current


# -- the plan ---------------------------------------------------------------------------


@dataclass
class Plan:
    """What to do with one schedule now, and its bookkeeping afterwards."""

    starts: list[int] = field(default_factory=list)  # slots whose runs start, in order
    cancel_last: bool = False  # ask the last run to cancel (cancel_other)
    next_slot_ms: int | None = None
    buffered_slot_ms: int | None = None
    missed: int = 0  # slots older than the catch-up window: skipped
    overlap_skipped: int = 0  # slots the overlap policy skipped

    def changes(self, next_slot_ms: int | None, buffered_slot_ms: int | None) -> bool:
        """Whether the plan does anything compared with the state it started from."""
        return bool(
            self.starts
            or self.cancel_last
            or self.missed
            or self.overlap_skipped
            or self.next_slot_ms != next_slot_ms
            or self.buffered_slot_ms != buffered_slot_ms
        )


def plan(
    *,
    name: str,
    rule: SlotRule,
    overlap: str,
    catchup_ms: int,
    jitter_ms: int,
    next_slot_ms: int | None,
    buffered_slot_ms: int | None,
    last_running: bool,
    now_ms: int,
    max_slots: int = MAX_SLOTS_PER_PLAN,
) -> Plan:
    """Decide what one schedule does at ``now_ms`` (see the module docstring).

    A slot is due once ``slot + jitter offset`` has passed; it is *missed* (skipped
    and counted) when it became due more than ``catchup_ms`` ago. Of the slots due
    in time, the overlap policy decides while the last run (``last_running``) or a
    run started by this plan is still running: ``skip`` drops them, ``buffer_one``
    keeps the first one until the run closes and drops the rest, ``allow_all``
    starts them all, ``cancel_other`` asks the last run to cancel and keeps only
    the newest slot, to start once that run has closed.
    """

    def due(slot: int) -> int:
        return slot + jitter_offset_ms(name, slot, jitter_ms)

    result = Plan(next_slot_ms=next_slot_ms, buffered_slot_ms=buffered_slot_ms)
    running = last_running
    buffered = buffered_slot_ms
    slot = next_slot_ms
    walked = 0
    # Slots surely outside the window (even with the largest jitter) are counted in bulk.
    if slot is not None:
        horizon = now_ms - catchup_ms - jitter_ms
        counted, slot = rule.count_before(slot, horizon, max_slots)
        result.missed += counted
        if rule.interval_ms is None:
            walked += counted  # walked one by one (an interval's are counted at once)
    in_time: list[int] = []
    while slot is not None and due(slot) <= now_ms and walked < max_slots:
        if now_ms - due(slot) > catchup_ms:
            result.missed += 1
        else:
            in_time.append(slot)
        walked += 1
        slot = rule.next_after(slot)
    result.next_slot_ms = slot

    if overlap == "cancel_other":
        if in_time:
            newest = in_time[-1]
            result.overlap_skipped += len(in_time) - 1 + (buffered is not None)
            buffered = None
            if last_running:
                result.cancel_last = True
                buffered = newest
            else:
                result.starts.append(newest)
        elif buffered is not None and not last_running:
            result.starts.append(buffered)
            buffered = None
        result.buffered_slot_ms = buffered
        return result

    if buffered is not None:
        if not running or overlap == "allow_all":
            result.starts.append(buffered)
            buffered = None
            running = True
        elif overlap == "skip":  # left over from another policy
            result.overlap_skipped += 1
            buffered = None
    for slot_ms in in_time:
        if not running or overlap == "allow_all":
            result.starts.append(slot_ms)
            running = True
        elif overlap == "buffer_one" and buffered is None:
            buffered = slot_ms
        else:
            result.overlap_skipped += 1
    result.buffered_slot_ms = buffered
    return result
