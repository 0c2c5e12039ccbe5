"""The recovery actions of the admin: resume and fork, beside cancel and terminate.

Each exists as a changelist action (a confirmation page asks for the reason and
the key; the bulk resume resumes the failed runs of the selection, and the
completed, cancelled and terminated ones only when the operator asks for them,
its page showing what will happen to each selected run) and as a button on a closed
instance's page, needs its own permission (``resume_workflowinstance``,
``fork_workflowinstance``), goes through the operations layer and is written to
the admin log. The views and actions are module-level functions taking the model
admin first, wired by :class:`~.instances.WorkflowInstanceAdmin`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBase
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from ..models import WorkflowInstance, WorkflowStatus
from ..operations import recovery as lifecycle
from ..operations.recovery import TERMINATED_TYPE
from .base import PERM_FORK, PERM_RESUME, ReadOnlyAdmin, has_permission
from .display import ID_CHARS, truncate
from .forms import BulkResumeForm, ForkForm, ResumeForm
from .pages import BulkPlan, bulk_action, instance_action_view

RESUME_INTRO = _(
    "Run these closed instances again, in place, with the code deployed now: the history from"
    " the failure (or the key) on is archived, never deleted, and those steps run again."
)
FORK_INTRO = _(
    "Start a new instance from a copy of each one's history before the failure (or the key);"
    " the original stays as it is."
)


def resume_skip(obj: WorkflowInstance, data: dict[str, Any] | None) -> str | None:
    """Why a bulk resume skips an instance (None: it resumes it). Only failed runs are
    resumed, unless the form includes the runs that closed otherwise."""
    if obj.status == WorkflowStatus.RUNNING:
        return gettext("it is running")
    include_closed = bool(data and data.get("include_closed"))
    if obj.status == WorkflowStatus.FAILED and obj.error_type != TERMINATED_TYPE:
        return None
    if include_closed:
        return None
    if obj.status == WorkflowStatus.COMPLETED:
        return gettext("completed, not failed")
    if obj.status == WorkflowStatus.CANCELLED:
        return gettext("cancelled, not failed")
    return gettext("terminated, not failed")


# -- per-instance views ---------------------------------------------------------------------


def resume_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Ask for the reason and key (GET), then resume the instance (POST)."""
    return instance_action_view(
        model_admin,
        request,
        object_id,
        permission=PERM_RESUME,
        form_class=ResumeForm,
        perform=perform_resume,
        done=lambda obj, data, shown: (
            gettext("Resumed %(id)s.") % {"id": truncate(obj.instance_id, ID_CHARS)}
        ),
        title=gettext("Resume workflow instance"),
        intro=str(RESUME_INTRO),
        submit=gettext("Resume"),
    )


def fork_view(model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str) -> HttpResponseBase:
    """Ask for the key and new id (GET), then fork the instance (POST); the user
    lands on the new instance."""
    return instance_action_view(
        model_admin,
        request,
        object_id,
        permission=PERM_FORK,
        form_class=ForkForm,
        perform=_fork,
        done=lambda obj, data, shown: (
            gettext("Forked %(id)s as %(new)s.")
            % {"id": truncate(obj.instance_id, ID_CHARS), "new": truncate(shown, ID_CHARS)}
        ),
        title=gettext("Fork workflow instance"),
        intro=str(FORK_INTRO),
        submit=gettext("Fork"),
    )


# -- the operations, each logged -------------------------------------------------------------


def perform_resume(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> None:
    """Resume one instance, whatever way it closed."""
    _resume(model_admin, request, obj, data, only_failed=False)


def perform_bulk_resume(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> None:
    """Resume one instance of a selection, by the rule of the bulk resume's plan."""
    # The rule the plan applied, checked again in the resume's own transaction.
    _resume(model_admin, request, obj, data, only_failed=not data.get("include_closed"))


def _resume(
    model_admin: ReadOnlyAdmin,
    request: HttpRequest,
    obj: WorkflowInstance,
    data: dict[str, Any],
    *,
    only_failed: bool,
) -> None:
    reason = data.get("reason") or ""
    from_key = data.get("from_key") or None
    try:
        generation = lifecycle.resume_workflow(
            obj.instance_id, from_key=from_key, reason=reason, only_failed=only_failed
        )
    except ValueError as error:  # a reason the database cannot store (NUL)
        raise exc.SelvedgeError(str(error)) from error
    where = f" from key {from_key!r}" if from_key else ""
    model_admin.log_change(
        request, obj, f"Resumed{where} as generation {generation}. Reason: {reason!r}"
    )


def perform_fork(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> None:
    """Fork one instance."""
    _fork(model_admin, request, obj, data)


def _fork(
    model_admin: ReadOnlyAdmin, request: HttpRequest, obj: WorkflowInstance, data: dict[str, Any]
) -> str:
    from_key = data.get("from_key") or None
    new_id = lifecycle.fork_workflow(
        obj.instance_id, from_key=from_key, new_instance_id=data.get("new_instance_id") or None
    )
    where = f" before key {from_key!r}" if from_key else ""
    model_admin.log_change(request, obj, f"Forked{where} as {new_id!r}.")
    return new_id


# -- changelist actions ------------------------------------------------------------------------


@admin.action(description=_("Resume selected instances\u2026"), permissions=["resume"])
def resume_instances(
    model_admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """Ask for the reason and key once, then resume the selected runs the plan allows."""
    if not has_permission(request, PERM_RESUME):
        raise PermissionDenied
    return bulk_action(
        model_admin,
        request,
        queryset,
        "resume_instances",
        BulkResumeForm,
        perform_bulk_resume,
        plan=BulkPlan(
            skip=resume_skip,
            applied=gettext("Resumed"),
            summary=lambda resumed, skipped: (
                gettext("%(resumed)d will be resumed, %(skipped)d skipped.")
                % {"resumed": resumed, "skipped": skipped}
            ),
        ),
        title=gettext("Resume workflow instances"),
        intro=str(RESUME_INTRO),
        submit=gettext("Resume"),
        done=lambda n: (
            ngettext("Resumed %(n)d instance.", "Resumed %(n)d instances.", n) % {"n": n}
        ),
    )


@admin.action(description=_("Fork selected instances\u2026"), permissions=["fork"])
def fork_instances(
    model_admin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """Ask for the key once, then fork each selected instance."""
    if not has_permission(request, PERM_FORK):
        raise PermissionDenied
    return bulk_action(
        model_admin,
        request,
        queryset,
        "fork_instances",
        ForkForm,
        perform_fork,
        title=gettext("Fork workflow instances"),
        intro=str(FORK_INTRO),
        submit=gettext("Fork"),
        done=lambda n: ngettext("Forked %(n)d instance.", "Forked %(n)d instances.", n) % {"n": n},
    )
