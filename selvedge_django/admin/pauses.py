"""The admin's pause and unpause: of instances (actions), and of activity queues (a page).

Pausing an instance asks for a reason (its page's button, or a changelist action
on a selection), unpausing only confirms; both need the ``pause_workflowinstance``
permission, call the operations layer (the same code path as the client API and
``runselvedge``) and are written to the admin log. The queue page lists the
activity queues (view permission) with a pause or unpause button each (the same
permission; a POST with CSRF protection, logged against the queue's row).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponseBase,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from .. import operations
from ..models import WorkflowInstance
from .base import APP, PERM_PAUSE, ReadOnlyAdmin, has_permission
from .display import ID_CHARS, VALUE_CHARS, admin_reads, truncate
from .forms import ConfirmForm, PauseForm
from .pages import bulk_action, instance_action_view

__all__ = [
    "QUEUES_TEMPLATE",
    "pause_instances",
    "pause_view",
    "perform_pause",
    "perform_unpause",
    "queues_view",
    "unpause_instances",
    "unpause_view",
]

QUEUES_TEMPLATE = "admin/selvedge_django/workflowinstance/queues.html"
PAUSE_INTRO = _(
    "Hold these instances: nothing of them runs until they are unpaused. An activity attempt"
    " already running finishes and its outcome is recorded; signals and cancel requests are"
    " accepted and take effect after the unpause; the execution timeout still applies."
)
UNPAUSE_INTRO = _(
    "Let these instances run again: what arrived while they were paused takes effect, and"
    " timers that came due fire."
)


# -- one instance ------------------------------------------------------------------------


def pause_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Ask for a reason (GET), then pause the instance (POST)."""
    return instance_action_view(
        model_admin,
        request,
        object_id,
        permission=PERM_PAUSE,
        form_class=PauseForm,
        perform=perform_pause,
        done=lambda obj, data, shown: (
            gettext("Paused %(id)s.") % {"id": truncate(obj.instance_id, ID_CHARS)}
        ),
        title=gettext("Pause workflow instance"),
        intro=str(PAUSE_INTRO),
        submit=gettext("Pause"),
    )


def unpause_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Confirm (GET), then unpause the instance (POST)."""
    return instance_action_view(
        model_admin,
        request,
        object_id,
        permission=PERM_PAUSE,
        form_class=ConfirmForm,
        perform=perform_unpause,
        done=lambda obj, data, shown: (
            gettext("Unpaused %(id)s.") % {"id": truncate(obj.instance_id, ID_CHARS)}
        ),
        title=gettext("Unpause workflow instance"),
        intro=str(UNPAUSE_INTRO),
        submit=gettext("Unpause"),
    )


def perform_pause(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> None:
    """Pause through the operations layer and log it."""
    reason = data.get("reason") or ""
    try:
        operations.pause_workflow(obj.instance_id, reason)
    except ValueError as error:  # a reason the database cannot store (NUL)
        raise exc.SelvedgeError(str(error)) from error
    model_admin.log_change(request, obj, f"Paused. Reason: {reason!r}")


def perform_unpause(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> None:
    """Unpause through the operations layer and log it."""
    operations.unpause_workflow(obj.instance_id)
    model_admin.log_change(request, obj, "Unpaused.")


# -- changelist actions ------------------------------------------------------------------


@admin.action(description=_("Pause selected instances\u2026"), permissions=["pause"])
def pause_instances(
    model_admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """Ask for a reason once, then pause each selected instance (closed or paused ones
    are skipped and named)."""
    if not has_permission(request, PERM_PAUSE):
        raise PermissionDenied
    return bulk_action(
        model_admin,
        request,
        queryset,
        "pause_instances",
        PauseForm,
        perform_pause,
        title=gettext("Pause workflow instances"),
        intro=str(PAUSE_INTRO),
        submit=gettext("Pause"),
        done=lambda n: ngettext("Paused %(n)d instance.", "Paused %(n)d instances.", n) % {"n": n},
    )


@admin.action(description=_("Unpause selected instances\u2026"), permissions=["pause"])
def unpause_instances(
    model_admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """Confirm once, then unpause each selected instance (others are skipped and named)."""
    if not has_permission(request, PERM_PAUSE):
        raise PermissionDenied
    return bulk_action(
        model_admin,
        request,
        queryset,
        "unpause_instances",
        ConfirmForm,
        perform_unpause,
        title=gettext("Unpause workflow instances"),
        intro=str(UNPAUSE_INTRO),
        submit=gettext("Unpause"),
        done=lambda n: (
            ngettext("Unpaused %(n)d instance.", "Unpaused %(n)d instances.", n) % {"n": n}
        ),
    )


# -- the queue page ----------------------------------------------------------------------


def queues_view(model_admin: ReadOnlyAdmin, request: HttpRequest) -> HttpResponseBase:
    """List the activity queues (GET); pause or unpause one (POST ``queue``, ``action``)."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "HEAD", "POST"])
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    may_pause = has_permission(request, PERM_PAUSE)
    site = model_admin.admin_site
    url = reverse(f"{site.name}:{APP}_workflowinstance_queues")
    if request.method == "POST":
        if not may_pause:
            raise PermissionDenied
        name, action = request.POST.get("queue", ""), request.POST.get("action", "")
        if action not in ("pause", "unpause"):
            messages.error(request, gettext("Unknown action."))
            return HttpResponseRedirect(url)
        label = name or gettext("(default)")
        try:
            if action == "pause":
                changed = operations.pause_queue(name)
            else:
                changed = operations.unpause_queue(name)
        except ValueError as error:
            messages.error(request, truncate(str(error), VALUE_CHARS))
            return HttpResponseRedirect(url)
        row = admin_reads().activity_queue(name)
        if changed and row is not None:
            model_admin.log_change(request, row, "Paused." if action == "pause" else "Unpaused.")
        done = (
            gettext("Paused queue %(name)s.")
            if action == "pause"
            else gettext("Unpaused queue %(name)s.")
        )
        if not changed:
            done = gettext("Queue %(name)s was already so.")
        messages.success(request, done % {"name": truncate(label, ID_CHARS)})
        return HttpResponseRedirect(url)
    context = {
        **site.each_context(request),
        "title": gettext("Activity queues"),
        "opts": model_admin.opts,
        "queues": [
            {"name": queue.name, "label": queue.name or gettext("(default)"), **queue.to_json()}
            for queue in operations.list_queues()
        ],
        "may_pause": may_pause,
        "queues_url": url,
        "changelist_url": reverse(f"{site.name}:{APP}_workflowinstance_changelist"),
    }
    request.current_app = site.name
    return TemplateResponse(request, QUEUES_TEMPLATE, context)
