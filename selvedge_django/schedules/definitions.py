"""Schedules: their definitions, descriptions and the sync of code-defined ones.

A schedule starts a workflow for each of its slots (a five-field cron expression
in an IANA timezone, or a fixed interval); the run of a slot is the instance
``<schedule name>@<slot as ISO 8601 UTC>``, started by the elected leader on the
database clock (see :mod:`selvedge_django.schedules.slots` for the rules and
:mod:`selvedge_django.storage.schedules` for the transactions).

Every function validates its input before anything is written and raises
:class:`~selvedge_django.InvalidSchedule` (nothing written) or
:class:`~selvedge_django.ScheduleNotFound`. Schedules defined in
``SELVEDGE["SCHEDULES"]`` are created or updated when a worker starts
(:func:`sync_code_schedules`). The client calls (create, change, pause, trigger,
backfill, describe, list) are in :mod:`selvedge_django.operations.schedules`,
over the rules here.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings as django_settings

from .. import exceptions as exc
from ..conf import SelvedgeSettings, get_settings
from ..engine.codec import contains_nul
from ..engine.durations import to_seconds
from ..engine.identifiers import name_problem
from ..models import Schedule
from ..registry import WorkflowDefinition
from ..storage.schedules import Schedules, due_ms, rule_of
from .slots import OVERLAP_POLICIES, check_cron, check_timezone, jitter_offset_ms

__all__ = [
    "MAX_BACKFILL_SLOTS",
    "ScheduleDescription",
    "check_name",
    "code_schedules",
    "definition",
    "describe_row",
    "schedule_store",
    "sync_code_schedules",
]

logger = logging.getLogger("selvedge_django.schedules")

InvalidSchedule = exc.InvalidSchedule

# A schedule name: it starts each run id, and is typed in URLs and shells.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}")
MIN_CATCHUP = timedelta(seconds=10)
MAX_CATCHUP = timedelta(days=365)
MAX_INTERVAL = timedelta(days=3650)
MAX_JITTER = timedelta(days=1)
# Most slots one backfill starts (a longer range is backfilled in parts).
MAX_BACKFILL_SLOTS = 1000

# The keyword arguments of create_schedule (and keys of a SCHEDULES entry) besides the
# name; ``workflow`` is required.
FIELDS = (
    "workflow",
    "cron",
    "interval",
    "input",
    "timezone",
    "overlap",
    "catchup_window",
    "paused",
    "start_at",
    "end_at",
    "jitter",
)
# Columns whose change moves the next slot (recomputed from now).
TIMING = ("cron", "interval_ms", "timezone", "start_at", "end_at")
# Columns a definition sets (the rest is the leader's bookkeeping).
DEFINITION = (
    "workflow_name",
    "input",
    "cron",
    "interval_ms",
    "timezone",
    "overlap",
    "catchup_window_ms",
    "jitter_ms",
    "start_at",
    "end_at",
)

_client: tuple[Any, Schedules] | None = None
_client_lock = threading.Lock()


def schedule_store() -> Schedules:
    """The schedule store of the client API, rebuilt whenever the settings change."""
    global _client
    from ..storage import client_codec, store_for

    settings = get_settings()
    with _client_lock:
        if _client is None or _client[0] is not settings:
            store = store_for(settings.database, client_codec(settings), settings).schedules
            _client = (settings, store)
        return _client[1]


# -- descriptions ---------------------------------------------------------------------------


def _at(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True)
class ScheduleDescription:
    """A schedule's definition and state.

    ``next_run_at`` is when the next slot's run starts (its slot plus jitter;
    None while paused or when no slot is left); ``last_run_at`` when the last
    run was started; ``recent_instance_ids`` the latest runs' ids, newest first.
    """

    name: str
    workflow_name: str
    cron: str | None
    interval: timedelta | None
    timezone: str
    overlap: str
    paused: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    recent_instance_ids: list[str]
    input: Any = None
    catchup_window: timedelta = timedelta(seconds=60)
    jitter: timedelta = timedelta(0)
    start_at: datetime | None = None
    end_at: datetime | None = None
    next_slot_at: datetime | None = None
    buffered_slot_at: datetime | None = None
    last_run_id: str = ""
    runs_started: int = 0
    missed_runs: int = 0
    overlap_skipped_runs: int = 0
    source: str = "api"
    last_error: str = ""

    def to_json(self) -> dict[str, Any]:
        def iso(moment: datetime | None) -> str | None:
            return None if moment is None else moment.isoformat()

        return {
            "name": self.name,
            "workflow_name": self.workflow_name,
            "cron": self.cron,
            "interval": None if self.interval is None else self.interval.total_seconds(),
            "timezone": self.timezone,
            "overlap": self.overlap,
            "paused": self.paused,
            "next_run_at": iso(self.next_run_at),
            "last_run_at": iso(self.last_run_at),
            "recent_instance_ids": list(self.recent_instance_ids),
            "input": self.input,
            "catchup_window": self.catchup_window.total_seconds(),
            "jitter": self.jitter.total_seconds(),
            "start_at": iso(self.start_at),
            "end_at": iso(self.end_at),
            "next_slot_at": iso(self.next_slot_at),
            "buffered_slot_at": iso(self.buffered_slot_at),
            "last_run_id": self.last_run_id,
            "runs_started": self.runs_started,
            "missed_runs": self.missed_runs,
            "overlap_skipped_runs": self.overlap_skipped_runs,
            "source": self.source,
            "last_error": self.last_error,
        }


def describe_row(row: Schedule) -> ScheduleDescription:
    """The description of a schedule row (used by the admin and the command too)."""
    return ScheduleDescription(
        name=row.name,
        workflow_name=row.workflow_name,
        cron=row.cron or None,
        interval=None if row.interval_ms is None else timedelta(milliseconds=row.interval_ms),
        timezone=row.timezone,
        overlap=row.overlap,
        paused=row.paused,
        next_run_at=None if row.paused else _at(row.next_due_ms),
        last_run_at=_at(row.last_run_ms),
        recent_instance_ids=[str(i) for i in json.loads(row.recent_runs or "[]")],
        input=_clear_input(row.input),
        catchup_window=timedelta(milliseconds=row.catchup_window_ms),
        jitter=timedelta(milliseconds=row.jitter_ms),
        start_at=row.start_at,
        end_at=row.end_at,
        next_slot_at=None if row.paused else _at(row.next_slot_ms),
        buffered_slot_at=_at(row.buffered_slot_ms),
        last_run_id=row.last_run_id,
        runs_started=row.runs_started,
        missed_runs=row.missed_runs,
        overlap_skipped_runs=row.overlap_skipped_runs,
        source=row.source,
        last_error=row.last_error,
    )


# -- validation -------------------------------------------------------------------------


def check_name(name: object) -> str:
    """Return a valid schedule name or raise InvalidSchedule."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidSchedule(
            "a schedule name is 1 to 200 characters: letters, digits and _ . : -"
            f" (starting with a letter or digit), not {name!r}"[:300]
        )
    return name


def known_name(name: object) -> str:
    """Return ``name`` for a lookup; ScheduleNotFound if no schedule can have it."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise exc.ScheduleNotFound(repr(name)[:250])
    return name


def _duration(value: object, what: str, low: timedelta, high: timedelta) -> timedelta:
    try:
        seconds = to_seconds(value, what, allow_nonpositive=True)
    except (TypeError, ValueError) as error:
        raise InvalidSchedule(str(error)[:300]) from None
    if not low.total_seconds() <= seconds <= high.total_seconds():
        raise InvalidSchedule(f"{what} must be from {low} to {high}, not {value!r}"[:300])
    return timedelta(seconds=seconds)


def check_moment(value: object, what: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidSchedule(f"{what} must be an ISO 8601 date and time, not {value!r}"[:300])
    if not isinstance(value, datetime):
        raise InvalidSchedule(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidSchedule(f"{what} must be timezone-aware (give an offset or a tzinfo)")
    return value.astimezone(UTC)


def _workflow_name(workflow: object) -> str:
    name = workflow.name if isinstance(workflow, WorkflowDefinition) else workflow
    problem = name_problem(name)
    if problem is not None:
        raise InvalidSchedule(f"workflow: {problem}")
    return str(name)


def _input(value: Any) -> Any:
    from ..storage import client_codec

    codec = client_codec(get_settings())
    try:
        text = codec.encode(value, "schedule input")
    except (exc.PayloadTooLarge, exc.PayloadTooDeep) as error:
        raise InvalidSchedule(str(error)[:300]) from error
    except (TypeError, ValueError) as error:
        raise InvalidSchedule(f"schedule input is not JSON-encodable: {error}"[:300]) from error
    if contains_nul(text):
        raise InvalidSchedule("schedule input contains a NUL character (\\u0000)")
    return json.loads(text)


def _clear_input(stored: Any) -> Any:
    """A stored schedule input as code sees it (a payload codec's envelope opened)."""
    from ..storage import client_codec

    return client_codec(get_settings()).open(stored)


def _default_timezone() -> str:
    return str(getattr(django_settings, "TIME_ZONE", None) or "UTC")


def definition(
    workflow: object,
    *,
    cron: object = None,
    interval: object = None,
    input: Any = None,
    timezone: object = None,
    overlap: object = "skip",
    catchup_window: object = 60,
    paused: object = False,
    start_at: object = None,
    end_at: object = None,
    jitter: object = 0,
) -> dict[str, Any]:
    """Validate a schedule's definition; return its columns (``paused`` included).

    Raises InvalidSchedule naming the first problem.
    """
    workflow_name = _workflow_name(workflow)
    if (cron is None) == (interval is None):
        raise InvalidSchedule("give exactly one of cron and interval")
    zone = _default_timezone() if timezone is None else timezone
    check_timezone(zone)
    cron_text = check_cron(cron) if cron is not None else ""
    interval_td = None
    if interval is not None:
        interval_td = _duration(interval, "interval", timedelta(seconds=1), MAX_INTERVAL)
        if interval_td.microseconds:
            raise InvalidSchedule(f"interval must be a whole number of seconds, not {interval!r}")
    if overlap not in OVERLAP_POLICIES:
        raise InvalidSchedule(f"overlap must be one of {list(OVERLAP_POLICIES)}, not {overlap!r}")
    catchup = _duration(catchup_window, "catchup_window", MIN_CATCHUP, MAX_CATCHUP)
    jitter_td = _duration(jitter, "jitter", timedelta(0), MAX_JITTER)
    if interval_td is not None and jitter_td >= interval_td:
        raise InvalidSchedule("jitter must be shorter than the interval")
    if jitter_td > catchup:
        # Else a slot due early after a late one could count as missed.
        raise InvalidSchedule("jitter must not be longer than the catchup_window")
    if not isinstance(paused, bool):
        raise InvalidSchedule(f"paused must be True or False, not {paused!r}")
    start = check_moment(start_at, "start_at")
    end = check_moment(end_at, "end_at")
    if start is not None and end is not None and end < start:
        raise InvalidSchedule("end_at must not be earlier than start_at")
    return {
        "workflow_name": workflow_name,
        "input": _input(input),
        "cron": cron_text,
        "interval_ms": None if interval_td is None else int(interval_td.total_seconds()) * 1000,
        "timezone": str(zone),
        "overlap": str(overlap),
        "catchup_window_ms": round(catchup.total_seconds() * 1000),
        "jitter_ms": round(jitter_td.total_seconds() * 1000),
        "start_at": start,
        "end_at": end,
        "paused": paused,
    }


def arguments_of(row: Schedule) -> dict[str, Any]:
    """A row's definition as the keyword arguments of :func:`definition`."""
    return {
        "workflow": row.workflow_name,
        "cron": row.cron or None,
        "interval": None if row.interval_ms is None else row.interval_ms / 1000,
        "input": row.input,
        "timezone": row.timezone,
        "overlap": row.overlap,
        "catchup_window": row.catchup_window_ms / 1000,
        "paused": row.paused,
        "start_at": row.start_at,
        "end_at": row.end_at,
        "jitter": row.jitter_ms / 1000,
    }


def slot_state(name: str, columns: Mapping[str, Any], now_ms: int) -> dict[str, Any]:
    """The next slot and its due time, counted from ``now_ms``."""
    shape = Schedule(name=name, **{key: columns[key] for key in (*TIMING, "jitter_ms")})
    slot = rule_of(shape).first_from(now_ms)
    return {"next_slot_ms": slot, "next_due_ms": due_ms(shape, slot)}


def _same(key: str, a: Any, b: Any) -> bool:
    """Whether two values of a definition column are the same (JSON compared as JSON)."""
    if key == "input":
        # Compared as code sees them: a payload codec seals the same value differently
        # each time, and a value not yet sealed (or under an older key) is the same value.
        try:
            a, b = _clear_input(a), _clear_input(b)
        except exc.PayloadDecodeError:
            return False
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    return bool(a == b)


def create_row(store: Schedules, name: str, columns: dict[str, Any], *, source: str) -> Schedule:
    def values(now_ms: int) -> dict[str, Any]:
        return {**columns, **slot_state(name, columns, now_ms), "source": source}

    return store.create(values, name)


def column_changes(row: Schedule, columns: dict[str, Any], now_ms: int) -> dict[str, Any] | None:
    """The columns to write to go from ``row`` to the definition ``columns``."""
    changes = {
        key: value for key, value in columns.items() if not _same(key, getattr(row, key), value)
    }
    if not changes:
        return None
    timing = any(key in changes for key in TIMING) or changes.get("paused") is False
    if timing:
        changes.update(slot_state(row.name, columns, now_ms))
    elif "jitter_ms" in changes and row.next_slot_ms is not None:
        offset = jitter_offset_ms(row.name, row.next_slot_ms, columns["jitter_ms"])
        changes["next_due_ms"] = row.next_slot_ms + offset
    return changes


# -- code-defined schedules -----------------------------------------------------------------


def code_schedules(raw: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Validate ``SELVEDGE["SCHEDULES"]``; return each schedule's definition columns.

    Raises InvalidSchedule naming the entry and its problem.
    """
    if raw is None:
        raw = get_settings().schedules
    found: dict[str, dict[str, Any]] = {}
    for name, entry in raw.items():
        try:
            check_name(name)
            if not isinstance(entry, Mapping):
                raise InvalidSchedule("the definition must be a dict")
            unknown = sorted(set(entry) - set(FIELDS))
            if unknown:
                raise InvalidSchedule(f"unknown keys {unknown}; use {list(FIELDS)}")
            if "workflow" not in entry:
                raise InvalidSchedule("'workflow' is required")
            found[name] = definition(**dict(entry))
        except InvalidSchedule as error:
            raise InvalidSchedule(f"SELVEDGE['SCHEDULES'][{name!r}]: {error}"[:400]) from None
    return found


def sync_code_schedules(
    settings: SelvedgeSettings | None = None, *, store: Schedules | None = None
) -> list[str]:
    """Create or update the schedules of ``SELVEDGE["SCHEDULES"]``; return the names written.

    A schedule whose definition already matches is not written. ``paused`` applies
    when a schedule is created: pausing and unpausing belong to operators after
    that. A code-defined schedule no longer in the settings is left alone (another
    service sharing the database may define it) with a warning.
    """
    defined = code_schedules(settings.schedules if settings is not None else None)
    store = store or schedule_store()
    written: list[str] = []
    existing = {row.name: row for row in store.all()}
    for name, columns in defined.items():
        row = existing.get(name)
        if row is None:
            try:
                create_row(store, name, columns, source="settings")
            except exc.ScheduleAlreadyExists:  # another worker created it meanwhile
                continue
            written.append(name)
            continue
        wanted = {key: columns[key] for key in DEFINITION}
        if row.source == "settings" and not _differs(row, wanted):
            continue

        def values(
            current: Schedule, now_ms: int, wanted: dict[str, Any] = wanted
        ) -> dict[str, Any] | None:
            changes = column_changes(current, {**wanted, "paused": current.paused}, now_ms) or {}
            if current.source != "settings":
                changes["source"] = "settings"
            return changes or None

        store.change(name, values)
        written.append(name)
    for name, row in existing.items():
        if row.source == "settings" and name not in defined:
            logger.warning(
                "schedule %s was defined in SELVEDGE['SCHEDULES'] and no longer is; it still"
                " runs (delete it with sv.delete_schedule or runselvedge schedules delete)",
                name,
                extra={"schedule": name},
            )
    return written


def _differs(row: Schedule, wanted: Mapping[str, Any]) -> bool:
    return any(not _same(key, getattr(row, key), value) for key, value in wanted.items())
