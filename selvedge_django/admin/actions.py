"""The instance actions of the admin: cancel, terminate, signal, export.

Every one calls the operations layer (the same code path as the client API and
``runselvedge``), is a POST with CSRF protection, and is written to the admin
log. Each exists as a changelist action (cancel and terminate ask for the reason,
signal for the channel and payload, on an intermediate page) and as a view under
the instance's own URL, the buttons of its page; each needs its own permission
besides view access. A changelist action handles at most
:data:`~.pages.MAX_BATCH` instances (``MAX_EXPORT`` for an export), and refuses
up front what would write more than its cap.

Everything here is a module-level function taking the model admin it serves
first; :class:`~.instances.WorkflowInstanceAdmin` wires the views into its URLs
and the ``@admin.action`` functions into its actions.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponseBase,
    HttpResponseNotAllowed,
    StreamingHttpResponse,
)
from django.utils.http import content_disposition_header
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from .. import operations
from ..models import WorkflowInstance
from .base import (
    PERM_CANCEL,
    PERM_EXPORT,
    PERM_SIGNAL,
    PERM_TERMINATE,
    ReadOnlyAdmin,
    has_permission,
    may_view_payloads,
)
from .display import ID_CHARS, admin_reads, safe_filename, truncate
from .forms import CancelForm, SignalForm, TerminateForm
from .pages import action_object, bulk_action, download, instance_action_view

# Most instances one export handles at once.
MAX_EXPORT = 100
# What one multi-instance export may hold (the stored values it would write, counted
# before anything is sent): the zip is streamed, but a larger one is refused up front.
MAX_EXPORT_BYTES = 256 * 1024 * 1024
# What one bulk signal may write in all: the encoded payload times the instances.
MAX_BULK_SIGNAL_BYTES = 16 * 1024 * 1024
TERMINATE_INTRO = _(
    "Close these instances at once as failed, without running their code: their workers are"
    " fenced out, unfinished activity tasks are cancelled, timers are deleted and running"
    " children are asked to cancel. This cannot be undone."
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


# -- per-instance action views ------------------------------------------------------------


def cancel_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Ask for a reason (GET), then request cancellation (POST)."""
    return instance_action_view(
        model_admin,
        request,
        object_id,
        permission=PERM_CANCEL,
        form_class=CancelForm,
        perform=perform_cancel,
        done=lambda obj, data, shown: (
            gettext("Cancellation requested for %(id)s.")
            % {"id": truncate(obj.instance_id, ID_CHARS)}
        ),
        title=gettext("Cancel workflow instance"),
        intro=gettext("Request cancellation of this instance; it stops at its next wait."),
        submit=gettext("Request cancellation"),
    )


def terminate_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Ask for a reason (GET), then terminate the instance (POST)."""
    return instance_action_view(
        model_admin,
        request,
        object_id,
        permission=PERM_TERMINATE,
        form_class=TerminateForm,
        perform=perform_terminate,
        done=lambda obj, data, shown: (
            gettext("Terminated %(id)s.") % {"id": truncate(obj.instance_id, ID_CHARS)}
        ),
        title=gettext("Terminate workflow instance"),
        intro=str(TERMINATE_INTRO),
        submit=gettext("Terminate"),
    )


def signal_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Ask for a channel and JSON payload (GET), then send the signal (POST)."""
    return instance_action_view(
        model_admin,
        request,
        object_id,
        permission=PERM_SIGNAL,
        form_class=SignalForm,
        perform=perform_signal,
        done=lambda obj, data, shown: (
            gettext("Signal sent to %(id)s on channel %(channel)r.")
            % {
                "id": truncate(obj.instance_id, ID_CHARS),
                "channel": truncate(data["channel"], ID_CHARS),
            }
        ),
        title=gettext("Send a signal"),
        intro=gettext("Append a signal to this instance's inbox and wake it."),
        submit=gettext("Send signal"),
    )


def export_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Download the instance's history as ``selvedge.history/v1`` JSON (POST only)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    obj = action_object(model_admin, request, object_id, PERM_EXPORT)
    try:
        text = perform_export(model_admin, request, obj)
    except exc.WorkflowNotFound:
        raise Http404(gettext("No workflow instance with this id."))
    return download(text, f"selvedge-history-{safe_filename(obj.instance_id)}.json")


# -- the operations, each logged -----------------------------------------------------------


def perform_cancel(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> None:
    """Request cancellation through the operations layer and log it."""
    reason = data.get("reason") or ""
    operations.cancel_workflow(obj.instance_id, reason)
    model_admin.log_change(request, obj, f"Requested cancellation. Reason: {reason!r}")


def perform_terminate(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> None:
    """Terminate through the operations layer and log it."""
    reason = data.get("reason") or ""
    try:
        operations.terminate_workflow(obj.instance_id, reason)
    except ValueError as error:  # a reason the database cannot store (NUL)
        raise exc.SelvedgeError(str(error)) from error
    model_admin.log_change(request, obj, f"Terminated. Reason: {reason!r}")


def perform_signal(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> None:
    """Send the signal through the operations layer and log it."""
    operations.signal(obj.instance_id, data["channel"], data["payload"])
    # The payload stays out of the log, as it stays out of history exports.
    model_admin.log_change(request, obj, f"Sent a signal on channel {data['channel']!r}.")


def perform_export(model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance) -> str:
    """Export one history: redacted unless the user may view payloads."""
    from ..operations import export_history

    redact = not may_view_payloads(request)
    text = export_history(obj.instance_id, redact=redact).to_json(indent=2)
    model_admin.log_change(
        request, obj, "Exported the history (redacted)." if redact else "Exported the history."
    )
    return text


# -- changelist actions ----------------------------------------------------------------------


@admin.action(description=_("Cancel selected instances\u2026"), permissions=["cancel"])
def cancel_instances(
    model_admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """Ask for a reason once, then request cancellation of each selected instance."""
    if not has_permission(request, PERM_CANCEL):
        raise PermissionDenied
    return bulk_action(
        model_admin,
        request,
        queryset,
        "cancel_instances",
        CancelForm,
        perform_cancel,
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
def terminate_instances(
    model_admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """Ask for a reason once, then terminate each selected instance."""
    if not has_permission(request, PERM_TERMINATE):
        raise PermissionDenied
    return bulk_action(
        model_admin,
        request,
        queryset,
        "terminate_instances",
        TerminateForm,
        perform_terminate,
        title=gettext("Terminate workflow instances"),
        intro=str(TERMINATE_INTRO),
        submit=gettext("Terminate"),
        done=lambda n: (
            ngettext("Terminated %(n)d instance.", "Terminated %(n)d instances.", n) % {"n": n}
        ),
    )


@admin.action(description=_("Send a signal to selected instances\u2026"), permissions=["signal"])
def signal_instances(
    model_admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """Ask for a channel and payload once, then signal each selected instance."""
    if not has_permission(request, PERM_SIGNAL):
        raise PermissionDenied
    return bulk_action(
        model_admin,
        request,
        queryset,
        "signal_instances",
        SignalForm,
        perform_signal,
        check=bulk_signal_problem,
        title=gettext("Send a signal"),
        intro=gettext("Append the same signal to each of these instances' inboxes."),
        submit=gettext("Send signal"),
        done=lambda n: (
            ngettext("Signal sent to %(n)d instance.", "Signal sent to %(n)d instances.", n)
            % {"n": n}
        ),
    )


@admin.action(description=_("Export history of selected instances"), permissions=["export"])
def export_instances(
    model_admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """Download the selected histories: one JSON file, or a streamed zip of several."""
    if not has_permission(request, PERM_EXPORT):
        raise PermissionDenied
    targets = list(queryset.only("instance_id")[: MAX_EXPORT + 1])
    if len(targets) > MAX_EXPORT:
        model_admin.message_user(
            request,
            gettext("Export at most %(n)d instances at a time.") % {"n": MAX_EXPORT},
            messages.ERROR,
        )
        return None
    if not targets:
        model_admin.message_user(request, gettext("Nothing to export."), messages.WARNING)
        return None
    cap = MAX_EXPORT_BYTES
    size = admin_reads().export_size([obj.instance_id for obj in targets])
    if size > cap:
        model_admin.message_user(
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
            text = perform_export(model_admin, request, obj)
        except exc.WorkflowNotFound:
            model_admin.message_user(request, gettext("Nothing to export."), messages.WARNING)
            return None
        return download(text, f"selvedge-history-{safe_filename(obj.instance_id)}.json")
    response = StreamingHttpResponse(
        _zipped(model_admin, request, targets), content_type="application/zip"
    )
    response["Content-Disposition"] = content_disposition_header(True, "selvedge-histories.zip")
    response["X-Content-Type-Options"] = "nosniff"
    return response


def _zipped(
    model_admin: ReadOnlyAdmin, request: HttpRequest, targets: list[WorkflowInstance]
) -> Iterator[bytes]:
    """The zip of the targets' histories, one history in memory at a time."""
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as archive:  # type: ignore[call-overload]
        for number, obj in enumerate(targets, 1):
            try:
                text = perform_export(model_admin, request, obj)
            except exc.WorkflowNotFound:
                continue  # deleted (pruned) since the selection
            archive.writestr(f"{number:03d}-{safe_filename(obj.instance_id)}.json", text)
            yield sink.take()
    yield sink.take()


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
