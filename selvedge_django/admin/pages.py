"""The pages every instance action shares: its form, a selection's confirmation, a download.

An action on one instance is a view under the instance's URL: a form asking
for what the action needs (GET), then the action (POST). The same action on a
selection of the changelist shows the form once for all, on an intermediate
page listing the selected instances (and, with a :class:`BulkPlan`, what will
happen to each), then applies it to each, at most :data:`MAX_BATCH` at a time.
Each function takes the model admin it serves as its first argument.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
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
)
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import content_disposition_header
from django.utils.translation import gettext, ngettext

from .. import exceptions as exc
from ..models import WorkflowInstance, WorkflowStatus
from ..operations.recovery import TERMINATED_TYPE
from .base import APP, ReadOnlyAdmin, has_permission
from .display import CELL_CHARS, ID_CHARS, VALUE_CHARS, truncate

__all__ = [
    "ACTION_TEMPLATE",
    "MAX_BATCH",
    "TEMPLATE_DIR",
    "BulkPlan",
    "Perform",
    "action_object",
    "bulk_action",
    "download",
    "instance_action_view",
    "render_action_page",
    "status_label",
]

# Most instances one changelist action handles at once.
MAX_BATCH = 1000
TEMPLATE_DIR = "admin/selvedge_django/workflowinstance"
ACTION_TEMPLATE = f"{TEMPLATE_DIR}/action.html"

# An action applied to one instance: (model admin, request, instance, form data).
Perform = Callable[[ReadOnlyAdmin, HttpRequest, WorkflowInstance, dict[str, Any]], None]
# An action of one instance's page: like Perform, returning the id of the instance to
# show next (a fork's new instance), or None for the same one.
PerformOne = Callable[[ReadOnlyAdmin, HttpRequest, WorkflowInstance, dict[str, Any]], "str | None"]
# The success message of such an action: (instance, form data, the id shown next).
Done = Callable[[WorkflowInstance, dict[str, Any], str], str]


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


def action_object(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str, permission: str
) -> WorkflowInstance:
    """The instance an action's view is about: 403 without view access and
    ``permission``, 404 when there is no such instance."""
    if not (model_admin.has_view_permission(request) and has_permission(request, permission)):
        raise PermissionDenied
    obj = model_admin.get_object(request, unquote(object_id))
    if obj is None:
        raise Http404(gettext("No workflow instance with this id."))
    return obj


def download(content: str | bytes, filename: str, content_type: str = "") -> HttpResponse:
    """A file to save, never to display: an attachment the browser does not sniff."""
    response = HttpResponse(content, content_type=content_type or "application/json; charset=utf-8")
    response["Content-Disposition"] = content_disposition_header(True, filename)
    response["X-Content-Type-Options"] = "nosniff"
    return response


def bulk_action(
    model_admin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    action: str,
    form_class: type[forms.Form],
    perform: Perform,
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
        model_admin.message_user(
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
                perform(model_admin, request, obj, form.cleaned_data)
            except exc.SelvedgeError as error:
                failed.append(truncate(str(error), CELL_CHARS))
            else:
                applied += 1
        if applied:
            model_admin.message_user(request, done(applied), messages.SUCCESS)
        if failed:
            shown = "; ".join(failed[:5]) + ("; \u2026" if len(failed) > 5 else "")
            model_admin.message_user(
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
                    "url": model_admin.instance_url(obj.instance_id),
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
    return render_action_page(
        model_admin,
        request,
        form,
        title=title,
        intro=intro,
        submit=submit,
        objects=targets,
        hidden=hidden,
        extra=extra,
    )


def instance_action_view(
    model_admin: ReadOnlyAdmin,
    request: HttpRequest,
    object_id: str,
    *,
    permission: str,
    form_class: type[forms.Form],
    perform: PerformOne,
    done: Done,
    title: str,
    intro: str,
    submit: str,
) -> HttpResponseBase:
    """One instance's action page: the form (GET), then the action (POST).

    The user needs view access and ``permission`` (403), the instance must exist
    (404). A valid form runs ``perform``; a :class:`~selvedge_django.SelvedgeError`
    it raises (the instance closed meanwhile, a key that is not in the history)
    shows on the form again, anything else propagates. On success the user gets
    ``done``'s message and lands on the instance ``perform`` names (or this one).
    """
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    obj = action_object(model_admin, request, object_id, permission)
    form = form_class(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        try:
            shown = perform(model_admin, request, obj, form.cleaned_data) or obj.instance_id
        except exc.SelvedgeError as error:
            form.add_error(None, truncate(str(error), VALUE_CHARS))
        else:
            model_admin.message_user(request, done(obj, form.cleaned_data, shown), messages.SUCCESS)
            return HttpResponseRedirect(model_admin.instance_url(shown))
    return render_action_page(
        model_admin,
        request,
        form,
        title=title,
        intro=intro,
        submit=submit,
        objects=[obj],
        object_url=model_admin.instance_url(obj.instance_id),
    )


def render_action_page(
    model_admin: ReadOnlyAdmin,
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
    site = model_admin.admin_site
    changelist_url = reverse(f"{site.name}:{APP}_workflowinstance_changelist")
    context = {
        **site.each_context(request),
        "opts": model_admin.opts,
        "title": title,
        "intro": intro,
        "submit": submit,
        "form": form,
        "targets": [
            {
                "url": model_admin.instance_url(obj.instance_id),
                "label": truncate(obj.instance_id, ID_CHARS),
            }
            for obj in objects[:50]
        ],
        "more_targets": max(0, len(objects) - 50),
        "object_url": object_url,
        "object_label": truncate(objects[0].instance_id, ID_CHARS) if object_url else "",
        "back_url": object_url or request.get_full_path() or changelist_url,
        "hidden": [*(hidden or []), ("apply", "1")],
        "media": model_admin.media + form.media,
        **(extra or {}),
    }
    request.current_app = site.name
    return TemplateResponse(request, ACTION_TEMPLATE, context)
