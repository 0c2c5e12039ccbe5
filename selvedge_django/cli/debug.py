"""``runselvedge debug``: step through an instance's workflow code with its real history.

``runselvedge debug ID [--stop-at KEY]`` (or ``--file history.json`` for an exported
history, which needs no database) replays the registered workflow code read-only
with the recorded values, calling ``breakpoint()`` just before the command at
``KEY`` (a history key, or a command position): pdb stops there in the terminal,
or whatever ``PYTHONBREAKPOINT`` names. Nothing is written. It then prints how the
replay ended as JSON and exits 0; a key the history does not record fails with
exit status 1 before any code runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .arguments import Subparsers, history_position

__all__ = ["add_parser", "handle"]


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``debug`` to ``runselvedge``'s subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help="replay an instance's workflow code with its recorded values (writes nothing), "
        "calling breakpoint() just before the command at --stop-at",
    )
    parser.add_argument(
        "instance_id", nargs="?", default=None, help="the instance (or give --file)"
    )
    parser.add_argument(
        "--file",
        default=None,
        help="an exported selvedge.history/v1 file instead of an instance (no database needed)",
    )
    parser.add_argument(
        "--stop-at",
        type=history_position,
        default=None,
        metavar="KEY",
        help="a history key (as export-history shows it, e.g. '#3:shop.charge_payment') "
        "or a command position (a number)",
    )
    return parser


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run ``debug`` for ``command``; print how the replay ended as JSON."""
    from django.core.serializers.json import DjangoJSONEncoder

    from ..engine.codec import error_to_envelope
    from ..operations.debugging import replay_debug

    instance_id, file = options["instance_id"], options["file"]
    if (instance_id is None) == (file is None):
        raise CommandError("give an instance id or --file, not both")
    source: str | Path = Path(file) if file is not None else instance_id
    result = replay_debug(source, stop_at=options["stop_at"])
    report = {
        "instance_id": result.instance_id,
        "workflow_name": result.workflow_name,
        "stop_at": result.stop_at,
        "stopped": result.stopped,
        "outcome": result.outcome,
        "last_key": result.last_key,
        "output": result.output,
        "error": None
        if result.error is None
        else error_to_envelope(result.error, with_traceback=False),
        "query_handlers": result.query_handlers,
    }
    command.stdout.write(json.dumps(report, indent=2, cls=DjangoJSONEncoder))
