"""``runselvedge start``, ``cancel`` and ``signal``, and the reads of instances:
``list``, ``tasks``, ``query``, ``describe``, ``result`` and ``export-history``.

Each handler makes one call to the operations layer and prints: one line per
action, ``list`` one JSON object per line, the other reads indented JSON.

``start`` refuses a name this process does not register unless
``--allow-unregistered``, and a built-in workflow unless ``--allow-builtin``
(``selvedge.prune`` deletes closed instances: whoever runs the command has a shell,
so the flag guards against a slip); ``selvedge.task`` always (django.tasks enqueues
its tasks).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .. import exceptions as exc
from .arguments import (
    Subparsers,
    add_attr_option,
    attribute_filters,
    history_position,
    json_argument,
    parse_duration,
    positive_int,
)

__all__ = ["add_parser", "check_start", "handle"]

INSTANCE_ID = "the workflow instance id"


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` (one of this module's) to ``runselvedge``'s subparsers."""
    return _PARSERS[name](subparsers)


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run the subcommand ``options["subcommand"]`` for ``command`` (for its stdout)."""
    _HANDLERS[options["subcommand"]](command, options)


def check_start(name: str, options: dict[str, Any]) -> None:
    """Raise CommandError if ``runselvedge start`` may not start ``name`` with ``options``."""
    from ..registry import get_workflow, is_builtin_workflow
    from ..tasks.names import TASK_WORKFLOW

    if name == TASK_WORKFLOW:
        raise CommandError(
            f"{name!r} is a built-in workflow that runs django.tasks tasks; "
            "enqueue the task through django.tasks instead"
        )
    if is_builtin_workflow(name) and not options.get("allow_builtin"):
        raise CommandError(
            f"{name!r} is a built-in workflow (selvedge.prune deletes closed instances); "
            "pass --allow-builtin to start it on purpose"
        )
    if get_workflow(name) is None and not options.get("allow_unregistered"):
        raise CommandError(
            f"workflow {name!r} is not registered in this process (a typo?); pass "
            "--allow-unregistered to start it for workers of another service"
        )


# -- start, cancel, signal ------------------------------------------------------------------


def _add_start(subparsers: Subparsers) -> argparse.ArgumentParser:
    start: argparse.ArgumentParser = subparsers.add_parser("start", help="start a workflow by name")
    start.add_argument("name", help="the registered workflow name")
    start.add_argument(
        "input", nargs="?", type=json_argument("input"), default=None, help="JSON input"
    )
    start.add_argument(
        "--id", dest="instance_id", default=None, help="the instance id (default random)"
    )
    start.add_argument(
        "--execution-timeout",
        type=parse_duration,
        default=None,
        help="terminate the run if it is still running after this long, e.g. 30m or 2h",
    )
    start.add_argument(
        "--if-exists",
        choices=["fail", "return"],
        default="fail",
        help="taken --id: fail or exit 0",
    )
    start.add_argument(
        "--priority",
        type=int,
        default=0,
        help="dispatch priority, -100 to 100, larger first (default 0)",
    )
    start.add_argument(
        "--allow-unregistered",
        action="store_true",
        help="start a workflow this process does not register (another service runs it)",
    )
    start.add_argument(
        "--allow-builtin",
        action="store_true",
        help="start a built-in workflow such as selvedge.prune (never selvedge.task)",
    )
    return start


def _start(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    name = options["name"]
    check_start(name, options)
    start = functools.partial(
        operations.start_workflow,
        name,
        options["input"],
        instance_id=options["instance_id"],
        execution_timeout=options.get("execution_timeout"),
        priority=options.get("priority", 0),
    )
    try:
        instance_id = start()
    except exc.WorkflowAlreadyStarted:
        if options.get("if_exists", "fail") != "return":
            raise
        # The key decided; this start only tells "exists" from "another workflow's".
        instance_id = start(if_exists="return")
        command.stdout.write(f"exists {instance_id}")
        return
    command.stdout.write(f"started {instance_id}")


def _add_cancel(subparsers: Subparsers) -> argparse.ArgumentParser:
    cancel: argparse.ArgumentParser = subparsers.add_parser(
        "cancel", help="request cancellation of an instance"
    )
    cancel.add_argument("instance_id", help=INSTANCE_ID)
    cancel.add_argument("--reason", default="", help="recorded with the cancellation")
    return cancel


def _cancel(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    operations.cancel_workflow(options["instance_id"], options["reason"])
    command.stdout.write(f"cancel requested for {options['instance_id']}")


def _add_signal(subparsers: Subparsers) -> argparse.ArgumentParser:
    sig: argparse.ArgumentParser = subparsers.add_parser(
        "signal", help="send a signal with a JSON payload"
    )
    sig.add_argument("instance_id", help=INSTANCE_ID)
    sig.add_argument("channel", help="the channel the workflow receives on")
    sig.add_argument(
        "payload", nargs="?", type=json_argument("payload"), default="null", help="JSON payload"
    )
    sig.add_argument(
        "--idempotency-key", default=None, help="a repeat with this key writes nothing"
    )
    return sig


def _signal(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    operations.signal(
        options["instance_id"],
        options["channel"],
        options["payload"],
        idempotency_key=options.get("idempotency_key"),
    )
    command.stdout.write(f"signalled {options['instance_id']} on {options['channel']!r}")


# -- list, tasks, query, describe, result, export-history -----------------------------------


def _add_list(subparsers: Subparsers) -> argparse.ArgumentParser:
    listing: argparse.ArgumentParser = subparsers.add_parser(
        "list", help="print instances, newest first, one JSON per line"
    )
    listing.add_argument(
        "--status",
        choices=["running", "completed", "failed", "cancelled"],
        default=None,
        help="only instances in this status",
    )
    listing.add_argument("--workflow", default=None, help="part of a workflow name")
    listing.add_argument(
        "--since", type=parse_duration, default=None, help="started within, e.g. 1h or 7d"
    )
    listing.add_argument(
        "--limit", type=positive_int("--limit"), default=50, help="at most this many (50)"
    )
    add_attr_option(listing)
    return listing


def _list(command: BaseCommand, options: dict[str, Any]) -> None:
    from django.utils import timezone

    from .. import operations

    since = options["since"]
    try:
        for description in operations.iter_instances(
            status=options["status"],
            workflow_name=options["workflow"],
            started_after=None if since is None else timezone.now() - since,
            attributes=attribute_filters(options.get("attr")),
            limit=options["limit"],
        ):
            command.stdout.write(json.dumps(description.to_json()))
    except ValueError as error:
        raise CommandError(str(error)) from error


def _add_tasks(subparsers: Subparsers) -> argparse.ArgumentParser:
    tasks: argparse.ArgumentParser = subparsers.add_parser(
        "tasks", help="print an instance's activity tasks as JSON"
    )
    tasks.add_argument("instance_id", help=INSTANCE_ID)
    return tasks


def _tasks(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    tasks = operations.list_activity_tasks(options["instance_id"])
    command.stdout.write(json.dumps([task.to_json() for task in tasks], indent=2))


def _add_query(subparsers: Subparsers) -> argparse.ArgumentParser:
    query: argparse.ArgumentParser = subparsers.add_parser(
        "query", help="answer a query handler, as JSON"
    )
    query.add_argument("instance_id", help=INSTANCE_ID)
    query.add_argument("name", help="the query handler's name")
    query.add_argument(
        "--at",
        type=history_position,
        default=None,
        metavar="KEY",
        help="answer as of this step: a history key or a command position (a number)",
    )
    return query


def _query(command: BaseCommand, options: dict[str, Any]) -> None:
    from django.core.serializers.json import DjangoJSONEncoder

    from .. import operations

    answer = operations.query(options["instance_id"], options["name"], at=options["at"])
    command.stdout.write(json.dumps(answer, indent=2, cls=DjangoJSONEncoder))


def _add_describe(subparsers: Subparsers) -> argparse.ArgumentParser:
    describe: argparse.ArgumentParser = subparsers.add_parser(
        "describe", help="print an instance's description as JSON"
    )
    describe.add_argument("instance_id", help=INSTANCE_ID)
    return describe


def _describe(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    description = operations.describe(options["instance_id"])
    command.stdout.write(json.dumps(description.to_json(), indent=2))


def _add_result(subparsers: Subparsers) -> argparse.ArgumentParser:
    result: argparse.ArgumentParser = subparsers.add_parser(
        "result", help="print an instance's result as JSON"
    )
    result.add_argument("instance_id", help=INSTANCE_ID)
    return result


def _result(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    result = operations.get_workflow_result(options["instance_id"])
    command.stdout.write(json.dumps(result.to_json(), indent=2))


def _add_export_history(subparsers: Subparsers) -> argparse.ArgumentParser:
    export: argparse.ArgumentParser = subparsers.add_parser(
        "export-history", help="print an instance's history as JSON"
    )
    export.add_argument("instance_id", help=INSTANCE_ID)
    export.add_argument("--output", "-o", default=None, help="write to this file")
    export.add_argument(
        "--redact",
        action="store_true",
        help="replace every recorded value (inputs, outputs, signal payloads) by its size"
        " and a keyed hash",
    )
    return export


def _export_history(command: BaseCommand, options: dict[str, Any]) -> None:
    from .. import operations

    history = operations.export_history(options["instance_id"], redact=options["redact"])
    text = history.to_json(indent=2)
    if options["output"]:
        with open(options["output"], "w", encoding="utf-8") as handle:
            handle.write(text)
        command.stdout.write(f"exported {options['instance_id']} to {options['output']}")
    else:
        command.stdout.write(text)


_PARSERS: dict[str, Callable[[Subparsers], argparse.ArgumentParser]] = {
    "start": _add_start,
    "cancel": _add_cancel,
    "signal": _add_signal,
    "list": _add_list,
    "tasks": _add_tasks,
    "query": _add_query,
    "describe": _add_describe,
    "result": _add_result,
    "export-history": _add_export_history,
}
_HANDLERS: dict[str, Callable[[BaseCommand, dict[str, Any]], None]] = {
    "start": _start,
    "cancel": _cancel,
    "signal": _signal,
    "list": _list,
    "tasks": _tasks,
    "query": _query,
    "describe": _describe,
    "result": _result,
    "export-history": _export_history,
}
