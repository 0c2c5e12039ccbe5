"""What an instance's page shows below its description.

Reads only, each bounded (through :class:`~selvedge_django.storage.admin_reads.AdminReads`):
every section is capped and long values are cut in SQL, so a huge history or
payload never reaches Python whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..models import WorkflowStatus
from ..storage.admin_reads import AdminReads
from .display import (
    CELL_CHARS,
    EMPTY,
    ID_CHARS,
    clear_text,
    error_summary,
    format_duration,
    format_time,
    payload_cut,
    status_badge,
    truncate,
)

# Rows shown per section of the detail page; the export has everything.
HISTORY_ROWS = 500
SECTION_ROWS = 200
# The stream entries shown: the last ones written, newest first.
STREAM_ENTRY_ROWS = 50

_STATUS_LABELS = dict(WorkflowStatus.choices)


def instance_sections(
    reads: AdminReads, iid: str, instance_url: Callable[[str], str], *, values: bool = True
) -> dict[str, Any]:
    """Read an instance's history, tasks, timers, signals, streams and children, boundedly.

    Every section is capped, and long values are cut in SQL, so a huge history or
    payload never reaches Python whole. Without ``values`` (a user without the
    ``view_payloads`` permission) no recorded value or payload is read at all,
    only its size.
    """
    cut = payload_cut(CELL_CHARS + 1 if values else 0)
    history_count = reads.history_count(iid)
    history = [
        {
            "seq": seq,
            "key": truncate(key, ID_CHARS),
            "command": command,
            "event_type": event_type,
            "data": None if data is None else truncate(clear_text(data) or "", CELL_CHARS),
            "reservation": None if reservation is None else truncate(reservation, CELL_CHARS),
            "delivered_seq": delivered,
            "size": size,
            "recorded_at": format_time(created) or None,
            # A step recorded at once took no time of its own; one whose value came
            # later (an activity's result, a timer, a child) took until it arrived.
            "took": format_duration((arrived - created).total_seconds())
            if arrived is not None and created is not None
            else None,
        }
        for seq, key, command, event_type, data, reservation, delivered, size, created, arrived in (
            reads.history_rows(iid, cut=cut, limit=HISTORY_ROWS)
        )
    ]

    tasks = [
        {
            "key": truncate(task.key, ID_CHARS),
            "name": truncate(task.name, ID_CHARS),
            "queue": truncate(task.queue, ID_CHARS),
            "status": status_badge(task.status, task.get_status_display()),
            "attempts": task.attempts,
            "failures": task.failures,
            "max_attempts": task.max_attempts,
            "last_error": error_summary(task.last_error, values=values),
            # The heartbeat details the next attempt receives (cut in SQL; hidden
            # without view_payloads, like every value).
            "heartbeat_details": None
            if task.details_head is None
            else truncate(clear_text(task.details_head) or "", CELL_CHARS),
            "heartbeat_details_size": task.details_size,
        }
        for task in reads.task_rows(iid, cut=cut, limit=SECTION_ROWS)
    ]

    timers = [
        {"key": truncate(key, ID_CHARS), "expires_at": format_time(expires_at), "fired": fired}
        for key, expires_at, fired in reads.timer_rows(iid, limit=SECTION_ROWS)
    ]

    signals = [
        {
            "id": sid,
            "channel": truncate(channel, ID_CHARS),
            "sent_at": format_time(sent_at),
            "delivered_seq": delivered,
            "consumed_seq": consumed,
            "consumed_key": truncate(consumed_key, ID_CHARS),
            "idempotency_key": truncate(key or "", ID_CHARS),
            "payload": truncate(clear_text(head) or "", CELL_CHARS),
            "size": size,
        }
        for sid, channel, sent_at, delivered, consumed, consumed_key, key, head, size in (
            reads.signal_rows(iid, cut=cut, limit=SECTION_ROWS)
        )
    ]

    children = [
        {
            "url": instance_url(child_id),
            "instance_id": truncate(child_id, ID_CHARS),
            "workflow_name": truncate(name, ID_CHARS),
            "status": status_badge(status, _STATUS_LABELS.get(status, status)),
            "parent_key": truncate(key, ID_CHARS),
        }
        for child_id, name, status, key in reads.child_rows(iid, limit=SECTION_ROWS)
    ]

    streams = [
        {"key": truncate(key, ID_CHARS), "entries": entries, "closed": closed}
        for key, entries, closed in reads.stream_rows(iid, limit=SECTION_ROWS)
    ]
    stream_entries = [
        {
            "key": truncate(key, ID_CHARS),
            "seq": seq,
            "attempt": attempt,
            "activity_id": truncate(activity_id or "", ID_CHARS),
            "written_at": format_time(written_at),
            "value": truncate(clear_text(head) or "", CELL_CHARS),
            "size": size,
        }
        for key, seq, attempt, activity_id, written_at, head, size in (
            reads.stream_entry_rows(iid, cut=cut, limit=STREAM_ENTRY_ROWS) if streams else ()
        )
    ]

    archived = [
        {
            "generation": generation,
            "seq": seq,
            "key": truncate(key, ID_CHARS),
            "event_type": event_type,
            "data": None if data is None else truncate(clear_text(data) or "", CELL_CHARS),
            "size": size,
            "archived_at": format_time(archived_at),
        }
        for generation, seq, key, event_type, data, size, archived_at in (
            reads.archived_rows(iid, cut=cut, limit=SECTION_ROWS)
        )
    ]
    return {
        "archived": archived,
        "history": history,
        "history_count": history_count,
        "history_truncated": history_count > len(history),
        "tasks": tasks,
        "timers": timers,
        "signals": signals,
        "children": children,
        "streams": streams,
        "stream_entries": stream_entries,
        "stream_entry_rows": STREAM_ENTRY_ROWS,
        "section_rows": SECTION_ROWS,
        "show_values": values,
        "empty": EMPTY,
    }
