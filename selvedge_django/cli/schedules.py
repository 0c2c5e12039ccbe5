"""``runselvedge schedules``: list, describe, pause, unpause, trigger, backfill, delete.

Each handler parses its arguments (validators are argparse types), makes one
call to the operations layer and prints: ``list`` one JSON object per line,
``describe`` indented JSON, the others one line per action.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .arguments import Subparsers, add_common_options

__all__ = ["add_parser", "handle"]


def moment(text: str) -> datetime:
    """An ISO 8601 date and time with an offset (``2030-01-01T00:00:00Z``)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 date and time (e.g. 2030-01-01T00:00:00Z)"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no offset: add Z or +01:00")
    return value


SCHEDULE_NAME = "the schedule's name"


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``schedules`` and its actions to ``runselvedge``'s subparsers.

    Each action's parser gets Django's common options too, so that they work after
    an action's own arguments as well.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help="list, describe, pause, unpause, trigger or backfill schedules"
    )
    actions = parser.add_subparsers(
        dest="schedule_action", required=True, help="what to do with schedules"
    )
    actions.add_parser("list", help="one JSON object per schedule")
    for name, text in (
        ("describe", "print a schedule as JSON"),
        ("pause", "stop starting its runs"),
        ("unpause", "start its runs again, from the next slot"),
        ("trigger", "start one run now"),
        ("delete", "delete it (its runs stay)"),
    ):
        actions.add_parser(name, help=text).add_argument("name", help=SCHEDULE_NAME)
    backfill = actions.add_parser(
        "backfill", help="start the runs of its slots in [START, END) that never started"
    )
    backfill.add_argument("name", help=SCHEDULE_NAME)
    backfill.add_argument("start", type=moment, help="ISO 8601 with an offset")
    backfill.add_argument("end", type=moment, help="ISO 8601 with an offset")
    for action in actions.choices.values():
        add_common_options(action)
    return parser


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run one ``schedules`` action for ``command`` (the BaseCommand, for its stdout)."""
    from .. import operations

    action = options["schedule_action"]
    out = command.stdout
    if action == "list":
        for described in operations.list_schedules():
            out.write(json.dumps(described.to_json(), sort_keys=True))
        return
    name = options["name"]
    if action == "describe":
        out.write(json.dumps(operations.describe_schedule(name).to_json(), indent=2))
    elif action == "pause":
        operations.pause_schedule(name)
        out.write(f"paused {name}")
    elif action == "unpause":
        operations.unpause_schedule(name)
        out.write(f"unpaused {name}")
    elif action == "trigger":
        out.write(f"started {operations.trigger_schedule(name)}")
    elif action == "delete":
        operations.delete_schedule(name)
        out.write(f"deleted {name}")
    elif action == "backfill":
        ids = operations.backfill_schedule(name, options["start"], options["end"])
        for run_id in ids:
            out.write(run_id)
        out.write(f"backfill of {name}: {len(ids)} slots, each started once")
    else:  # pragma: no cover - argparse allows only the actions above
        raise CommandError(f"unknown schedules action {action!r}")
