"""``runselvedge rotate-keys``: re-encrypt stored values under the first of PAYLOAD_KEYS.

Bounded batches, each in its own transaction, with a line of progress after each
batch; stopped half-way, every value stays readable, and a second run goes on
where the first stopped.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .arguments import Subparsers, prune_batch_size

__all__ = ["add_parser", "handle"]


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``rotate-keys`` to ``runselvedge``'s subparsers."""
    rotate: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help="re-encrypt stored values under the first key of SELVEDGE['PAYLOAD_KEYS']",
    )
    rotate.add_argument(
        "--batch",
        type=prune_batch_size,
        default=500,
        help="rows read per transaction (500)",
    )
    return rotate


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Rotate, printing the count so far after each batch and the total at the end."""
    from .. import operations
    from ..operations.keys import RotationCounts

    def progress(counts: RotationCounts) -> None:
        if options.get("verbosity", 1) > 1:
            command.stdout.write(f"re-encrypted {counts.changed} so far")

    try:
        counts = operations.rotate_keys(options["batch"], progress)
    except ValueError as error:
        raise CommandError(str(error)) from error
    command.stdout.write(f"re-encrypted {counts.changed} values")
    if counts.undecodable:
        raise CommandError(
            f"{counts.undecodable} values are under a key missing from PAYLOAD_KEYS and"
            " were left as they are"
        )
