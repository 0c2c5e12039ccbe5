"""``runselvedge queues``: list the activity queues, pause or unpause one.

``list`` prints one JSON object per queue (``name``, ``paused``, ``queued``,
``running``, ``oldest_queued_age_s``); ``pause NAME`` and ``unpause NAME`` print one
line saying what changed. The default queue's name is the empty string (``''``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .arguments import Subparsers, add_common_options

__all__ = ["add_parser", "handle"]


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``queues`` and its actions to ``runselvedge``'s subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help="list activity queues, pause or unpause one (for every worker)"
    )
    actions = parser.add_subparsers(
        dest="queue_action", required=True, help="what to do with activity queues"
    )
    actions.add_parser("list", help="one JSON object per queue")
    for action, text in (
        ("pause", "no worker claims its tasks until unpause; they stay queued"),
        ("unpause", "let workers claim its tasks again"),
    ):
        actions.add_parser(action, help=text).add_argument(
            "name", help="the queue's name ('' for the default queue)"
        )
    for action_parser in actions.choices.values():
        add_common_options(action_parser)
    return parser


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run one ``queues`` action, printing to ``command.stdout``."""
    from .. import operations

    action = options["queue_action"]
    out = command.stdout
    if action == "list":
        for queue in operations.list_queues():
            out.write(json.dumps(queue.to_json(), sort_keys=True))
        return
    name = options["name"]
    try:
        if action == "pause":
            changed = operations.pause_queue(name)
            out.write(f"paused queue {name!r}" if changed else f"queue {name!r} was paused")
        else:
            changed = operations.unpause_queue(name)
            out.write(f"unpaused queue {name!r}" if changed else f"queue {name!r} was not paused")
    except ValueError as error:
        raise CommandError(str(error)) from error
