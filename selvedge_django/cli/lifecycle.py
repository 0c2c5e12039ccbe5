"""``runselvedge resume``, ``fork``, ``terminate``, ``pause`` and ``unpause``: one instance,
or many.

Each takes an instance id, or a selection (``--status``, ``--workflow NAME``,
``--since 1h``, ``--attr tenant=acme``) to act on every instance it finds, in bounded batches, each
instance in its own transaction; ``--dry-run`` prints what would be done. One
line per action. A selection resumes only failed runs (terminated ones left
alone) unless ``--include-closed`` is given, as the admin's bulk resume does.
Repeating a bulk resume is harmless: what it resumed is no longer failed, so the
second run finds nothing; likewise a bulk pause selects running instances not
paused yet, and a bulk unpause paused ones.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .. import exceptions as exc
from .arguments import Subparsers, add_attr_option, attribute_filters, parse_duration

__all__ = ["add_parser", "handle"]

# The status each operation selects by default.
_DEFAULT_STATUS = {
    "resume": "failed",
    "fork": "failed",
    "terminate": "running",
    "pause": "running",
    "unpause": "running",
}
# The statuses a bulk resume leaves alone unless given --include-closed.
_CLOSED_STATUSES = ("completed", "cancelled")


_HELPS = {
    "resume": "run closed instances again in place, archiving from the failure (or --from)",
    "fork": "start new instances from a copy of others' history before the failure",
    "terminate": "close running instances at once as failed, without running their code",
    "pause": "hold running instances: nothing of them runs until unpause",
    "unpause": "let paused instances run again",
}


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``resume``, ``fork`` or ``terminate`` (``name``) to ``runselvedge``'s subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=_HELPS[name])
    parser.add_argument(
        "instance_id",
        nargs="?",
        default=None,
        help="the instance (or select several with --status, --workflow, --since, --attr)",
    )
    if name in ("resume", "fork"):
        parser.add_argument("--from", dest="from_key", default=None, help="history key")
    if name == "fork":
        parser.add_argument("--id", dest="new_id", default=None, help="the new instance id")
    if name in ("resume", "terminate", "pause"):
        parser.add_argument("--reason", default="", help="recorded with the action")
    if name == "resume":
        parser.add_argument(
            "--include-closed",
            action="store_true",
            help="a selection resumes only failed runs (not terminated ones) unless this is"
            " given: then also terminated, completed and cancelled runs (--status)",
        )
    parser.add_argument(
        "--status",
        default=None,
        help=f"act on every instance in this status (default {_DEFAULT_STATUS[name]}"
        " with --workflow or --since)",
    )
    parser.add_argument("--workflow", default=None, help="only this workflow (exact name)")
    parser.add_argument(
        "--since", default=None, help="only those closed (running: started) within, e.g. 1h"
    )
    add_attr_option(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be done, change nothing"
    )
    return parser


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run ``options["subcommand"]`` on the instance given, or on every selected one."""
    from ..operations import recovery as lifecycle

    name = options["subcommand"]

    many = any(options.get(flag) is not None for flag in ("status", "workflow", "since", "attr"))
    if many == (options["instance_id"] is not None):
        raise CommandError("give an instance id, or --status/--workflow/--since/--attr (not both)")
    if many and (options.get("from_key") or options.get("new_id")):
        raise CommandError("--from and --id apply to one instance")
    include_closed = bool(options.get("include_closed"))
    if include_closed and not many:
        raise CommandError("--include-closed applies to a selection")
    if not many:
        _act(command, name, options["instance_id"], options, strict=True)
        return
    since = parse_duration(options["since"]) if options["since"] else None
    status = options["status"] or _DEFAULT_STATUS[name]
    # A bulk resume resumes failed runs only, unless told to include the others.
    only_failed = name == "resume" and not include_closed
    if only_failed and status != "failed" and status in _CLOSED_STATUSES:
        raise CommandError(
            f"a bulk resume resumes only failed runs: add --include-closed to resume {status} ones"
        )
    if name in ("pause", "unpause") and status != "running":
        raise CommandError(f"only running instances {name}: --status running")
    done = 0
    try:
        batches = lifecycle.select_instances(
            status=status,
            workflow_name=options["workflow"],
            since=since,
            exclude_terminated=only_failed,
            attributes=attribute_filters(options.get("attr")),
            # A bulk pause takes those not paused yet, a bulk unpause the paused ones.
            paused={"pause": False, "unpause": True}.get(name),
        )
        for batch in batches:
            for instance_id in batch:
                done += _act(
                    command, name, instance_id, options, strict=False, only_failed=only_failed
                )
    except ValueError as error:
        raise CommandError(str(error)) from error
    verb = "would act on" if options["dry_run"] else "acted on"
    command.stdout.write(f"{name}: {verb} {done} instance(s)")


def _act(
    command: BaseCommand,
    name: str,
    instance_id: str,
    options: dict[str, Any],
    *,
    strict: bool,
    only_failed: bool = False,
) -> int:
    """One operation on one instance; 1 when done. In a bulk run (``strict`` False), an
    instance another operator changed meanwhile is reported and skipped."""
    from .. import operations
    from ..operations import recovery as lifecycle

    if options["dry_run"]:
        command.stdout.write(f"would {name} {instance_id}")
        return 1
    try:
        if name == "resume":
            generation = lifecycle.resume_workflow(
                instance_id,
                from_key=options["from_key"],
                reason=options["reason"],
                only_failed=only_failed,
            )
            command.stdout.write(f"resumed {instance_id} (generation {generation})")
        elif name == "fork":
            new_id = lifecycle.fork_workflow(
                instance_id, from_key=options["from_key"], new_instance_id=options["new_id"]
            )
            command.stdout.write(f"forked {instance_id} as {new_id}")
        elif name == "pause":
            operations.pause_workflow(instance_id, options["reason"])
            command.stdout.write(f"paused {instance_id}")
        elif name == "unpause":
            operations.unpause_workflow(instance_id)
            command.stdout.write(f"unpaused {instance_id}")
        else:
            operations.terminate_workflow(instance_id, options["reason"])
            command.stdout.write(f"terminated {instance_id}")
    except (exc.InvalidWorkflowState, exc.InstanceClosed) as error:
        if strict:
            raise
        command.stdout.write(f"skipped {instance_id}: {error}")
        return 0
    except ValueError as error:
        raise CommandError(str(error)) from error
    return 1
