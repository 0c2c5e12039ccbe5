"""The admin of schedules: list, add, change, delete, pause, unpause and trigger now.

Every write goes through the operations layer (``create_schedule``,
``update_schedule``, ``delete_schedule``, ``pause_schedule``, ``unpause_schedule``,
``trigger_schedule``), the same code path as the client API and ``runselvedge
schedules``, and is recorded in the admin log. Adding, changing and deleting
need Django's model permissions; pausing and unpausing the change permission;
"trigger now" the ``trigger_schedule`` permission. A schedule's input, like any
recorded value, is shown and edited only with ``view_payloads``.
"""

from __future__ import annotations

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
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from .. import operations
from ..models import Schedule
from ..schedules import describe_row
from .base import APP, PERM_PAYLOADS, PERM_TRIGGER, instance_url, may_start_builtin
from .display import (
    ID_CHARS,
    VALUE_CHARS,
    admin_reads,
    database_alias,
    format_time,
    json_preview,
    ms_datetime,
    status_badge,
    truncate,
)
from .forms import ScheduleForm

__all__ = ["ScheduleAdmin", "ScheduleForm"]


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Schedules: their next and last run, recent runs, and the actions on them."""

    form = ScheduleForm
    list_display = (
        "name",
        "workflow_name",
        "when",
        "overlap",
        "paused",
        "next_run",
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
    actions = ("pause_schedules", "unpause_schedules", "trigger_schedules")
    change_form_template = "admin/selvedge_django/schedule/change_form.html"
    fieldsets = (
        (None, {"fields": ("name", "workflow", "input")}),
        (_("When"), {"fields": ("cron", "interval", "timezone", "start_at", "end_at", "jitter")}),
        (_("Policies"), {"fields": ("overlap", "catchup_window", "paused")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(database_alias())

    def has_trigger_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_TRIGGER)

    def has_payloads_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERM_PAYLOADS)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.has_payloads_permission(request):
            return self.fieldsets
        _, *rest = self.fieldsets
        return ((None, {"fields": ("name", "workflow")}), *rest)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        kwargs["fields"] = []  # the declared fields only: the instance is never written by the form
        form = super().get_form(request, obj, change=change, **kwargs)
        show = self.has_payloads_permission(request)
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

    # -- columns ----------------------------------------------------------------------

    @admin.display(description=_("when"))
    def when(self, obj: Schedule) -> str:
        if obj.cron:
            return f"{obj.cron} ({obj.timezone})"
        seconds = (obj.interval_ms or 0) // 1000
        return gettext("every %(seconds)d s") % {"seconds": seconds}

    @admin.display(description=_("next run"), ordering="next_due_ms")
    def next_run(self, obj: Schedule) -> str | None:
        return None if obj.paused else format_time(ms_datetime(obj.next_due_ms)) or None

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
        return instance_url(self.admin_site.name, instance_id)

    # -- add, change, delete through the operations layer -------------------------------

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        fields = form.schedule_fields()
        if change:
            operations.update_schedule(obj.name, **fields)
        else:
            operations.create_schedule(form.cleaned_data["name"], **fields)
            obj.name = form.cleaned_data["name"]
        obj.refresh_from_db(using=database_alias())

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        try:
            operations.delete_schedule(obj.name)
        except exc.ScheduleNotFound:
            pass  # deleted meanwhile

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)

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
            context["selvedge"] = self.detail_context(request, obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def detail_context(self, request: HttpRequest, obj: Schedule) -> dict[str, Any]:
        """The schedule's state and recent runs (one query for their statuses)."""
        described = describe_row(obj)
        ids = described.recent_instance_ids
        statuses = admin_reads().instance_statuses(ids)
        quoted = quote(obj.name)
        site = self.admin_site.name
        can_change = self.has_change_permission(request, obj)
        return {
            "description": described,
            "buffered": format_time(ms_datetime(obj.buffered_slot_ms)),
            "next_run_at": format_time(described.next_run_at),
            "next_slot_at": format_time(described.next_slot_at),
            "last_run_at": format_time(described.last_run_at),
            "input": json_preview(obj.input) if self.has_payloads_permission(request) else None,
            "recent": [
                {
                    "url": self.instance_url(run_id),
                    "label": truncate(run_id, ID_CHARS),
                    "status": status_badge(statuses[run_id])
                    if run_id in statuses
                    else gettext("(deleted)"),
                }
                for run_id in ids
            ],
            "trigger_url": reverse(f"{site}:{APP}_schedule_trigger", args=(quoted,))
            if self.has_trigger_permission(request)
            else "",
            "pause_url": reverse(f"{site}:{APP}_schedule_pause", args=(quoted,))
            if can_change and not obj.paused
            else "",
            "unpause_url": reverse(f"{site}:{APP}_schedule_unpause", args=(quoted,))
            if can_change and obj.paused
            else "",
        }

    def get_urls(self) -> list[URLPattern]:
        info = (self.opts.app_label, self.opts.model_name)
        view = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/trigger/",
                view(self.trigger_view),
                name="{}_{}_trigger".format(*info),
            ),
            path(
                "<path:object_id>/pause/", view(self.pause_view), name="{}_{}_pause".format(*info)
            ),
            path(
                "<path:object_id>/unpause/",
                view(self.unpause_view),
                name="{}_{}_unpause".format(*info),
            ),
            *super().get_urls(),
        ]

    def _post_object(self, request: HttpRequest, object_id: str, allowed: bool) -> Schedule:
        if not allowed:
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(gettext("No schedule with this name."))
        return obj

    def _back(self, obj: Schedule) -> HttpResponseRedirect:
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:{APP}_schedule_change", args=(quote(obj.name),))
        )

    def trigger_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """Start one run now (POST only)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self._post_object(
            request,
            object_id,
            self.has_view_permission(request) and self.has_trigger_permission(request),
        )
        self.perform_trigger(request, obj)
        return self._back(obj)

    def pause_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        return self._pause_view(request, object_id, True)

    def unpause_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        return self._pause_view(request, object_id, False)

    def _pause_view(self, request: HttpRequest, object_id: str, paused: bool) -> HttpResponseBase:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self._post_object(request, object_id, self.has_change_permission(request))
        self.perform_pause(request, obj, paused)
        return self._back(obj)

    # -- the operations, each logged ------------------------------------------------------

    def perform_trigger(self, request: HttpRequest, obj: Schedule) -> str | None:
        if not may_start_builtin(request.user, obj.workflow_name):
            raise PermissionDenied(f"{obj.workflow_name} is a built-in workflow")
        try:
            run_id = operations.trigger_schedule(obj.name)
        except exc.SelvedgeError as error:
            self.message_user(request, truncate(str(error), VALUE_CHARS), messages.ERROR)
            return None
        self.log_change(request, obj, f"Triggered a run: {run_id}")  # the log stays in English
        self.message_user(
            request,
            format_html(
                'Started <a href="{}">{}</a>.',
                self.instance_url(run_id),
                truncate(run_id, ID_CHARS),
            ),
            messages.SUCCESS,
        )
        return run_id

    def perform_pause(self, request: HttpRequest, obj: Schedule, paused: bool) -> None:
        try:
            if paused:
                operations.pause_schedule(obj.name)
            else:
                operations.unpause_schedule(obj.name)
        except exc.SelvedgeError as error:
            self.message_user(request, truncate(str(error), VALUE_CHARS), messages.ERROR)
            return
        self.log_change(request, obj, "Paused." if paused else "Unpaused.")
        done = gettext("Paused %(name)s.") if paused else gettext("Unpaused %(name)s.")
        self.message_user(request, done % {"name": truncate(obj.name, ID_CHARS)})

    # -- changelist actions ----------------------------------------------------------------

    @admin.action(description=_("Pause selected schedules"), permissions=["change"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset[:1000]:
            self.perform_pause(request, obj, True)

    @admin.action(description=_("Unpause selected schedules"), permissions=["change"])
    def unpause_schedules(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset[:1000]:
            self.perform_pause(request, obj, False)

    @admin.action(description=_("Trigger selected schedules now"), permissions=["trigger"])
    def trigger_schedules(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        if not self.has_trigger_permission(request):
            raise PermissionDenied
        for obj in queryset[:100]:
            self.perform_trigger(request, obj)
