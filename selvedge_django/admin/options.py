"""The ModelAdmin classes of instances, activity tasks and locks: read-only views.

An instance's changelist stays cheap on large tables (no per-row queries, no
unbounded ``SELECT DISTINCT`` for the filters, no full-table count); its page
shows the description, then history, tasks, timers, signals and children in
bounded sections, with the action buttons the user's permissions allow. Stored
values are escaped and truncated wherever they are shown.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..models import ActivityTask, SystemLock, WorkflowInstance, WorkflowStatus
from ..registry import get_workflow
from .actions import TEMPLATE_DIR
from .base import APP, ReadOnlyAdmin
from .dashboard import DashboardAdmin
from .display import (
    EMPTY,
    ID_CHARS,
    VALUE_CHARS,
    admin_reads,
    error_head_summary,
    error_html,
    error_summary,
    format_duration,
    format_time,
    hidden,
    json_preview,
    ms_datetime,
    status_badge,
    truncate,
)
from .filters import CodeVersionFilter, ErrorTypeFilter, InstanceChangeList, WorkflowNameFilter
from .sections import instance_sections
from .timeline import build_timeline


@admin.register(WorkflowInstance)
class WorkflowInstanceAdmin(DashboardAdmin):
    """Instances: list, detail (history, tasks, timers, signals, children) and actions."""

    list_display = (
        "instance",
        "workflow",
        "status_column",
        "code_version",
        "cancel_requested",
        "started",
        "duration",
        "closed",
        "error_column",
        "parent",
    )
    list_display_links = ("instance",)
    # Only the columns an index can order: sorting 100,000 rows by anything else is slow.
    sortable_by = ("instance", "workflow", "started", "closed")
    list_filter = (
        "status",
        WorkflowNameFilter,
        CodeVersionFilter,
        ErrorTypeFilter,
        ("started_at", admin.DateFieldListFilter),
    )
    search_fields = ("instance_id",)
    search_help_text = _("An exact instance id, or part of one (ignoring case).")
    ordering = ("-started_at", "-instance_id")
    list_per_page = 100
    actions = (
        "cancel_instances",
        "terminate_instances",
        "resume_instances",
        "fork_instances",
        "signal_instances",
        "export_instances",
    )
    change_form_template = f"{TEMPLATE_DIR}/change_form.html"
    fieldsets = (
        (
            _("Description"),
            {
                "fields": (
                    "instance_id",
                    "workflow_name",
                    "status_column",
                    "cancel_requested",
                    "reason",
                    "parent",
                    "parent_key",
                    "service_name",
                    "code_version",
                    "current_step",
                    "started",
                    "updated",
                    "closed",
                    "execution_timeout",
                    "execution_deadline",
                    "generation",
                    "resumed_count",
                    "forked_from",
                )
            },
        ),
        (
            _("Values"),
            {
                "fields": (
                    "progress_value",
                    "input_value",
                    "output_value",
                    "error_value",
                    "storage_error_value",
                )
            },
        ),
        (
            _("Execution lease"),
            {
                "fields": (
                    "runnable",
                    "lease_owner",
                    "lease_epoch",
                    "lease_expiry",
                    "execution_errors",
                    "held_back_until",
                )
            },
        ),
    )
    hidden_values = ("hidden_progress", "hidden_input", "hidden_output", "hidden_error")
    readonly_fields = (
        *fieldsets[0][1]["fields"],
        *fieldsets[1][1]["fields"],
        *fieldsets[2][1]["fields"],
        *hidden_values,
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.has_payloads_permission(request):
            return self.fieldsets
        description, _values, lease = self.fieldsets
        return (description, ("Values", {"fields": self.hidden_values}), lease)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return InstanceChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        # A pasted id is found through the primary key; only other terms scan the ids.
        term = search_term.strip()
        if term and len(term) <= 255:
            exact = queryset.filter(instance_id=term)
            if exact.exists():
                return exact, False
        return super().get_search_results(request, queryset, search_term)

    # -- columns and fields -----------------------------------------------------------

    @admin.display(description=_("instance id"), ordering="instance_id")
    def instance(self, obj: WorkflowInstance) -> str:
        return truncate(obj.instance_id, ID_CHARS)

    @admin.display(description=_("workflow name"), ordering="workflow_name")
    def workflow(self, obj: WorkflowInstance) -> str:
        name = truncate(obj.workflow_name, ID_CHARS)
        if obj.status == WorkflowStatus.RUNNING and get_workflow(obj.workflow_name) is None:
            # Only workers that register it run it: another service, or a stale name.
            return format_html(
                '{} <strong class="selvedge-unregistered" title="{}">{}</strong>',
                name,
                gettext("No worker of this process can run it: this process does not know it."),
                gettext("not registered here"),
            )
        return name

    @admin.display(description=_("status"), ordering="status")
    def status_column(self, obj: WorkflowInstance) -> str:
        return status_badge(obj.status, obj.get_status_display())

    @admin.display(description=_("started at"), ordering="started_at")
    def started(self, obj: WorkflowInstance) -> str:
        return format_time(obj.started_at)

    @admin.display(description=_("updated at"))
    def updated(self, obj: WorkflowInstance) -> str:
        return format_time(obj.updated_at)

    @admin.display(description=_("closed at"), ordering="closed_at")
    def closed(self, obj: WorkflowInstance) -> str | None:
        return format_time(obj.closed_at) or None

    @admin.display(description=_("duration"))
    def duration(self, obj: WorkflowInstance) -> str | None:
        end = obj.closed_at or (timezone.now() if obj.status == WorkflowStatus.RUNNING else None)
        if end is None or obj.started_at is None:
            return None
        return format_duration((end - obj.started_at).total_seconds())

    @admin.display(description=_("error"))
    def error_column(self, obj: WorkflowInstance) -> str | None:
        return error_head_summary(getattr(obj, "error_head", None)) or None

    @admin.display(description=_("parent"))
    def parent(self, obj: WorkflowInstance) -> str | None:
        return self.instance_link(obj.parent_instance_id) or None

    @admin.display(description=_("cancel reason"))
    def reason(self, obj: WorkflowInstance) -> str | None:
        return truncate(obj.cancel_reason, VALUE_CHARS) or None

    @admin.display(description=_("progress"))
    def progress_value(self, obj: WorkflowInstance) -> str | None:
        """The last ctx.set_progress() value, as stored (no replay)."""
        if obj.progress is None:
            return None
        return format_html("<code>{}</code>", truncate(obj.progress, VALUE_CHARS))

    @admin.display(description=_("progress"))
    def hidden_progress(self, obj: WorkflowInstance) -> str | None:
        return None if obj.progress is None else hidden(len(obj.progress))

    @admin.display(description=_("input"))
    def input_value(self, obj: WorkflowInstance) -> str:
        return format_html("<code>{}</code>", json_preview(obj.input))

    @admin.display(description=_("output"))
    def output_value(self, obj: WorkflowInstance) -> str | None:
        if obj.output is None:
            return None
        return format_html("<code>{}</code>", truncate(obj.output, VALUE_CHARS))

    @admin.display(description=_("error"))
    def error_value(self, obj: WorkflowInstance) -> str | None:
        return error_html(obj.error) or None

    @admin.display(description=_("input"))
    def hidden_input(self, obj: WorkflowInstance) -> str:
        return hidden(len(json.dumps(obj.input)))

    @admin.display(description=_("output"))
    def hidden_output(self, obj: WorkflowInstance) -> str | None:
        return None if obj.output is None else hidden(len(obj.output))

    @admin.display(description=_("error"))
    def hidden_error(self, obj: WorkflowInstance) -> str | None:
        if not obj.error:
            return None
        kind = error_summary(obj.error, VALUE_CHARS).split(":", 1)[0]
        return format_html("<strong>{}</strong><br>{}", kind, hidden(len(obj.error)))

    @admin.display(description=_("lease expires"))
    def lease_expiry(self, obj: WorkflowInstance) -> str | None:
        return format_time(ms_datetime(obj.lease_expires_ms)) or None

    @admin.display(description=_("execution timeout"))
    def execution_timeout(self, obj: WorkflowInstance) -> str:
        """The timeout the run was started with (a resume counts it again from there)."""
        if obj.execution_timeout_ms is None:
            return EMPTY
        return str(timedelta(milliseconds=obj.execution_timeout_ms))

    @admin.display(description=_("terminated if still running at"))
    def execution_deadline(self, obj: WorkflowInstance) -> str:
        deadline = ms_datetime(obj.execution_deadline_ms)
        if obj.status != WorkflowStatus.RUNNING or deadline is None:
            return EMPTY
        return format_time(deadline)

    @admin.display(description=_("held back until"))
    def held_back_until(self, obj: WorkflowInstance) -> str | None:
        """When an instance held back after storage errors may be dispatched again."""
        if not obj.execution_errors or obj.status != WorkflowStatus.RUNNING:
            return None
        return format_time(ms_datetime(obj.ready_ms)) or None

    @admin.display(description=_("last storage error"))
    def storage_error_value(self, obj: WorkflowInstance) -> str | None:
        if not obj.execution_error:
            return None
        return format_html("<code>{}</code>", truncate(obj.execution_error, VALUE_CHARS))

    # -- the detail page --------------------------------------------------------------

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        if obj is not None:
            context["selvedge"] = self.detail_context(request, obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def detail_context(self, request: HttpRequest, obj: WorkflowInstance) -> dict[str, Any]:
        """Gather what the detail page shows below the description, in bounded queries."""
        reads = admin_reads()
        iid = obj.instance_id
        running = obj.status == WorkflowStatus.RUNNING
        threshold = get_settings().history_warning_threshold

        sections = instance_sections(
            reads, iid, self.instance_url, values=self.has_payloads_permission(request)
        )
        quoted = quote(iid)
        site = self.admin_site.name
        child_urls = {child["parent_key"]: child["url"] for child in sections["children"]}
        return {
            **sections,
            "timeline": build_timeline(reads, obj, sections["history_count"], child_urls),
            "unregistered": running and get_workflow(obj.workflow_name) is None,
            "empty_mark": format_html('<span class="selvedge-empty">{}</span>', EMPTY),
            "history_warning": sections["history_count"] > threshold,
            "history_threshold": threshold,
            "parent_url": self.instance_url(obj.parent_instance_id)
            if obj.parent_instance_id
            else "",
            "cancel_url": reverse(f"{site}:{APP}_workflowinstance_cancel", args=(quoted,))
            if running and self.has_cancel_permission(request)
            else "",
            "terminate_url": reverse(f"{site}:{APP}_workflowinstance_terminate", args=(quoted,))
            if running and self.has_terminate_permission(request)
            else "",
            "resume_url": reverse(f"{site}:{APP}_workflowinstance_resume", args=(quoted,))
            if not running and self.has_resume_permission(request)
            else "",
            "fork_url": reverse(f"{site}:{APP}_workflowinstance_fork", args=(quoted,))
            if self.has_fork_permission(request)
            else "",
            "signal_url": reverse(f"{site}:{APP}_workflowinstance_signal", args=(quoted,))
            if running and self.has_signal_permission(request)
            else "",
            "export_url": reverse(f"{site}:{APP}_workflowinstance_export", args=(quoted,))
            if self.has_export_permission(request)
            else "",
            "query_url": reverse(f"{site}:{APP}_workflowinstance_query", args=(quoted,))
            if self.has_query_permission(request)
            else "",
            "replay_check_url": reverse(
                f"{site}:{APP}_workflowinstance_replay_check", args=(quoted,)
            )
            if self.has_replay_check_permission(request)
            else "",
        }


# -- activity tasks and locks ---------------------------------------------------------


@admin.register(ActivityTask)
class ActivityTaskAdmin(ReadOnlyAdmin):
    """Activity tasks across instances; search by exact instance id."""

    list_display = (
        "task",
        "instance_column",
        "name",
        "queue",
        "status_column",
        "attempts",
        "failures",
        "updated",
    )
    list_display_links = ("task",)
    list_filter = ("status",)
    search_fields = ("instance__instance_id",)
    search_help_text = _("Exact instance id.")
    ordering = ("-id",)
    fields = (
        "instance_column",
        "workflow_name",
        "key",
        "seq",
        "name",
        "queue",
        "status_column",
        "attempts",
        "failures",
        "max_attempts",
        "options_value",
        "input_value",
        "error_value",
        "details_value",
        "created",
        "updated",
    )
    readonly_fields = (*fields, "hidden_input", "hidden_error", "hidden_details")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.has_payloads_permission(request):
            return self.fields
        swap = {
            "input_value": "hidden_input",
            "error_value": "hidden_error",
            "details_value": "hidden_details",
        }
        return tuple(swap.get(name, name) for name in self.fields or ())

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        # An exact match uses the (instance, key) index; a partial one would scan every task.
        term = search_term.strip()
        return (queryset.filter(instance_id=term) if term else queryset), False

    @admin.display(description=_("task"), ordering="key")
    def task(self, obj: ActivityTask) -> str:
        return truncate(obj.key, ID_CHARS)

    @admin.display(description=_("instance"))
    def instance_column(self, obj: ActivityTask) -> str:
        return self.instance_link(obj.instance_id)

    @admin.display(description=_("status"), ordering="status")
    def status_column(self, obj: ActivityTask) -> str:
        return status_badge(obj.status, obj.get_status_display())

    @admin.display(description=_("created at"), ordering="created_at")
    def created(self, obj: ActivityTask) -> str:
        return format_time(obj.created_at)

    @admin.display(description=_("updated at"), ordering="updated_at")
    def updated(self, obj: ActivityTask) -> str:
        return format_time(obj.updated_at)

    @admin.display(description=_("options"))
    def options_value(self, obj: ActivityTask) -> str:
        return format_html("<code>{}</code>", json_preview(obj.options))

    @admin.display(description=_("input"))
    def input_value(self, obj: ActivityTask) -> str:
        return format_html("<code>{}</code>", truncate(obj.input, VALUE_CHARS))

    @admin.display(description=_("last error"))
    def error_value(self, obj: ActivityTask) -> str:
        return error_html(obj.last_error)

    @admin.display(description=_("input"))
    def hidden_input(self, obj: ActivityTask) -> str:
        return hidden(len(obj.input or ""))

    @admin.display(description=_("heartbeat details"))
    def details_value(self, obj: ActivityTask) -> str | None:
        """The details the next attempt receives as activity_info().heartbeat_details."""
        if obj.heartbeat_details is None:
            return None
        return format_html("<code>{}</code>", truncate(obj.heartbeat_details, VALUE_CHARS))

    @admin.display(description=_("heartbeat details"))
    def hidden_details(self, obj: ActivityTask) -> str | None:
        return None if obj.heartbeat_details is None else hidden(len(obj.heartbeat_details))

    @admin.display(description=_("last error"))
    def hidden_error(self, obj: ActivityTask) -> str:
        if not obj.last_error:
            return ""
        kind = error_summary(obj.last_error, VALUE_CHARS).split(":", 1)[0]
        return format_html("{} {}", kind, hidden(len(obj.last_error)))


@admin.register(SystemLock)
class SystemLockAdmin(ReadOnlyAdmin):
    """Named leases (the leader's among them): who holds them and until when."""

    list_display = ("name", "owner", "epoch", "expires")
    fields = ("name", "owner", "epoch", "expires")
    readonly_fields = fields

    @admin.display(description=_("expires"), ordering="expires_ms")
    def expires(self, obj: SystemLock) -> str | None:
        return format_time(ms_datetime(obj.expires_ms or None)) or None
