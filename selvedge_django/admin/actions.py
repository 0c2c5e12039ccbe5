"""The instance actions of the admin: cancel, terminate, signal, export.

Every one calls the operations layer (the same code path as the client API and
``runselvedge``), is a POST with CSRF protection, and is written to the admin
log. A changelist action handles at most ``MAX_BATCH`` instances (``MAX_EXPORT``
for an export), and refuses up front what would write more than its cap.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
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
from django.utils.http import content_disposition_header
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from .. import operations
from ..models import WorkflowInstance, WorkflowStatus
from ..operations.recovery import TERMINATED_TYPE
from .base import APP, PERM_CANCEL, PERM_EXPORT, PERM_SIGNAL, PERM_TERMINATE, ReadOnlyAdmin
from .display import CELL_CHARS, ID_CHARS, VALUE_CHARS, admin_reads, safe_filename, truncate
from .forms import CancelForm, SignalForm, TerminateForm

# Most instances one changelist action handles at once.
MAX_BATCH = 1000
MAX_EXPORT = 100
# What one multi-instance export may hold (the stored values it would write, counted
# before anything is sent): the zip is streamed, but a larger one is refused up front.
MAX_EXPORT_BYTES = 256 * 1024 * 1024
# What one bulk signal may write in all: the encoded payload times the instances.
MAX_BULK_SIGNAL_BYTES = 16 * 1024 * 1024
TEMPLATE_DIR = "admin/selvedge_django/workflowinstance"
TERMINATE_INTRO = _(
    "Close these instances at once as failed, without running their code: their workers are"
    " fenced out, unfinished activity tasks are cancelled, timers are deleted and running"
    " children are asked to cancel. This cannot be undone."
)


@dataclass(frozen=True)
class BulkPlan:
    """What a bulk action does to each selected instance, shown before it is applied.

    ``skip(instance, form data)`` is why the instance is skipped, or None when the
    action applies to it (the form data is None on the confirmation page: the
    form's defaults); ``applied`` names what happens to the others ("Resumed");
    ``summary(applied, skipped)`` sums it up.
    """

    skip: Callable[[WorkflowInstance, dict[str, Any] | None], str | None]
    applied: str
    summary: Callable[[int, int], str]


def status_label(obj: WorkflowInstance) -> str:
    """An instance's status as the admin shows it, a terminated run told apart."""
    if obj.status == WorkflowStatus.FAILED and obj.error_type == TERMINATED_TYPE:
        return gettext("Failed (terminated)")
    return str(obj.get_status_display())


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


class InstanceActionsAdmin(ReadOnlyAdmin):
    """The instance actions: cancel, terminate, signal and export, each through operations.

    Each exists as a changelist action (cancel and terminate ask for the reason,
    signal for the channel and payload, on an intermediate page) and as a view
    under the instance's own URL, the buttons of its page. Each needs its own
    permission besides view access and is written to the admin log.
    """

    action_template = f"{TEMPLATE_DIR}/action.html"

    # -- permissions ------------------------------------------------------------------

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_CANCEL)

    def has_terminate_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_TERMINATE)

    def has_signal_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_SIGNAL)

    def has_export_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERM_EXPORT)

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
        from ..operations import export_history

        redact = not self.has_payloads_permission(request)
        text = export_history(obj.instance_id, redact=redact).to_json(indent=2)
        self.log_change(
            request, obj, "Exported the history (redacted)." if redact else "Exported the history."
        )
        return text

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
        cap = MAX_EXPORT_BYTES
        size = admin_reads().export_size([obj.instance_id for obj in targets])
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
        cap = MAX_BULK_SIGNAL_BYTES
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
        plan: BulkPlan | None = None,
        title: str,
        intro: str,
        submit: str,
        done: Callable[[int], str],
    ) -> HttpResponseBase | None:
        """Show the action's form for the selection, then apply it to each instance.

        ``plan``, when given, skips the instances it gives a reason for, and the
        confirmation page shows each selected instance's status and what will
        happen to it.
        """
        targets = list(queryset.only("instance_id", "status", "error_type")[: MAX_BATCH + 1])
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
                skip = None if plan is None else plan.skip(obj, form.cleaned_data)
                if skip is not None:
                    failed.append(truncate(f"{obj.instance_id}: {skip}", CELL_CHARS))
                    continue
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
        extra = None
        if plan is not None:
            data = form.cleaned_data if form.is_bound and form.is_valid() else None
            rows = [(obj, plan.skip(obj, data)) for obj in targets]
            skipped = sum(1 for _, skip in rows if skip is not None)
            extra = {
                "plan": [
                    {
                        "url": self.instance_url(obj.instance_id),
                        "label": truncate(obj.instance_id, ID_CHARS),
                        "status": status_label(obj),
                        "outcome": plan.applied
                        if skip is None
                        else gettext("Skipped: %(why)s") % {"why": skip},
                    }
                    for obj, skip in rows
                ],
                "plan_summary": plan.summary(len(rows) - skipped, skipped),
            }
        return self.render_action_page(
            request,
            form,
            title=title,
            intro=intro,
            submit=submit,
            objects=targets,
            hidden=hidden,
            extra=extra,
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
        extra: dict[str, Any] | None = None,
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
            **(extra or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.action_template, context)
