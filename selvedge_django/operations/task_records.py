"""The rows behind one ``django.tasks`` result: an instance and its single activity task.

``selvedge_django.tasks`` builds a ``TaskResult`` from this record without replaying
anything: one hand-written read of the instance joined with its task by key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .base import client_store, known_id

__all__ = ["TaskRecord", "database_now_ms", "task_record"]


@dataclass(frozen=True)
class TaskRecord:
    """What the database holds about one task run: the instance, then its activity task.

    The ``task_*`` fields are None while the activity is not reserved yet (a deferred
    task waiting for ``run_after``). Errors are decoded JSON envelopes.
    """

    instance_id: str
    workflow_name: str
    status: str
    input: Any
    output: str | None
    error: dict[str, Any] | None
    started_at: datetime
    closed_at: datetime | None
    task_status: str | None = None
    attempts: int = 0
    failures: int = 0
    last_error: dict[str, Any] | None = None
    claim_owner: str = ""
    claim_started_at: datetime | None = None


def _envelope(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def task_record(instance_id: str, key: str) -> TaskRecord:
    """Read an instance and its activity task ``key``; raise WorkflowNotFound if absent."""
    store = client_store()
    row = store.get_task_record_row(known_id(instance_id), key)
    row["error"] = store.codec.open_error(_envelope(row["error"]))
    row["last_error"] = store.codec.open_error(_envelope(row["last_error"]))
    row["input"] = store.codec.open(row["input"])
    if row.get("output") is not None:  # the task's result, as stored text
        row["output"] = _clear_text(store, row["output"])
    return TaskRecord(instance_id=instance_id, **row)


def _clear_text(store: Any, text: str) -> str:
    """Stored JSON text as plain JSON (a payload codec's envelope opened)."""
    if store.codec.reader is None:
        return text
    return json.dumps(store.codec.decode(text), separators=(",", ":"), ensure_ascii=False)


def database_now_ms() -> int:
    """The database clock in Unix milliseconds (one read), as timers and claims use it."""
    return client_store().now_ms()
