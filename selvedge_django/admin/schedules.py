"""The admin of schedules: list, add, change, delete, pause, unpause and trigger now.

Every write goes through the operations layer (``create_schedule``,
``update_schedule``, ``delete_schedule``, ``pause_schedule``, ``unpause_schedule``,
``trigger_schedule``), the same code path as the client API and ``runselvedge
schedules``, and is recorded in the admin log. Adding, changing and deleting
need Django's model permissions; pausing and unpausing the change permission;
"trigger now" the ``trigger_schedule`` permission. A schedule's input, like any
recorded value, is shown and edited only with ``view_payloads``.

:class:`ScheduleAdmin` wires the module-level functions below: the columns, the
trigger, pause and unpause views (each taking the model admin first, routed in
``get_urls``) and the changelist actions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from .. import operations
from ..models import Schedule
from ..schedules import describe_row
from .base import (
    APP,
    PERM_TRIGGER,
    FreshReadsAdmin,
    extra_view,
    has_permission,
    instance_url,
    may_start_builtin,
    may_view_payloads,
)
from .display import (
    ID_CHARS,
    VALUE_CHARS,
    admin_reads,
    clear_value,
    database_alias,
    format_time,
    json_preview,
    ms_datetime,
    status_badge,
    truncate,
)
from .forms import ScheduleForm

__all__ = ["ScheduleAdmin", "ScheduleForm"]


def schedule_url(model_admin: admin.ModelAdmin[Any], obj: Schedule) -> str:
    """Return the URL of a schedule's admin page."""
    site = model_admin.admin_site.name
    return reverse(f"{site}:{APP}_schedule_change", args=(quote(obj.name),))


# -- columns ----------------------------------------------------------------------------------


@admin.display(description=_("when"))
def when(obj: Schedule) -> str:
    if obj.cron:
        return f"{obj.cron} ({obj.timezone})"
    seconds = (obj.interval_ms or 0) // 1000
    return gettext("every %(seconds)d s") % {"seconds": seconds}


@admin.display(description=_("next run"), ordering="next_due_ms")
def next_run(obj: Schedule) -> str | None:
    return None if obj.paused else format_time(ms_datetime(obj.next_due_ms)) or None


# -- views ------------------------------------------------------------------------------------


def _post_object(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, object_id: str, allowed: bool
) -> Schedule:
    if not allowed:
        raise PermissionDenied
    obj = model_admin.get_object(request, unquote(object_id))
    if obj is None:
        raise Http404(gettext("No schedule with this name."))
    return obj


def trigger_view(
    model_admin: ScheduleAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Start one run now (POST only)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    obj = _post_object(
        model_admin,
        request,
        object_id,
        model_admin.has_view_permission(request) and has_permission(request, PERM_TRIGGER),
    )
    perform_trigger(model_admin, request, obj)
    return HttpResponseRedirect(schedule_url(model_admin, obj))


def pause_view(
    model_admin: ScheduleAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Pause the schedule (POST only)."""
    return _pause_view(model_admin, request, object_id, True)


def unpause_view(
    model_admin: ScheduleAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Unpause the schedule (POST only)."""
    return _pause_view(model_admin, request, object_id, False)


def _pause_view(
    model_admin: ScheduleAdmin, request: HttpRequest, object_id: str, paused: bool
) -> HttpResponseBase:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    obj = _post_object(model_admin, request, object_id, model_admin.has_change_permission(request))
    perform_pause(model_admin, request, obj, paused)
    return HttpResponseRedirect(schedule_url(model_admin, obj))


# -- the operations, each logged ----------------------------------------------------------------


def perform_trigger(model_admin: ScheduleAdmin, request: HttpRequest, obj: Schedule) -> str | None:
    """Start one run of the schedule through the operations layer and log it."""
    if not may_start_builtin(request.user, obj.workflow_name):
        raise PermissionDenied(f"{obj.workflow_name} is a built-in workflow")
    try:
        run_id = operations.trigger_schedule(obj.name)
    except exc.SelvedgeError as error:
        model_admin.message_user(request, truncate(str(error), VALUE_CHARS), messages.ERROR)
        return None
    model_admin.log_change(request, obj, f"Triggered a run: {run_id}")  # the log stays in English
    model_admin.message_user(
        request,
        format_html(
            'Started <a href="{}">{}</a>.',
            model_admin.instance_url(run_id),
            truncate(run_id, ID_CHARS),
        ),
        messages.SUCCESS,
    )
    return run_id


def perform_pause(
    model_admin: ScheduleAdmin, request: HttpRequest, obj: Schedule, paused: bool
) -> None:
    """Pause or unpause the schedule through the operations layer and log it."""
    try:
        if paused:
            operations.pause_schedule(obj.name)
        else:
            operations.unpause_schedule(obj.name)
    except exc.SelvedgeError as error:
        model_admin.message_user(request, truncate(str(error), VALUE_CHARS), messages.ERROR)
        return
    model_admin.log_change(request, obj, "Paused." if paused else "Unpaused.")
    done = gettext("Paused %(name)s.") if paused else gettext("Unpaused %(name)s.")
    model_admin.message_user(request, done % {"name": truncate(obj.name, ID_CHARS)})


# -- changelist actions ---------------------------------------------------------------------------


@admin.action(description=_("Pause selected schedules"), permissions=["change"])
def pause_schedules(
    model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> None:
    """Pause each selected schedule (at most 1000)."""
    for obj in queryset[:1000]:
        perform_pause(model_admin, request, obj, True)


@admin.action(description=_("Unpause selected schedules"), permissions=["change"])
def unpause_schedules(
    model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> None:
    """Unpause each selected schedule (at most 1000)."""
    for obj in queryset[:1000]:
        perform_pause(model_admin, request, obj, False)


@admin.action(description=_("Trigger selected schedules now"), permissions=["trigger"])
def trigger_schedules(
    model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> None:
    """Start one run of each selected schedule now (at most 100)."""
    if not has_permission(request, PERM_TRIGGER):
        raise PermissionDenied
    for obj in queryset[:100]:
        perform_trigger(model_admin, request, obj)


# -- the model admin ------------------------------------------------------------------------------


@admin.register(Schedule)
class ScheduleAdmin(FreshReadsAdmin):
    """Schedules: their next and last run, recent runs, and the actions on them."""

    form = ScheduleForm
    # Names and display functions: Django takes both, django-stubs types names only.
    list_display: Any = (
        "name",
        "workflow_name",
        when,
        "overlap",
        "paused",
        next_run,
        "last_run",
        "runs_started",
        "missed_runs",
        "source",
    )
    list_filter = ("paused", "overlap", "source")
    search_fields = ("name",)
    ordering = ("name",)
    list_per_page = 100
    show_full_result_count = False
    actions = (pause_schedules, unpause_schedules, trigger_schedules)
    change_form_template = "admin/selvedge_django/schedule/change_form.html"
    fieldsets = (
        (None, {"fields": ("name", "workflow", "input")}),
        (_("When"), {"fields": ("cron", "interval", "timezone", "start_at", "end_at", "jitter")}),
        (_("Policies"), {"fields": ("overlap", "catchup_window", "paused")}),
    )

    def has_trigger_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_permission(request, PERM_TRIGGER)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if may_view_payloads(request):
            return self.fieldsets
        _, *rest = self.fieldsets
        return ((None, {"fields": ("name", "workflow")}), *rest)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        kwargs["fields"] = []  # the declared fields only: the instance is never written by the form
        form = super().get_form(request, obj, change=change, **kwargs)
        show = may_view_payloads(request)
        user = request.user

        class Bound(form):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **inner: Any) -> None:
                super().__init__(
                    *args,
                    show_input=show,
                    may_start=lambda name: may_start_builtin(user, name),
                    **inner,
                )

        return Bound

    @admin.display(description=_("last run"), ordering="last_run_ms")
    def last_run(self, obj: Schedule) -> str | None:
        if not obj.last_run_id:
            return None
        return format_html(
            '<a href="{}">{}</a>',
            self.instance_url(obj.last_run_id),
            format_time(ms_datetime(obj.last_run_ms)),
        )

    def instance_url(self, instance_id: str) -> str:
        """Return the URL of an instance's page on this admin site."""
        return instance_url(self.admin_site.name, instance_id)

    # -- add, change, delete through the operations layer -------------------------------

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        fields = form.schedule_fields()
        if change:
            operations.update_schedule(obj.name, **fields)
        else:
            operations.create_schedule(form.cleaned_data["name"], **fields)
            obj.name = form.cleaned_data["name"]
        # The operations layer wrote the row: reload it for the log entry and redirect that follow.
        obj.refresh_from_db(using=database_alias())

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        try:
            operations.delete_schedule(obj.name)
        except exc.ScheduleNotFound:
            pass  # deleted meanwhile

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)

    # -- the extra views and the detail page ----------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        def route(pattern: str, view: Callable[..., HttpResponseBase], name: str) -> URLPattern:
            return extra_view(self, pattern, view, name)

        return [
            route("<path:object_id>/trigger/", trigger_view, "trigger"),
            route("<path:object_id>/pause/", pause_view, "pause"),
            route("<path:object_id>/unpause/", unpause_view, "unpause"),
            *super().get_urls(),
        ]

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
    model_admin: ScheduleAdmin, request: HttpRequest, obj: Schedule
) -> dict[str, Any]:
    """The schedule's state and recent runs (one query for their statuses)."""
    described = describe_row(obj)
    ids = described.recent_instance_ids
    statuses = admin_reads().instance_statuses(ids)
    quoted = quote(obj.name)
    site = model_admin.admin_site.name
    can_change = model_admin.has_change_permission(request, obj)
    return {
        "description": described,
        "buffered": format_time(ms_datetime(obj.buffered_slot_ms)),
        "next_run_at": format_time(described.next_run_at),
        "next_slot_at": format_time(described.next_slot_at),
        "last_run_at": format_time(described.last_run_at),
        "input": json_preview(clear_value(obj.input)) if may_view_payloads(request) else None,
        "recent": [
            {
                "url": model_admin.instance_url(run_id),
                "label": truncate(run_id, ID_CHARS),
                "status": status_badge(statuses[run_id])
                if run_id in statuses
                else gettext("(deleted)"),
            }
            for run_id in ids
        ],
        "trigger_url": reverse(f"{site}:{APP}_schedule_trigger", args=(quoted,))
        if has_permission(request, PERM_TRIGGER)
        else "",
        "pause_url": reverse(f"{site}:{APP}_schedule_pause", args=(quoted,))
        if can_change and not obj.paused
        else "",
        "unpause_url": reverse(f"{site}:{APP}_schedule_unpause", args=(quoted,))
        if can_change and obj.paused
        else "",
    }
