"""The admin console: read-only models, actions through the operations layer.

Nothing here edits a row by hand. Cancelling, terminating, signalling and
exporting call the operations layer (the same code path as the client API and
``runselvedge``), need their own permission (``cancel_workflowinstance``,
``terminate_workflowinstance``, ``signal_workflowinstance``, ``export_history``)
besides view access, are POSTs with CSRF protection, and are written to the admin
log. Recorded values (inputs, outputs, errors' messages, history values, signal
payloads) are shown, and exported unredacted, only to users with the
``view_payloads`` permission. They exist as changelist actions (cancel and
terminate ask for the reason, signal for the channel and payload, on an
intermediate page) and as buttons on an instance's page (extra URLs under the
instance's own).

Stored values are escaped and truncated wherever they are shown, and the
changelist stays cheap on large tables: no per-row queries, no unbounded
``SELECT DISTINCT`` for the filters, no full-table count.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet, Sum, TextField, Value
from django.db.models.functions import Cast, Coalesce, Length
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import content_disposition_header
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from .. import operations
from ..conf import get_settings
from ..models import ActivityTask, HistoryEvent, SystemLock, WorkflowInstance, WorkflowStatus
from ..registry import get_workflow
from . import display
from .display import (
    CELL_CHARS,
    EMPTY,
    ID_CHARS,
    MAX_BATCH,
    MAX_EXPORT,
    VALUE_CHARS,
    CancelForm,
    InstanceChangeList,
    SignalForm,
    TerminateForm,
    WorkflowNameFilter,
    database_alias,
    error_head_summary,
    error_summary,
    format_duration,
    instance_sections,
    json_preview,
    ms_datetime,
    safe_filename,
    truncate,
)

APP = "selvedge_django"
PERM_CANCEL = f"{APP}.cancel_workflowinstance"
PERM_SIGNAL = f"{APP}.signal_workflowinstance"
PERM_TERMINATE = f"{APP}.terminate_workflowinstance"
PERM_EXPORT = f"{APP}.export_history"
PERM_PAYLOADS = f"{APP}.view_payloads"
TEMPLATE_DIR = "admin/selvedge_django/workflowinstance"
TERMINATE_INTRO = _(
    "Close these instances at once as failed, without running their code: their workers are"
    " fenced out, unfinished activity tasks are cancelled, timers are deleted and running"
    " children are asked to cancel. This cannot be undone."
)


# -- shared admin behaviour -----------------------------------------------------------


def hidden(size: int | None) -> str:
    """What a user without ``view_payloads`` sees instead of a value."""
    return format_html(
        '<span class="selvedge-empty">{}</span>',
        gettext("(hidden: %(n)d characters; showing values needs the view_payloads permission)")
        % {"n": size or 0},
    )


class _Sink:
    """A write-only file for a streamed zip: what was written since the last take()."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        return None

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


class ReadOnlyAdmin(admin.ModelAdmin):
    """Views only: nothing is added, changed or deleted by hand."""

    def has_payloads_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_PAYLOADS)

    show_full_result_count = False
    empty_value_display = EMPTY

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(database_alias())

    def instance_url(self, instance_id: str) -> str:
        return reverse(
            f"{self.admin_site.name}:{APP}_workflowinstance_change", args=(quote(instance_id),)
        )

    def instance_link(self, instance_id: str) -> str:
        if not instance_id:
            return ""
        return format_html(
            '<a href="{}">{}</a>', self.instance_url(instance_id), truncate(instance_id, ID_CHARS)
        )


# -- workflow instances -------------------------------------------------------------------


@admin.register(WorkflowInstance)
class WorkflowInstanceAdmin(ReadOnlyAdmin):
    """Instances: list, detail (history, tasks, timers, signals, children) and actions."""

    list_display = (
        "instance",
        "workflow",
        "status",
        "cancel_requested",
        "started_at",
        "duration",
        "closed_at",
        "error_column",
        "parent",
    )
    list_display_links = ("instance",)
    # Only the columns an index can order: sorting 100,000 rows by anything else is slow.
    sortable_by = ("instance", "workflow", "started_at", "closed_at")
    list_filter = ("status", WorkflowNameFilter, ("started_at", admin.DateFieldListFilter))
    search_fields = ("instance_id",)
    search_help_text = _("An exact instance id, or part of one (ignoring case).")
    ordering = ("-started_at", "-instance_id")
    list_per_page = 100
    actions = ("cancel_instances", "terminate_instances", "signal_instances", "export_instances")
    change_form_template = f"{TEMPLATE_DIR}/change_form.html"
    action_template = f"{TEMPLATE_DIR}/action.html"
    fieldsets = (
        (
            _("Description"),
            {
                "fields": (
                    "instance_id",
                    "workflow_name",
                    "status",
                    "cancel_requested",
                    "reason",
                    "parent",
                    "parent_key",
                    "service_name",
                    "current_step",
                    "started_at",
                    "updated_at",
                    "closed_at",
                )
            },
        ),
        (
            _("Values"),
            {"fields": ("input_value", "output_value", "error_value", "storage_error_value")},
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
    hidden_values = ("hidden_input", "hidden_output", "hidden_error")
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

    # -- permissions ------------------------------------------------------------------

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_CANCEL)

    def has_terminate_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_TERMINATE)

    def has_signal_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_SIGNAL)

    def has_export_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_EXPORT)

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
        if not obj.error:
            return None
        return format_html(
            "<strong>{}</strong><br><code>{}</code>",
            error_summary(obj.error, VALUE_CHARS),
            truncate(obj.error, VALUE_CHARS),
        )

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
    def lease_expiry(self, obj: WorkflowInstance) -> datetime | None:
        return ms_datetime(obj.lease_expires_ms)

    @admin.display(description=_("held back until"))
    def held_back_until(self, obj: WorkflowInstance) -> datetime | None:
        """When an instance held back after storage errors may be dispatched again."""
        if not obj.execution_errors or obj.status != WorkflowStatus.RUNNING:
            return None
        return ms_datetime(obj.ready_ms)

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
        alias = database_alias()
        iid = obj.instance_id
        running = obj.status == WorkflowStatus.RUNNING
        threshold = get_settings().history_warning_threshold

        sections = instance_sections(
            alias, iid, self.instance_url, values=self.has_payloads_permission(request)
        )
        quoted = quote(iid)
        site = self.admin_site.name
        return {
            **sections,
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
            "signal_url": reverse(f"{site}:{APP}_workflowinstance_signal", args=(quoted,))
            if running and self.has_signal_permission(request)
            else "",
            "export_url": reverse(f"{site}:{APP}_workflowinstance_export", args=(quoted,))
            if self.has_export_permission(request)
            else "",
        }

    # -- per-instance action views ----------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = (self.opts.app_label, self.opts.model_name)
        view = self.admin_site.admin_view
        # Before the defaults: their "<path:object_id>/" catch-all would match first.
        return [
            path(
                "<path:object_id>/cancel/",
                view(self.cancel_view),
                name="{}_{}_cancel".format(*info),
            ),
            path(
                "<path:object_id>/terminate/",
                view(self.terminate_view),
                name="{}_{}_terminate".format(*info),
            ),
            path(
                "<path:object_id>/signal/",
                view(self.signal_view),
                name="{}_{}_signal".format(*info),
            ),
            path(
                "<path:object_id>/export/",
                view(self.export_view),
                name="{}_{}_export".format(*info),
            ),
            *super().get_urls(),
        ]

    def _action_object(
        self,
        request: HttpRequest,
        object_id: str,
        allowed: Callable[[HttpRequest], bool],
    ) -> WorkflowInstance:
        if not (self.has_view_permission(request) and allowed(request)):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(gettext("No workflow instance with this id."))
        return obj

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """Ask for a reason (GET), then request cancellation (POST)."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        obj = self._action_object(request, object_id, self.has_cancel_permission)
        form = CancelForm(request.POST if request.method == "POST" else None)
        if form.is_bound and form.is_valid():
            try:
                self.perform_cancel(request, obj, form.cleaned_data)
            except exc.SelvedgeError as error:
                form.add_error(None, truncate(str(error), VALUE_CHARS))
            else:
                self.message_user(
                    request,
                    gettext("Cancellation requested for %(id)s.")
                    % {"id": truncate(obj.instance_id, ID_CHARS)},
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(self.instance_url(obj.instance_id))
        return self.render_action_page(
            request,
            form,
            title=gettext("Cancel workflow instance"),
            intro=gettext("Request cancellation of this instance; it stops at its next wait."),
            submit=gettext("Request cancellation"),
            objects=[obj],
            object_url=self.instance_url(obj.instance_id),
        )

    def terminate_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """Ask for a reason (GET), then terminate the instance (POST)."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        obj = self._action_object(request, object_id, self.has_terminate_permission)
        form = TerminateForm(request.POST if request.method == "POST" else None)
        if form.is_bound and form.is_valid():
            try:
                self.perform_terminate(request, obj, form.cleaned_data)
            except exc.SelvedgeError as error:
                form.add_error(None, truncate(str(error), VALUE_CHARS))
            else:
                self.message_user(
                    request,
                    gettext("Terminated %(id)s.") % {"id": truncate(obj.instance_id, ID_CHARS)},
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(self.instance_url(obj.instance_id))
        return self.render_action_page(
            request,
            form,
            title=gettext("Terminate workflow instance"),
            intro=str(TERMINATE_INTRO),
            submit=gettext("Terminate"),
            objects=[obj],
            object_url=self.instance_url(obj.instance_id),
        )

    def signal_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """Ask for a channel and JSON payload (GET), then send the signal (POST)."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        obj = self._action_object(request, object_id, self.has_signal_permission)
        form = SignalForm(request.POST if request.method == "POST" else None)
        if form.is_bound and form.is_valid():
            try:
                self.perform_signal(request, obj, form.cleaned_data)
            except exc.SelvedgeError as error:
                form.add_error(None, truncate(str(error), VALUE_CHARS))
            else:
                self.message_user(
                    request,
                    gettext("Signal sent to %(id)s on channel %(channel)r.")
                    % {
                        "id": truncate(obj.instance_id, ID_CHARS),
                        "channel": truncate(form.cleaned_data["channel"], ID_CHARS),
                    },
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(self.instance_url(obj.instance_id))
        return self.render_action_page(
            request,
            form,
            title=gettext("Send a signal"),
            intro=gettext("Append a signal to this instance's inbox and wake it."),
            submit=gettext("Send signal"),
            objects=[obj],
            object_url=self.instance_url(obj.instance_id),
        )

    def export_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """Download the instance's history as ``selvedge.history/v1`` JSON (POST only)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self._action_object(request, object_id, self.has_export_permission)
        try:
            text = self.perform_export(request, obj)
        except exc.WorkflowNotFound:
            raise Http404(gettext("No workflow instance with this id."))
        return self.download(text, f"selvedge-history-{safe_filename(obj.instance_id)}.json")

    # -- the operations, each logged ---------------------------------------------------

    def perform_cancel(
        self, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
    ) -> None:
        reason = data.get("reason") or ""
        operations.cancel_workflow(obj.instance_id, reason)
        self.log_change(request, obj, f"Requested cancellation. Reason: {reason!r}")

    def perform_terminate(
        self, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
    ) -> None:
        reason = data.get("reason") or ""
        try:
            operations.terminate_workflow(obj.instance_id, reason)
        except ValueError as error:  # a reason the database cannot store (NUL)
            raise exc.SelvedgeError(str(error)) from error
        self.log_change(request, obj, f"Terminated. Reason: {reason!r}")

    def perform_signal(
        self, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
    ) -> None:
        operations.signal(obj.instance_id, data["channel"], data["payload"])
        # The payload stays out of the log, as it stays out of history exports.
        self.log_change(request, obj, f"Sent a signal on channel {data['channel']!r}.")

    def perform_export(self, request: HttpRequest, obj: WorkflowInstance) -> str:
        """Export one history: redacted unless the user may view payloads."""
        from ..history import export_history

        redact = not self.has_payloads_permission(request)
        text = export_history(obj.instance_id, redact=redact).to_json(indent=2)
        self.log_change(
            request, obj, "Exported the history (redacted)." if redact else "Exported the history."
        )
        return text

    @staticmethod
    def export_size(alias: str, instance_ids: list[str]) -> int:
        """The characters of stored values an export of these instances would write."""

        def total(queryset: QuerySet[Any], *columns: Any) -> int:
            sizes = [Coalesce(Length(column), Value(0)) for column in columns]
            expression: Any = sizes[0]
            for size in sizes[1:]:
                expression = expression + size
            return int(queryset.aggregate(n=Sum(expression))["n"] or 0)

        instances = WorkflowInstance.objects.using(alias).filter(instance_id__in=instance_ids)
        history = HistoryEvent.objects.using(alias).filter(instance_id__in=instance_ids)
        return total(
            instances, Cast("input", TextField()), "output", "error", "cancel_reason"
        ) + total(history, "data", "reservation")

    @staticmethod
    def download(content: str | bytes, filename: str, content_type: str = "") -> HttpResponse:
        response = HttpResponse(
            content, content_type=content_type or "application/json; charset=utf-8"
        )
        response["Content-Disposition"] = content_disposition_header(True, filename)
        response["X-Content-Type-Options"] = "nosniff"
        return response

    # -- changelist actions ------------------------------------------------------------

    @admin.action(description=_("Cancel selected instances\u2026"), permissions=["cancel"])
    def cancel_instances(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        return self.bulk_action(
            request,
            queryset,
            "cancel_instances",
            CancelForm,
            self.perform_cancel,
            title=gettext("Cancel workflow instances"),
            intro=gettext("Request cancellation of these instances; each stops at its next wait."),
            submit=gettext("Request cancellation"),
            done=lambda n: (
                ngettext(
                    "Cancellation requested for %(n)d instance.",
                    "Cancellation requested for %(n)d instances.",
                    n,
                )
                % {"n": n}
            ),
        )

    @admin.action(description=_("Terminate selected instances\u2026"), permissions=["terminate"])
    def terminate_instances(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        if not self.has_terminate_permission(request):
            raise PermissionDenied
        return self.bulk_action(
            request,
            queryset,
            "terminate_instances",
            TerminateForm,
            self.perform_terminate,
            title=gettext("Terminate workflow instances"),
            intro=str(TERMINATE_INTRO),
            submit=gettext("Terminate"),
            done=lambda n: (
                ngettext("Terminated %(n)d instance.", "Terminated %(n)d instances.", n) % {"n": n}
            ),
        )

    @admin.action(
        description=_("Send a signal to selected instances\u2026"), permissions=["signal"]
    )
    def signal_instances(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        if not self.has_signal_permission(request):
            raise PermissionDenied
        return self.bulk_action(
            request,
            queryset,
            "signal_instances",
            SignalForm,
            self.perform_signal,
            check=self.bulk_signal_problem,
            title=gettext("Send a signal"),
            intro=gettext("Append the same signal to each of these instances' inboxes."),
            submit=gettext("Send signal"),
            done=lambda n: (
                ngettext("Signal sent to %(n)d instance.", "Signal sent to %(n)d instances.", n)
                % {"n": n}
            ),
        )

    @admin.action(description=_("Export history of selected instances"), permissions=["export"])
    def export_instances(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        if not self.has_export_permission(request):
            raise PermissionDenied
        targets = list(queryset.only("instance_id")[: MAX_EXPORT + 1])
        if len(targets) > MAX_EXPORT:
            self.message_user(
                request,
                gettext("Export at most %(n)d instances at a time.") % {"n": MAX_EXPORT},
                messages.ERROR,
            )
            return None
        if not targets:
            self.message_user(request, gettext("Nothing to export."), messages.WARNING)
            return None
        cap = display.MAX_EXPORT_BYTES
        size = self.export_size(database_alias(), [obj.instance_id for obj in targets])
        if size > cap:
            self.message_user(
                request,
                gettext(
                    "These histories hold %(size)d bytes of values; one export writes at most"
                    " %(cap)d bytes. Export fewer instances at a time."
                )
                % {"size": size, "cap": cap},
                messages.ERROR,
            )
            return None
        if len(targets) == 1:
            (obj,) = targets
            try:
                text = self.perform_export(request, obj)
            except exc.WorkflowNotFound:
                self.message_user(request, gettext("Nothing to export."), messages.WARNING)
                return None
            return self.download(text, f"selvedge-history-{safe_filename(obj.instance_id)}.json")
        response = StreamingHttpResponse(
            self._zipped(request, targets), content_type="application/zip"
        )
        response["Content-Disposition"] = content_disposition_header(True, "selvedge-histories.zip")
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def _zipped(self, request: HttpRequest, targets: list[WorkflowInstance]) -> Iterator[bytes]:
        """The zip of the targets' histories, one history in memory at a time."""
        sink = _Sink()
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as archive:  # type: ignore[call-overload]
            for number, obj in enumerate(targets, 1):
                try:
                    text = self.perform_export(request, obj)
                except exc.WorkflowNotFound:
                    continue  # deleted (pruned) since the selection
                archive.writestr(f"{number:03d}-{safe_filename(obj.instance_id)}.json", text)
                yield sink.take()
        yield sink.take()

    @staticmethod
    def bulk_signal_problem(data: dict[str, Any], targets: list[WorkflowInstance]) -> str | None:
        """Refuse a bulk signal whose payload times its targets passes the cap."""
        size = len(json.dumps(data["payload"], separators=(",", ":"), ensure_ascii=False).encode())
        cap = display.MAX_BULK_SIGNAL_BYTES
        if size * len(targets) <= cap:
            return None
        return gettext(
            "A payload of %(size)d bytes sent to %(n)d instances writes %(total)d bytes; one"
            " bulk signal writes at most %(cap)d bytes. Select fewer instances or send a smaller"
            " payload."
        ) % {"size": size, "n": len(targets), "total": size * len(targets), "cap": cap}

    def bulk_action(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        action: str,
        form_class: type[forms.Form],
        perform: Callable[[HttpRequest, WorkflowInstance, dict[str, Any]], None],
        *,
        check: Callable[[dict[str, Any], list[WorkflowInstance]], str | None] | None = None,
        title: str,
        intro: str,
        submit: str,
        done: Callable[[int], str],
    ) -> HttpResponseBase | None:
        """Show the action's form for the selection, then apply it to each instance."""
        targets = list(queryset.only("instance_id", "status")[: MAX_BATCH + 1])
        if len(targets) > MAX_BATCH:
            self.message_user(
                request,
                gettext("Select at most %(n)d instances at a time.") % {"n": MAX_BATCH},
                messages.ERROR,
            )
            return None
        form = form_class(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid() and check is not None:
            problem = check(form.cleaned_data, targets)
            if problem:
                form.add_error(None, problem)
        if form.is_bound and form.is_valid():
            applied = 0
            failed: list[str] = []
            for obj in targets:
                try:
                    perform(request, obj, form.cleaned_data)
                except exc.SelvedgeError as error:
                    failed.append(truncate(str(error), CELL_CHARS))
                else:
                    applied += 1
            if applied:
                self.message_user(request, done(applied), messages.SUCCESS)
            if failed:
                shown = "; ".join(failed[:5]) + ("; \u2026" if len(failed) > 5 else "")
                self.message_user(
                    request,
                    ngettext(
                        "%(n)d instance skipped: %(why)s",
                        "%(n)d instances skipped: %(why)s",
                        len(failed),
                    )
                    % {"n": len(failed), "why": shown},
                    messages.WARNING,
                )
            return None
        hidden = [("action", action), ("select_across", request.POST.get("select_across", "0"))]
        hidden += [
            (helpers.ACTION_CHECKBOX_NAME, pk)
            for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        ]
        return self.render_action_page(
            request,
            form,
            title=title,
            intro=intro,
            submit=submit,
            objects=targets,
            hidden=hidden,
        )

    def render_action_page(
        self,
        request: HttpRequest,
        form: forms.Form,
        *,
        title: str,
        intro: str,
        submit: str,
        objects: Iterable[WorkflowInstance],
        object_url: str = "",
        hidden: list[tuple[str, str]] | None = None,
    ) -> TemplateResponse:
        """Render an action's form page (per instance, or the changelist's intermediate page)."""
        objects = list(objects)
        changelist_url = reverse(f"{self.admin_site.name}:{APP}_workflowinstance_changelist")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "intro": intro,
            "submit": submit,
            "form": form,
            "targets": [
                {
                    "url": self.instance_url(obj.instance_id),
                    "label": truncate(obj.instance_id, ID_CHARS),
                }
                for obj in objects[:50]
            ],
            "more_targets": max(0, len(objects) - 50),
            "object_url": object_url,
            "object_label": truncate(objects[0].instance_id, ID_CHARS) if object_url else "",
            "back_url": object_url or request.get_full_path() or changelist_url,
            "hidden": [*(hidden or []), ("apply", "1")],
            "media": self.media + form.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.action_template, context)


# -- activity tasks and locks ---------------------------------------------------------


@admin.register(ActivityTask)
class ActivityTaskAdmin(ReadOnlyAdmin):
    """Activity tasks across instances; search by exact instance id."""

    list_display = (
        "task",
        "instance_column",
        "name",
        "queue",
        "status",
        "attempts",
        "failures",
        "updated_at",
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
        "status",
        "attempts",
        "failures",
        "max_attempts",
        "options_value",
        "input_value",
        "error_value",
        "created_at",
        "updated_at",
    )
    readonly_fields = (*fields, "hidden_input", "hidden_error")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.has_payloads_permission(request):
            return self.fields
        swap = {"input_value": "hidden_input", "error_value": "hidden_error"}
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

    @admin.display(description=_("options"))
    def options_value(self, obj: ActivityTask) -> str:
        return format_html("<code>{}</code>", json_preview(obj.options))

    @admin.display(description=_("input"))
    def input_value(self, obj: ActivityTask) -> str:
        return format_html("<code>{}</code>", truncate(obj.input, VALUE_CHARS))

    @admin.display(description=_("last error"))
    def error_value(self, obj: ActivityTask) -> str:
        return error_summary(obj.last_error, VALUE_CHARS)

    @admin.display(description=_("input"))
    def hidden_input(self, obj: ActivityTask) -> str:
        return hidden(len(obj.input or ""))

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
    def expires(self, obj: SystemLock) -> datetime | None:
        return ms_datetime(obj.expires_ms or None)
