"""Helpers of the admin console: truncation, forms, the name filter and the detail sections.

``options`` and ``schedules`` hold the ModelAdmin classes and their views; this
module holds what they show and validate, so each stays a readable size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.db.models.functions import Length, Substr
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
    WorkflowStatus,
)
from ..registry import registered_workflow_names

# How much of a stored value is shown: a cell of a table, a value on the detail page.
CELL_CHARS = 200
VALUE_CHARS = 2000
ID_CHARS = 80
# Rows shown per section of the detail page; the export has everything.
HISTORY_ROWS = 500
SECTION_ROWS = 200
# Most instances one changelist action handles at once.
MAX_BATCH = 1000
MAX_EXPORT = 100
# What one multi-instance export may hold (the stored values it would write, counted
# before anything is sent): the zip is streamed, but a larger one is refused up front.
MAX_EXPORT_BYTES = 256 * 1024 * 1024
# What one bulk signal may write in all: the encoded payload times the instances.
MAX_BULK_SIGNAL_BYTES = 16 * 1024 * 1024
# Most workflow names the name filter lists (taken from the registry, not the table).
MAX_FILTER_NAMES = 200

_STATUS_LABELS = dict(WorkflowStatus.choices)
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")
# The start of a stored error envelope: {"type": "...", "message": "...", ...}.
_ENVELOPE_FIELD = re.compile(r'"(type|message)"\s*:\s*("(?:[^"\\]|\\.)*")')
# The one rendering of an empty value, here and in the admin's own fields.
EMPTY = "-"
# How much of a stored error the changelist reads per row (its type and message lead).
ERROR_HEAD_CHARS = 600


# -- display helpers ------------------------------------------------------------------


def truncate(text: str, limit: int) -> str:
    """Return ``text`` cut to ``limit`` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def json_preview(value: Any, limit: int = VALUE_CHARS) -> str:
    """Return a value as compact JSON text, truncated."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return truncate(text, limit)


def error_summary(text: str | None, limit: int = CELL_CHARS) -> str:
    """Return ``type: message`` of a stored error envelope, truncated."""
    if not text:
        return ""
    try:
        env = json.loads(text)
    except ValueError:
        return truncate(text, limit)
    if not isinstance(env, dict):
        return truncate(text, limit)
    return truncate(f"{env.get('type') or 'Error'}: {env.get('message') or ''}", limit)


def error_head_summary(head: str | None, limit: int = CELL_CHARS) -> str:
    """Return ``type: message`` from the first characters of a stored error envelope."""
    if not head:
        return ""
    try:
        return error_summary(head, limit) if json.loads(head) is not None else ""
    except ValueError:
        pass
    fields: dict[str, str] = {}
    for name, quoted in _ENVELOPE_FIELD.findall(head):
        try:
            fields.setdefault(name, json.loads(quoted))
        except ValueError:
            continue
    if not fields:
        return truncate(head, limit)
    return truncate(f"{fields.get('type') or 'Error'}: {fields.get('message') or ''}", limit)


def format_duration(seconds: float | None) -> str | None:
    """Return a duration for people: ``850 ms``, ``1.5 s``, ``3 min 4 s``, ``2 h 5 min``."""
    if seconds is None or seconds < 0:
        return None
    if seconds < 1:
        return gettext("%(n)d ms") % {"n": round(seconds * 1000)}
    if seconds < 60:
        return gettext("%(n).1f s") % {"n": seconds}
    whole = int(seconds)
    if whole < 3600:
        return gettext("%(m)d min %(s)d s") % {"m": whole // 60, "s": whole % 60}
    if whole < 86400:
        return gettext("%(h)d h %(m)d min") % {"h": whole // 3600, "m": whole % 3600 // 60}
    return gettext("%(d)d d %(h)d h") % {"d": whole // 86400, "h": whole % 86400 // 3600}


def safe_filename(instance_id: str) -> str:
    """Return a file name fragment built from an instance id (no path characters)."""
    return _UNSAFE_FILENAME.sub("_", instance_id).strip("._")[:80] or "instance"


def ms_datetime(ms: int | None) -> datetime | None:
    """Return Unix milliseconds (the database clock's ``*_ms`` columns) as a UTC datetime."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def database_alias() -> str:
    """Return the database alias the engine uses (``SELVEDGE["DATABASE"]``)."""
    return get_settings().database


# -- forms --------------------------------------------------------------------------------


class CancelForm(forms.Form):
    """The reason given with a cancellation request."""

    reason = forms.CharField(
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        label=_("Reason"),
        help_text=_("Recorded with the request and shown to the workflow as the reason."),
    )


class TerminateForm(forms.Form):
    """The reason recorded with a terminate (in the instance's WorkflowTerminated error)."""

    reason = forms.CharField(
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Recorded as the reason of the instance's WorkflowTerminated error.",
    )


class SignalForm(forms.Form):
    """A signal's channel and JSON payload, validated as the client API does."""

    channel = forms.CharField(
        strip=False,
        max_length=255,
        label=_("Channel"),
        help_text=_("1 to 255 UTF-8 bytes."),
        widget=forms.TextInput(attrs={"size": 60}),
    )
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
        label=_("Payload"),
        help_text=_("A JSON value; leave empty to send null."),
    )

    def clean_channel(self) -> str:
        channel: str = self.cleaned_data["channel"]
        if not 1 <= len(channel.encode("utf-8")) <= 255:
            raise forms.ValidationError(_("The channel must contain 1 to 255 UTF-8 bytes."))
        return channel

    def clean_payload(self) -> Any:
        text: str = self.cleaned_data.get("payload") or ""
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as error:
            raise forms.ValidationError(
                _("The payload is not valid JSON: %(error)s"),
                params={"error": truncate(str(error), CELL_CHARS)},
            )


# -- filters ------------------------------------------------------------------------------


class WorkflowNameFilter(admin.SimpleListFilter):
    """Filter by exact workflow name; the choices come from the workflow registry.

    Listing the names stored in the table would need a ``SELECT DISTINCT`` over
    every instance on each changelist load. The registry is what this process
    can run; any other name still filters through ``?workflow_name=...``.
    """

    title = _("workflow name")
    parameter_name = "workflow_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = registered_workflow_names()[:MAX_FILTER_NAMES]
        current = self.value()
        if current and current not in names:
            names = [current, *names]
        return [(name, truncate(name, ID_CHARS)) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(workflow_name=value) if value else queryset


class InstanceChangeList(ChangeList):
    """The changelist, without loading the (possibly large) stored values of each row."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        qs = super().get_queryset(request, exclude_parameters)
        # Only the head of an error: its type and message, for the error column.
        return qs.defer("input", "output", "error", "cancel_reason").annotate(
            error_head=Substr("error", 1, ERROR_HEAD_CHARS)
        )


# -- the detail page's sections -----------------------------------------------------------


def instance_sections(
    alias: str, iid: str, instance_url: Callable[[str], str], *, values: bool = True
) -> dict[str, Any]:
    """Read an instance's history, tasks, timers, signals and children, in bounded queries.

    Every section is capped, and long values are cut in SQL, so a huge history or
    payload never reaches Python whole. Without ``values`` (a user without the
    ``view_payloads`` permission) no recorded value or payload is read at all,
    only its size.
    """
    cut = CELL_CHARS + 1 if values else 0
    history_count = HistoryEvent.objects.using(alias).filter(instance_id=iid).count()
    rows = (
        HistoryEvent.objects.using(alias)
        .filter(instance_id=iid)
        .order_by("id")
        .annotate(data_head=Substr("data", 1, cut), data_size=Length("data"))
        .annotate(reservation_head=Substr("reservation", 1, cut))
        .values_list(
            "seq",
            "key",
            "command",
            "event_type",
            "data_head",
            "reservation_head",
            "delivered_seq",
            "data_size",
            "created_at",
            "arrived_at",
        )[:HISTORY_ROWS]
    )
    history = [
        {
            "seq": seq,
            "key": truncate(key, ID_CHARS),
            "command": command,
            "event_type": event_type,
            "data": None if data is None else truncate(data, CELL_CHARS),
            "reservation": None if reservation is None else truncate(reservation, CELL_CHARS),
            "delivered_seq": delivered,
            "size": size,
            "recorded_at": created,
            # A step recorded at once took no time of its own; one whose value came
            # later (an activity's result, a timer, a child) took until it arrived.
            "took": format_duration((arrived - created).total_seconds())
            if arrived is not None and created is not None
            else None,
        }
        for seq, key, command, event_type, data, reservation, delivered, size, created, arrived in (
            rows
        )
    ]

    tasks = [
        {
            "key": truncate(task.key, ID_CHARS),
            "name": truncate(task.name, ID_CHARS),
            "queue": truncate(task.queue, ID_CHARS),
            "status": task.get_status_display(),
            "attempts": task.attempts,
            "failures": task.failures,
            "max_attempts": task.max_attempts,
            "last_error": error_summary(task.last_error),
        }
        for task in ActivityTask.objects.using(alias)
        .filter(instance_id=iid)
        .order_by("seq", "id")
        .only(
            "key",
            "name",
            "queue",
            "status",
            "attempts",
            "failures",
            "max_attempts",
            "last_error",
        )[:SECTION_ROWS]
    ]

    timers = [
        {"key": truncate(key, ID_CHARS), "expires_at": expires_at, "fired": fired}
        for key, expires_at, fired in TimerSubscription.objects.using(alias)
        .filter(instance_id=iid)
        .order_by("expires_at", "id")
        .values_list("key", "expires_at", "fired")[:SECTION_ROWS]
    ]

    signals = [
        {
            "id": sid,
            "channel": truncate(channel, ID_CHARS),
            "sent_at": sent_at,
            "delivered_seq": delivered,
            "consumed_seq": consumed,
            "consumed_key": truncate(consumed_key, ID_CHARS),
            "payload": truncate(head or "", CELL_CHARS),
            "size": size,
        }
        for sid, channel, sent_at, delivered, consumed, consumed_key, head, size in (
            SignalMessage.objects.using(alias)
            .filter(instance_id=iid)
            .order_by("id")
            .annotate(head=Substr("payload", 1, cut), size=Length("payload"))
            .values_list(
                "id",
                "channel",
                "sent_at",
                "delivered_seq",
                "consumed_seq",
                "consumed_key",
                "head",
                "size",
            )[:SECTION_ROWS]
        )
    ]

    children = [
        {
            "url": instance_url(child_id),
            "instance_id": truncate(child_id, ID_CHARS),
            "workflow_name": truncate(name, ID_CHARS),
            "status": _STATUS_LABELS.get(status, status),
            "parent_key": truncate(key, ID_CHARS),
        }
        for child_id, name, status, key in WorkflowInstance.objects.using(alias)
        .filter(parent_instance_id=iid)
        # Spelled as the partial index's condition, so SQLite can use that index.
        .exclude(parent_instance_id="")
        .order_by("started_at", "instance_id")
        .values_list("instance_id", "workflow_name", "status", "parent_key")[:SECTION_ROWS]
    ]

    return {
        "history": history,
        "history_count": history_count,
        "history_truncated": history_count > len(history),
        "tasks": tasks,
        "timers": timers,
        "signals": signals,
        "children": children,
        "section_rows": SECTION_ROWS,
        "show_values": values,
        "empty": EMPTY,
    }
