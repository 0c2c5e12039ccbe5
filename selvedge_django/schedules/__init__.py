"""Schedules: what a schedule is and when its runs are due.

* :mod:`~selvedge_django.schedules.definitions`: the definitions (validation,
  descriptions, the sync of ``SELVEDGE["SCHEDULES"]``) over the schedule store.
* :mod:`~selvedge_django.schedules.slots`: the rules of slots, DST, jitter, run ids
  and the firing plan; pure Python, below the store, which plans with them.

The client calls (create, change, pause, trigger, backfill, describe, list) are in
:mod:`selvedge_django.operations.schedules`. The names of the definitions are loaded
on first use: they import the store, and the store imports the slots through this
package, so importing them here would make a cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .slots import (
    OVERLAP_POLICIES,
    Plan,
    SlotRule,
    check_cron,
    check_timezone,
    is_wildcard,
    iso_ms,
    jitter_offset_ms,
    plan,
    slot_id,
    trigger_id,
)

if TYPE_CHECKING:
    from .definitions import (
        MAX_BACKFILL_SLOTS,
        ScheduleDescription,
        check_name,
        code_schedules,
        definition,
        describe_row,
        schedule_store,
        sync_code_schedules,
    )

__all__ = [
    "MAX_BACKFILL_SLOTS",
    "OVERLAP_POLICIES",
    "Plan",
    "ScheduleDescription",
    "SlotRule",
    "check_cron",
    "check_name",
    "check_timezone",
    "code_schedules",
    "definition",
    "describe_row",
    "is_wildcard",
    "iso_ms",
    "jitter_offset_ms",
    "plan",
    "schedule_store",
    "slot_id",
    "sync_code_schedules",
    "trigger_id",
]

_LAZY = {
    "MAX_BACKFILL_SLOTS": "selvedge_django.schedules.definitions",
    "ScheduleDescription": "selvedge_django.schedules.definitions",
    "check_name": "selvedge_django.schedules.definitions",
    "code_schedules": "selvedge_django.schedules.definitions",
    "definition": "selvedge_django.schedules.definitions",
    "describe_row": "selvedge_django.schedules.definitions",
    "schedule_store": "selvedge_django.schedules.definitions",
    "sync_code_schedules": "selvedge_django.schedules.definitions",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'selvedge_django.schedules' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
