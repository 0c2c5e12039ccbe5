"""Schedule operations: create, change, delete, pause, trigger, backfill, describe, list.

Every call validates its input (:mod:`selvedge_django.schedules` holds the rules)
before anything is written and raises :class:`~selvedge_django.InvalidSchedule`
(nothing written) or :class:`~selvedge_django.ScheduleNotFound`. Runs a call
starts fire their start hooks after commit.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypedDict, Unpack

from asgiref.sync import sync_to_async
from django.db import transaction

from .. import hooks as hooks_module
from .. import signals
from ..conf import get_settings
from ..models import Schedule
from ..registry import WorkflowDefinition
from ..schedules.definitions import (
    DEFINITION,
    FIELDS,
    MAX_BACKFILL_SLOTS,
    InvalidSchedule,
    ScheduleDescription,
    arguments_of,
    check_moment,
    check_name,
    column_changes,
    create_row,
    definition,
    describe_row,
    known_name,
    schedule_store,
    slot_state,
)
from ..storage.schedules import rule_of

__all__ = [
    "ScheduleDescription",
    "ScheduleFields",
    "abackfill_schedule",
    "acreate_schedule",
    "adelete_schedule",
    "adescribe_schedule",
    "alist_schedules",
    "apause_schedule",
    "atrigger_schedule",
    "aunpause_schedule",
    "aupdate_schedule",
    "backfill_schedule",
    "create_schedule",
    "delete_schedule",
    "describe_schedule",
    "list_schedules",
    "pause_schedule",
    "trigger_schedule",
    "unpause_schedule",
    "update_schedule",
]


class ScheduleFields(TypedDict, total=False):
    """The keyword arguments of :func:`create_schedule`; :func:`update_schedule` takes any."""

    workflow: WorkflowDefinition[Any, Any] | str
    cron: str | None
    interval: float | timedelta | None
    input: Any
    timezone: str | None
    overlap: str
    catchup_window: float | timedelta
    paused: bool
    start_at: datetime | None
    end_at: datetime | None
    jitter: float | timedelta


# -- writes -----------------------------------------------------------------------------


def create_schedule(
    name: str,
    workflow: WorkflowDefinition[Any, Any] | str,
    *,
    cron: str | None = None,
    interval: float | timedelta | None = None,
    input: Any = None,
    timezone: str | None = None,
    overlap: str = "skip",
    catchup_window: float | timedelta = 60,
    paused: bool = False,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    jitter: float | timedelta = 0,
) -> ScheduleDescription:
    """Create a schedule that starts ``workflow`` with ``input`` at each of its slots.

    Give exactly one of ``cron`` (five fields, evaluated in ``timezone``, an IANA
    name defaulting to ``settings.TIME_ZONE``) and ``interval`` (a duration of
    whole seconds, counted from ``start_at`` or else from the Unix epoch). Slots
    before ``start_at`` or after ``end_at`` are not run. ``overlap`` is ``skip``,
    ``buffer_one``, ``allow_all`` or ``cancel_other``; slots missed while no
    leader ran start if they are younger than ``catchup_window`` (10 seconds at
    least), the others are skipped and counted. ``jitter`` delays each slot's
    run by a fixed pseudo-random part of it. The first slot is the first one from
    now on. A taken name raises :class:`ScheduleAlreadyExists` (an
    ``InvalidSchedule``).
    """
    name = check_name(name)
    columns = definition(
        workflow,
        cron=cron,
        interval=interval,
        input=input,
        timezone=timezone,
        overlap=overlap,
        catchup_window=catchup_window,
        paused=paused,
        start_at=start_at,
        end_at=end_at,
        jitter=jitter,
    )
    return describe_row(create_row(schedule_store(), name, columns, source="api"))


def update_schedule(name: str, **fields: Unpack[ScheduleFields]) -> ScheduleDescription:
    """Change some of a schedule's fields (the keyword arguments of create_schedule).

    The whole definition is validated again. Giving ``cron`` drops the interval
    and giving ``interval`` drops the cron expression. A change of cron,
    interval, timezone, ``start_at`` or ``end_at`` (or an unpause) counts the next
    slot from now on; the counters and recent runs are kept.
    """
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise InvalidSchedule(f"unknown schedule fields: {unknown}; use {list(FIELDS)}")
    name = known_name(name)

    def values(row: Schedule, now_ms: int) -> dict[str, Any] | None:
        arguments = arguments_of(row)
        if "cron" in fields and fields["cron"] is not None and "interval" not in fields:
            arguments["interval"] = None
        if "interval" in fields and fields["interval"] is not None and "cron" not in fields:
            arguments["cron"] = None
        arguments.update(fields)
        columns = definition(**arguments)
        return column_changes(row, columns, now_ms)

    return describe_row(schedule_store().change(name, values))


def delete_schedule(name: str) -> None:
    """Delete a schedule. Its runs are instances like any other and stay."""
    schedule_store().delete(known_name(name))


def pause_schedule(name: str) -> None:
    """Stop starting runs of a schedule until it is unpaused (idempotent)."""
    _set_paused(name, True)


def unpause_schedule(name: str) -> None:
    """Start a paused schedule's runs again, from the first slot from now on.

    Slots that passed while it was paused are not run (nor counted as missed).
    """
    _set_paused(name, False)


def _set_paused(name: str, paused: bool) -> None:
    name = known_name(name)

    def values(row: Schedule, now_ms: int) -> dict[str, Any] | None:
        if row.paused == paused:
            return None
        if paused:
            return {"paused": True}
        columns = {key: getattr(row, key) for key in DEFINITION}
        return {"paused": False, **slot_state(row.name, columns, now_ms)}

    schedule_store().change(name, values)


def _trace() -> Any:
    """The trace context source of the runs a client call starts (None: no hooks)."""
    hooks = get_settings().hooks
    return None if hooks is None else hooks_module.schedule_trace(hooks)


def _started(runs: list[tuple[str, str]]) -> None:
    """Fire the start hooks of runs a client call started, after commit."""
    if not runs:
        return
    store = schedule_store()
    hooks = get_settings().hooks

    def fire() -> None:
        for run_id, workflow_name in runs:
            hooks_module.fire(
                hooks, "on_workflow_started", instance_id=run_id, workflow_name=workflow_name
            )
            signals.send("on_workflow_started", instance_id=run_id, workflow_name=workflow_name)

    transaction.on_commit(fire, using=store.alias)


def trigger_schedule(name: str) -> str:
    """Start one run of a schedule now, whatever its overlap policy and pause; return its id.

    The id is ``<name>@<now as ISO 8601 UTC with milliseconds>`` (a slot's id has
    none, so a triggered run never takes a slot). It becomes the schedule's last run.
    """
    run_id, workflow_name = schedule_store().trigger(known_name(name), _trace())
    _started([(run_id, workflow_name)])
    return run_id


def backfill_schedule(name: str, start: datetime, end: datetime) -> list[str]:
    """Start the runs of a schedule's slots in ``[start, end)`` that never started.

    Returns the run id of every slot in the range, in order, started now or
    before; calling it again starts nothing new. Slots after now are left to the
    schedule. Overlap policy and pause do not apply; at most
    ``MAX_BACKFILL_SLOTS`` slots per call (InvalidSchedule otherwise).
    """
    name = known_name(name)
    start_at = check_moment(start, "start")
    end_at = check_moment(end, "end")
    if start_at is None or end_at is None:
        raise InvalidSchedule("backfill needs a start and an end")
    if end_at <= start_at:
        raise InvalidSchedule("the end of a backfill must be later than its start")
    start_ms = int(start_at.timestamp() * 1000)
    end_ms = int(end_at.timestamp() * 1000)

    def slots(row: Schedule, now_ms: int) -> list[int]:
        return rule_of(row).between(start_ms, min(end_ms, now_ms + 1), MAX_BACKFILL_SLOTS)

    ids, started, workflow_name = schedule_store().backfill(name, slots, _trace())
    _started([(run_id, workflow_name) for run_id in started])
    return ids


# -- reads ------------------------------------------------------------------------------


def describe_schedule(name: str) -> ScheduleDescription:
    """Return a schedule's definition, next and last run, counters and recent runs."""
    return describe_row(schedule_store().get(known_name(name)))


def list_schedules() -> list[ScheduleDescription]:
    """Return every schedule, by name."""
    return [describe_row(row) for row in schedule_store().all()]


# -- async twins ------------------------------------------------------------------------

acreate_schedule = sync_to_async(create_schedule)
aupdate_schedule = sync_to_async(update_schedule)
adelete_schedule = sync_to_async(delete_schedule)
apause_schedule = sync_to_async(pause_schedule)
aunpause_schedule = sync_to_async(unpause_schedule)
atrigger_schedule = sync_to_async(trigger_schedule)
abackfill_schedule = sync_to_async(backfill_schedule)
adescribe_schedule = sync_to_async(describe_schedule)
alist_schedules = sync_to_async(list_schedules)
