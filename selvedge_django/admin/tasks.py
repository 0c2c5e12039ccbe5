"""The admin of activity tasks: read-only, across instances, searched by exact instance id.

A task's page shows its options, input, last error and heartbeat details, each
escaped and truncated; a user without ``view_payloads`` sees their sizes
instead. The columns are module-level display functions, wired by
:class:`ActivityTaskAdmin`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..models import ActivityTask
from .base import ReadOnlyAdmin, may_view_payloads
from .display import (
    ID_CHARS,
    VALUE_CHARS,
    clear_text,
    error_html,
    error_summary,
    format_time,
    hidden,
    json_preview,
    status_badge,
    truncate,
)

__all__ = ["ActivityTaskAdmin"]


@admin.display(description=_("task"), ordering="key")
def task(obj: ActivityTask) -> str:
    return truncate(obj.key, ID_CHARS)


@admin.display(description=_("status"), ordering="status")
def status_column(obj: ActivityTask) -> str:
    return status_badge(obj.status, obj.get_status_display())


@admin.display(description=_("created at"), ordering="created_at")
def created(obj: ActivityTask) -> str:
    return format_time(obj.created_at)


@admin.display(description=_("updated at"), ordering="updated_at")
def updated(obj: ActivityTask) -> str:
    return format_time(obj.updated_at)


@admin.display(description=_("options"))
def options_value(obj: ActivityTask) -> str:
    return format_html("<code>{}</code>", json_preview(obj.options))


@admin.display(description=_("input"))
def input_value(obj: ActivityTask) -> str:
    return format_html("<code>{}</code>", truncate(clear_text(obj.input) or "", VALUE_CHARS))


@admin.display(description=_("last error"))
def error_value(obj: ActivityTask) -> str:
    return error_html(obj.last_error)


@admin.display(description=_("input"))
def hidden_input(obj: ActivityTask) -> str:
    return hidden(len(obj.input or ""))


@admin.display(description=_("heartbeat details"))
def details_value(obj: ActivityTask) -> str | None:
    """The details the next attempt receives as activity_info().heartbeat_details."""
    if obj.heartbeat_details is None:
        return None
    return format_html(
        "<code>{}</code>", truncate(clear_text(obj.heartbeat_details) or "", VALUE_CHARS)
    )


@admin.display(description=_("heartbeat details"))
def hidden_details(obj: ActivityTask) -> str | None:
    return None if obj.heartbeat_details is None else hidden(len(obj.heartbeat_details))


@admin.display(description=_("last error"))
def hidden_error(obj: ActivityTask) -> str:
    if not obj.last_error:
        return ""
    kind = error_summary(obj.last_error, VALUE_CHARS).split(":", 1)[0]
    return format_html("{} {}", kind, hidden(len(obj.last_error)))


# The value fields a user without view_payloads sees as sizes.
HIDDEN: dict[Any, Any] = {
    input_value: hidden_input,
    error_value: hidden_error,
    details_value: hidden_details,
}


@admin.register(ActivityTask)
class ActivityTaskAdmin(ReadOnlyAdmin):
    """Activity tasks across instances; search by exact instance id."""

    # Names and display functions: Django takes both, django-stubs types names only.
    list_display: Any = (
        task,
        "instance_column",
        "name",
        "queue",
        status_column,
        "attempts",
        "failures",
        updated,
    )
    list_display_links: Any = (task,)
    list_filter = ("status",)
    search_fields = ("instance__instance_id",)
    search_help_text = _("Exact instance id.")
    ordering = ("-id",)
    fields: ClassVar[Any] = (
        "instance_column",
        "workflow_name",
        "key",
        "seq",
        "name",
        "queue",
        status_column,
        "attempts",
        "failures",
        "max_attempts",
        options_value,
        input_value,
        error_value,
        details_value,
        created,
        updated,
    )
    readonly_fields: ClassVar[Any] = (*fields, *HIDDEN.values())

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if may_view_payloads(request):
            return self.fields
        return tuple(HIDDEN.get(name, name) for name in self.fields or ())

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        # An exact match uses the (instance, key) index; a partial one would scan every task.
        term = search_term.strip()
        return (queryset.filter(instance_id=term) if term else queryset), False

    @admin.display(description=_("instance"))
    def instance_column(self, obj: ActivityTask) -> str:
        return self.instance_link(obj.instance_id)
