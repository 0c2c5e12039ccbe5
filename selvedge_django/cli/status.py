"""``runselvedge status``: the status report as a table for people, or as JSON.

``--json`` prints the report of :func:`selvedge_django.operations.status.status_report`
as one JSON object; without it, sections of aligned columns. The exit status is 0
whenever the database answered (the report's ``warnings`` say what looks wrong),
and 1 (CommandError) when it did not.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from .arguments import Subparsers, parse_duration

__all__ = ["add_parser", "format_report", "handle"]


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``status`` to ``runselvedge``'s subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help="workers, leader, queue depths, backlogs and troubled instances"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--stuck-after",
        type=parse_duration,
        default=None,
        help="how long an unowned runnable instance or an expired lease may wait before it"
        " counts as stuck (default 60s)",
    )
    return parser


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Print the status report."""
    from ..operations.status import STUCK_AFTER, status_report

    stuck_after = options.get("stuck_after")
    try:
        report = status_report(
            stuck_after=STUCK_AFTER if stuck_after is None else stuck_after.total_seconds()
        )
    except DatabaseError as error:
        raise CommandError(f"the database did not answer: {error}") from error
    if options.get("json"):
        command.stdout.write(json.dumps(report, indent=2))
    else:
        command.stdout.write(format_report(report))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(h) for h in headers]] + [
        ["-" if value is None else str(value) for value in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def _count(report: dict[str, Any], value: int) -> str:
    return f"{value}+" if value >= report["count_limit"] else str(value)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def format_report(report: dict[str, Any]) -> str:
    """The report as sections of aligned columns."""
    lines = [f"database: {report['database']}   now: {report['now']}"]
    lines.append(f"leader: {report['leader'] or '(none)'}")
    lines.append("")
    lines.append(f"workers alive: {len(report['workers'])}")
    if report["workers"]:
        lines += _table(
            ("worker", "host", "pid", "last seen", "executions", "activities", "queues"),
            [
                (
                    w["worker_id"] + (" (leader)" if w["leader"] else ""),
                    w["hostname"],
                    w["pid"],
                    _age(w["last_seen_age_s"]) + " ago",
                    w["executions"],
                    w["activities"],
                    "all" if w["queues"] is None else ",".join(w["queues"]) or "(none)",
                )
                for w in report["workers"]
            ],
        )
    if report["lost_workers"]:
        lines.append(f"workers lost (expired without stopping): {len(report['lost_workers'])}")
        lines += _table(
            ("worker", "host", "pid", "last seen"),
            [
                (w["worker_id"], w["hostname"], w["pid"], _age(w["last_seen_age_s"]) + " ago")
                for w in report["lost_workers"]
            ],
        )
    lines.append("")
    lines.append("activity queues:")
    if report["queues"]:
        lines += _table(
            ("queue", "queued", "due", "running", "oldest due"),
            [
                (
                    (name or "(default)") + (" (paused)" if q.get("paused") else ""),
                    _count(report, q["queued"]),
                    _count(report, q["due"]),
                    q["running"],
                    _age(q["oldest_queued_age_s"]),
                )
                for name, q in report["queues"].items()
            ],
        )
    else:
        lines.append("  (no queued or running activity tasks)")
    lines.append("")
    lines.append(
        f"instances running: {_count(report, report['running_instances'])}"
        f"   runnable: {_count(report, report['runnable_instances'])}"
        f" (oldest {_age(report['oldest_runnable_age_s'])})"
        f"   due timers: {_count(report, report['due_timers'])}"
        f" (oldest {_age(report['oldest_due_timer_age_s'])})"
    )
    for title, key, headers, fields in (
        (
            f"over the history warning threshold ({report['history_warning_threshold']}):",
            "long_histories",
            ("instance", "workflow", "commands"),
            ("instance_id", "workflow_name", "commands"),
        ),
        (
            "stuck:",
            "stuck",
            ("instance", "workflow", "reason", "for", "detail"),
            ("instance_id", "workflow_name", "reason", "since_s", "detail"),
        ),
        (
            "hot loops:",
            "hot_loops",
            ("instance", "workflow", "reason", "dispatches", "commands", "errors"),
            (
                "instance_id",
                "workflow_name",
                "reason",
                "dispatches",
                "commands",
                "execution_errors",
            ),
        ),
    ):
        if report[key]:
            lines.append(title)
            lines += _table(headers, [[row[f] for f in fields] for row in report[key]])
    undecodable = [
        (w["worker_id"], entry["instance_id"], entry["key_id"])
        for w in report["workers"]
        for entry in w.get("undecodable") or []
    ]
    if undecodable:
        lines.append("left by workers without the key (PAYLOAD_KEYS):")
        lines += _table(("worker", "instance_id", "key_id"), undecodable)
    lines.append("")
    if report["warnings"]:
        lines += [f"WARNING: {text}" for text in report["warnings"]]
    else:
        lines.append("no warnings")
    return "\n".join(lines)
