"""``runselvedge prune``: delete closed instances older than a duration.

The instances go in batches, each in its own transaction, with a line of progress
after each batch; the operations layer checks the arguments again (``prune()``).
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from .arguments import Subparsers, parse_duration, prune_batch_size

__all__ = ["add_parser", "handle"]


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``prune`` to ``runselvedge``'s subparsers."""
    prune: argparse.ArgumentParser = subparsers.add_parser(
        name, help="delete closed instances older than a duration"
    )
    prune.add_argument(
        "--older-than", type=parse_duration, required=True, help="e.g. 30d, 12h, 90m, 3600"
    )
    prune.add_argument(
        "--status",
        action="append",
        choices=["completed", "failed", "cancelled"],
        help="only instances in this status; repeat for several (default all three)",
    )
    prune.add_argument("--workflow", default=None, help="only this workflow (exact name)")
    prune.add_argument(
        "--batch-size",
        type=prune_batch_size,
        default=500,
        help="instances deleted per transaction (500)",
    )
    return prune


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Delete the selected closed instances, printing the count after each batch."""
    from .. import operations

    def progress(total: int) -> None:
        command.stdout.write(f"deleted {total} so far")

    total = operations.prune(
        options["older_than"],
        statuses=options["status"],
        workflow_name=options["workflow"],
        batch_size=options["batch_size"],
        progress=progress,
    )
    command.stdout.write(f"pruned {total} instances")
