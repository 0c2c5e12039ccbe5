"""The admin of workflow instances: a read-only changelist and page, and the actions.

An instance's changelist stays cheap on large tables (no per-row queries, no
unbounded ``SELECT DISTINCT`` for the filters, no full-table count); its page
shows the description, then history, tasks, timers, signals and children in
bounded sections, with the action buttons the user's permissions allow. Stored
values are escaped and truncated wherever they are shown.

:class:`WorkflowInstanceAdmin` wires what the other modules define as functions:
the columns below, the actions of :mod:`.actions` and :mod:`.recovery`, the
views of those and of :mod:`.console` and :mod:`.dashboard` (in ``get_urls``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import URLPattern, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..models import PAUSED_OWNER, WorkflowInstance, WorkflowStatus
from ..registry import get_workflow
from . import actions as instance_actions
from . import console, dashboard, pauses, recovery, streams
from .base import (
    APP,
    PERM_CANCEL,
    PERM_EXPORT,
    PERM_FORK,
    PERM_PAUSE,
    PERM_QUERY,
    PERM_REPLAY_CHECK,
    PERM_RESUME,
    PERM_SIGNAL,
    PERM_TERMINATE,
    ReadOnlyAdmin,
    extra_view,
    has_permission,
    may_view_payloads,
)
from .display import (
    EMPTY,
    ID_CHARS,
    VALUE_CHARS,
    admin_reads,
    clear_text,
    clear_value,
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
from .filters import (
    AttributeFilter,
    CodeVersionFilter,
    ErrorTypeFilter,
    InstanceChangeList,
    PausedFilter,
    WorkflowNameFilter,
)
from .pages import TEMPLATE_DIR
from .sections import instance_sections
from .timeline import build_timeline

__all__ = ["WorkflowInstanceAdmin", "detail_context"]


# -- columns and fields ---------------------------------------------------------------------


@admin.display(description=_("instance id"), ordering="instance_id")
def instance(obj: WorkflowInstance) -> str:
    return truncate(obj.instance_id, ID_CHARS)


@admin.display(description=_("workflow name"), ordering="workflow_name")
def workflow(obj: WorkflowInstance) -> str:
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
def status_column(obj: WorkflowInstance) -> str:
    if obj.status == WorkflowStatus.RUNNING and obj.lease_owner == PAUSED_OWNER:
        return status_badge("paused", gettext("Running (paused)"))
    return status_badge(obj.status, obj.get_status_display())


@admin.display(description=_("started at"), ordering="started_at")
def started(obj: WorkflowInstance) -> str:
    return format_time(obj.started_at)


@admin.display(description=_("updated at"))
def updated(obj: WorkflowInstance) -> str:
    return format_time(obj.updated_at)


@admin.display(description=_("closed at"), ordering="closed_at")
def closed(obj: WorkflowInstance) -> str | None:
    return format_time(obj.closed_at) or None


@admin.display(description=_("duration"))
def duration(obj: WorkflowInstance) -> str | None:
    end = obj.closed_at or (timezone.now() if obj.status == WorkflowStatus.RUNNING else None)
    if end is None or obj.started_at is None:
        return None
    return format_duration((end - obj.started_at).total_seconds())


@admin.display(description=_("error"))
def error_column(obj: WorkflowInstance) -> str | None:
    return error_head_summary(getattr(obj, "error_head", None)) or None


@admin.display(description=_("cancel reason"))
def reason(obj: WorkflowInstance) -> str | None:
    return truncate(obj.cancel_reason, VALUE_CHARS) or None


@admin.display(description=_("search attributes"))
def attributes_value(obj: WorkflowInstance) -> str | None:
    """The instance's search attributes, ``name: value`` a line (not payloads: shown to
    every viewer, never encrypted)."""
    found = admin_reads().attributes(obj.instance_id)
    if not found:
        return None
    return format_html_join(
        "",
        "<div><code>{}</code>: <code>{}</code></div>",
        (
            (
                name,
                truncate(
                    value.isoformat() if isinstance(value, datetime) else json.dumps(value),
                    VALUE_CHARS,
                ),
            )
            for name, value in found
        ),
    )


@admin.display(description=_("progress"))
def progress_value(obj: WorkflowInstance) -> str | None:
    """The last ctx.set_progress() value, as stored (no replay)."""
    if obj.progress is None:
        return None
    return format_html("<code>{}</code>", truncate(clear_text(obj.progress) or "", VALUE_CHARS))


@admin.display(description=_("progress"))
def hidden_progress(obj: WorkflowInstance) -> str | None:
    return None if obj.progress is None else hidden(len(obj.progress))


@admin.display(description=_("input"))
def input_value(obj: WorkflowInstance) -> str:
    return format_html("<code>{}</code>", json_preview(clear_value(obj.input)))


@admin.display(description=_("output"))
def output_value(obj: WorkflowInstance) -> str | None:
    if obj.output is None:
        return None
    return format_html("<code>{}</code>", truncate(clear_text(obj.output) or "", VALUE_CHARS))


@admin.display(description=_("error"))
def error_value(obj: WorkflowInstance) -> str | None:
    return error_html(obj.error) or None


@admin.display(description=_("input"))
def hidden_input(obj: WorkflowInstance) -> str:
    return hidden(len(json.dumps(obj.input)))


@admin.display(description=_("output"))
def hidden_output(obj: WorkflowInstance) -> str | None:
    return None if obj.output is None else hidden(len(obj.output))


@admin.display(description=_("error"))
def hidden_error(obj: WorkflowInstance) -> str | None:
    if not obj.error:
        return None
    kind = error_summary(obj.error, VALUE_CHARS).split(":", 1)[0]
    return format_html("<strong>{}</strong><br>{}", kind, hidden(len(obj.error)))


@admin.display(description=_("lease expires"))
def lease_expiry(obj: WorkflowInstance) -> str | None:
    return format_time(ms_datetime(obj.lease_expires_ms)) or None


@admin.display(description=_("execution timeout"))
def execution_timeout(obj: WorkflowInstance) -> str:
    """The timeout the run was started with (a resume counts it again from there)."""
    if obj.execution_timeout_ms is None:
        return EMPTY
    return str(timedelta(milliseconds=obj.execution_timeout_ms))


@admin.display(description=_("terminated if still running at"))
def execution_deadline(obj: WorkflowInstance) -> str:
    deadline = ms_datetime(obj.execution_deadline_ms)
    if obj.status != WorkflowStatus.RUNNING or deadline is None:
        return EMPTY
    return format_time(deadline)


@admin.display(description=_("held back until"))
def held_back_until(obj: WorkflowInstance) -> str | None:
    """When an instance held back after storage errors may be dispatched again."""
    if not obj.execution_errors or obj.status != WorkflowStatus.RUNNING:
        return None
    return format_time(ms_datetime(obj.ready_ms)) or None


@admin.display(description=_("last storage error"))
def storage_error_value(obj: WorkflowInstance) -> str | None:
    if not obj.execution_error:
        return None
    return format_html("<code>{}</code>", truncate(obj.execution_error, VALUE_CHARS))


# -- the model admin ------------------------------------------------------------------------


@admin.register(WorkflowInstance)
class WorkflowInstanceAdmin(ReadOnlyAdmin):
    """Instances: list, detail (history, tasks, timers, signals, children) and actions."""

    # Names and display functions: Django takes both, django-stubs types names only.
    list_display: Any = (
        instance,
        workflow,
        status_column,
        "code_version",
        "cancel_requested",
        started,
        duration,
        closed,
        error_column,
        "parent",
    )
    list_display_links: Any = (instance,)
    # Only the columns an index can order: sorting 100,000 rows by anything else is slow.
    sortable_by: ClassVar[Any] = (instance, workflow, started, closed)
    list_filter = (
        "status",
        PausedFilter,
        WorkflowNameFilter,
        CodeVersionFilter,
        ErrorTypeFilter,
        ("started_at", admin.DateFieldListFilter),
        AttributeFilter,
    )
    search_fields = ("instance_id",)
    search_help_text = _("An exact instance id, or part of one (ignoring case).")
    ordering = ("-started_at", "-instance_id")
    list_per_page = 100
    actions = (
        instance_actions.cancel_instances,
        instance_actions.terminate_instances,
        pauses.pause_instances,
        pauses.unpause_instances,
        recovery.resume_instances,
        recovery.fork_instances,
        instance_actions.signal_instances,
        instance_actions.export_instances,
    )
    change_list_template = f"{TEMPLATE_DIR}/change_list.html"
    change_form_template = f"{TEMPLATE_DIR}/change_form.html"
    fieldsets: ClassVar[Any] = (
        (
            _("Description"),
            {
                "fields": (
                    "instance_id",
                    "workflow_name",
                    status_column,
                    "cancel_requested",
                    reason,
                    "parent",
                    "parent_key",
                    "service_name",
                    "code_version",
                    "current_step",
                    started,
                    updated,
                    closed,
                    execution_timeout,
                    execution_deadline,
                    "generation",
                    "resumed_count",
                    "forked_from",
                    attributes_value,
                )
            },
        ),
        (
            _("Values"),
            {
                "fields": (
                    progress_value,
                    input_value,
                    output_value,
                    error_value,
                    storage_error_value,
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
                    lease_expiry,
                    "execution_errors",
                    held_back_until,
                )
            },
        ),
    )
    hidden_values = (hidden_progress, hidden_input, hidden_output, hidden_error)
    readonly_fields: ClassVar[Any] = (
        *fieldsets[0][1]["fields"],
        *fieldsets[1][1]["fields"],
        *fieldsets[2][1]["fields"],
        *hidden_values,
    )

    # -- the permissions the changelist actions name --------------------------------------

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, PERM_CANCEL)

    def has_terminate_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, PERM_TERMINATE)

    def has_pause_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, PERM_PAUSE)

    def has_resume_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, PERM_RESUME)

    def has_fork_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, PERM_FORK)

    def has_signal_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, PERM_SIGNAL)

    def has_export_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, PERM_EXPORT)

    # -- the changelist -------------------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if may_view_payloads(request):
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

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        extra = dict(extra_context or {})
        site = self.admin_site.name
        extra["selvedge_dashboard_url"] = reverse(f"{site}:{APP}_workflowinstance_dashboard")
        extra["selvedge_queues_url"] = reverse(f"{site}:{APP}_workflowinstance_queues")
        if console.may_start(self, request):
            extra["selvedge_start_url"] = reverse(f"{site}:{APP}_workflowinstance_start")
        return super().changelist_view(request, extra)

    @admin.display(description=_("parent"))
    def parent(self, obj: WorkflowInstance) -> str | None:
        return self.instance_link(obj.parent_instance_id) or None

    # -- the extra views ------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        def route(
            pattern: str, view: Callable[..., HttpResponseBase], name: str, reading: bool = False
        ) -> URLPattern:
            return extra_view(self, pattern, view, name, reading=reading)

        # Before the defaults: their "<path:object_id>/" catch-all would match first.
        # "dashboard/" and "start/" before every "<path:object_id>/..." pattern (an
        # instance called "start" keeps its page: that is "start/change/").
        return [
            route("dashboard/", dashboard.dashboard_view, "dashboard"),
            route("start/", console.start_view, "start"),
            route("queues/", pauses.queues_view, "queues"),
            # These POSTs only read: a query, a replay check and an export read the replica.
            route("<path:object_id>/query/", console.query_view, "query", reading=True),
            route(
                "<path:object_id>/replay-check/",
                console.replay_check_view,
                "replay_check",
                reading=True,
            ),
            route("<path:object_id>/resume/", recovery.resume_view, "resume"),
            route("<path:object_id>/fork/", recovery.fork_view, "fork"),
            route("<path:object_id>/cancel/", instance_actions.cancel_view, "cancel"),
            route("<path:object_id>/terminate/", instance_actions.terminate_view, "terminate"),
            route("<path:object_id>/pause/", pauses.pause_view, "pause"),
            route("<path:object_id>/unpause/", pauses.unpause_view, "unpause"),
            route("<path:object_id>/signal/", instance_actions.signal_view, "signal"),
            route("<path:object_id>/export/", instance_actions.export_view, "export", reading=True),
            route("<path:object_id>/stream-events/", streams.stream_events_view, "stream_events"),
            *super().get_urls(),
        ]

    # -- the detail page ------------------------------------------------------------------

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
            context["selvedge"] = detail_context(self, request, obj)
        return super().render_change_form(request, context, add, change, form_url, obj)


def detail_context(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance
) -> dict[str, Any]:
    """Gather what the detail page shows below the description, in bounded queries."""
    reads = admin_reads()
    iid = obj.instance_id
    running = obj.status == WorkflowStatus.RUNNING
    paused = running and obj.lease_owner == PAUSED_OWNER
    may_pause = has_permission(request, PERM_PAUSE)
    threshold = get_settings().history_warning_threshold

    values = may_view_payloads(request)
    sections = instance_sections(reads, iid, model_admin.instance_url, values=values)
    quoted = quote(iid)
    site = model_admin.admin_site.name

    def action_url(name: str, shown: bool) -> str:
        return reverse(f"{site}:{APP}_workflowinstance_{name}", args=(quoted,)) if shown else ""

    child_urls = {child["parent_key"]: child["url"] for child in sections["children"]}
    return {
        **sections,
        "timeline": build_timeline(
            reads, obj, sections["history_count"], child_urls, values=values
        ),
        "unregistered": running and get_workflow(obj.workflow_name) is None,
        "empty_mark": format_html('<span class="selvedge-empty">{}</span>', EMPTY),
        "history_warning": sections["history_count"] > threshold,
        "history_threshold": threshold,
        "parent_url": model_admin.instance_url(obj.parent_instance_id)
        if obj.parent_instance_id
        else "",
        "cancel_url": action_url("cancel", running and has_permission(request, PERM_CANCEL)),
        "terminate_url": action_url(
            "terminate", running and has_permission(request, PERM_TERMINATE)
        ),
        "pause_url": action_url("pause", running and not paused and may_pause),
        "unpause_url": action_url("unpause", paused and may_pause),
        "resume_url": action_url("resume", not running and has_permission(request, PERM_RESUME)),
        "fork_url": action_url("fork", has_permission(request, PERM_FORK)),
        "signal_url": action_url("signal", running and has_permission(request, PERM_SIGNAL)),
        "export_url": action_url("export", has_permission(request, PERM_EXPORT)),
        "query_url": action_url("query", has_permission(request, PERM_QUERY)),
        "replay_check_url": action_url("replay_check", has_permission(request, PERM_REPLAY_CHECK)),
        # The live list of each open stream's new entries (values: view_payloads only).
        "stream_events_url": action_url("stream_events", sections["show_values"]),
    }
