"""``runselvedge replay-check`` and ``versions``: what a deploy of new workflow code needs
to know.

``replay-check`` replays running and recently closed instances (or history files)
against the registered workflow code and exits non-zero on any divergence, so a
deploy can stop before new workers take running instances. ``versions`` counts the
running instances per workflow, per code version and per patch, so an old code path
or an old fleet is retired once nothing runs on it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .. import exceptions as exc
from .arguments import Subparsers, parse_duration

__all__ = ["add_parser", "handle"]


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``replay-check`` or ``versions`` (``name``) to ``runselvedge``'s subparsers."""
    parser: argparse.ArgumentParser
    if name == "replay-check":
        parser = subparsers.add_parser(
            name,
            help="replay running and recently closed instances (or history files) against "
            "the registered workflow code; exit non-zero on any divergence",
        )
        parser.add_argument("files", nargs="*", help="selvedge.history/v1 files to check")
        parser.add_argument(
            "--recent",
            type=parse_duration,
            default="7d",
            help="also check instances closed within this duration (default 7d; 0 for none)",
        )
        parser.add_argument("--limit", type=int, default=1000, help="instances per status")
    else:
        parser = subparsers.add_parser(
            name, help="count running instances per workflow, per code version and per patch"
        )
        parser.add_argument("--workflow", default=None, help="only this workflow name")
        parser.add_argument("--json", action="store_true", help="one JSON object per workflow")
    return parser


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run ``replay-check`` or ``versions`` for ``command`` (for its stdout)."""
    if options["subcommand"] == "replay-check":
        _replay_check(command, options)
    else:
        _versions(command, options)


def _replay_check(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    out = command.stdout
    files = []
    for path in options["files"]:
        try:
            with open(path, "rb") as handle:
                files.append((path, handle.read()))
        except OSError as error:
            raise CommandError(f"cannot read {path}: {error}") from error
    checked = diverged = 0
    for label, problem in operations.replay_check(
        files, recent=options["recent"], limit=options["limit"]
    ):
        checked += 1
        if not isinstance(problem, exc.SelvedgeError):
            patches = problem.describe_patches()
            out.write(f"ok {label}" + (f" patches: {patches}" if patches else ""))
            continue
        diverged += 1
        unreadable = isinstance(problem, exc.UnsupportedHistoryFormat)
        out.write(f"{'INVALID' if unreadable else 'DIVERGED'} {label}: {problem}")
        cause = getattr(problem, "divergence", None)
        if cause is not None and cause is not problem:
            out.write(f"    {type(cause).__name__}: {cause}")
    out.write(f"checked {checked}, diverged {diverged}")
    if diverged:
        raise CommandError(f"{diverged} of {checked} histories diverged")


def _versions(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    out = command.stdout
    for entry in operations.running_versions(options["workflow"]):
        if options["json"]:
            out.write(json.dumps(entry.to_json(), sort_keys=True))
            continue
        out.write(f"{entry.workflow_name}: {entry.running} running")
        for version, count in entry.versions.items():
            label = "(none)" if version is None else version
            out.write(f"  code version {label}: {count}")
        for patch_id, count in entry.patches.items():
            out.write(
                f"  patch {patch_id}: {count} with its marker, {entry.running - count} without"
            )
