"""What the app's model admins share: the permissions, the read-only base class.

Besides Django's view permission, each action needs its own: ``cancel``,
``terminate``, ``resume``, ``fork``, ``start``, ``pause`` (instances and queues)
and ``signal_workflowinstance``,
``export_history``, ``trigger_schedule``; a built-in workflow is started only
with ``start_builtin_workflows`` and what it amounts to (see
:data:`BUILTIN_START_PERMISSIONS`); recorded values are shown only with
``view_payloads`` (all declared in the models' ``Meta.permissions``). A query's
answer needs ``view_payloads``, a replay check ``export_history``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ..registry import is_builtin_workflow
from .display import EMPTY, ID_CHARS, database_alias, truncate

APP = "selvedge_django"
PERM_CANCEL = f"{APP}.cancel_workflowinstance"
PERM_SIGNAL = f"{APP}.signal_workflowinstance"
PERM_TERMINATE = f"{APP}.terminate_workflowinstance"
PERM_PAUSE = f"{APP}.pause_workflowinstance"
PERM_RESUME = f"{APP}.resume_workflowinstance"
PERM_FORK = f"{APP}.fork_workflowinstance"
PERM_START = f"{APP}.start_workflowinstance"
PERM_START_BUILTIN = f"{APP}.start_builtin_workflows"
PERM_DELETE = f"{APP}.delete_workflowinstance"
PERM_EXPORT = f"{APP}.export_history"
PERM_PAYLOADS = f"{APP}.view_payloads"
PERM_TRIGGER = f"{APP}.trigger_schedule"
# A query's answer is computed from the recorded values; a replay check reads the whole
# history as an export does, and costs as much.
PERM_QUERY = PERM_PAYLOADS
PERM_REPLAY_CHECK = PERM_EXPORT

# What starting a built-in workflow from the admin needs besides start_workflowinstance:
# pruning deletes closed instances with their history, so it also needs the delete
# permission. A built-in not listed is never started from the admin: selvedge.task runs
# a task django.tasks enqueued (its own path), never one named on a form.
BUILTIN_START_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "selvedge.prune": (PERM_START_BUILTIN, PERM_DELETE),
}


def has_permission(request: HttpRequest, permission: str) -> bool:
    """Whether the request's user holds ``permission`` (one of the ``PERM_*`` names)."""
    return bool(request.user.has_perm(permission))


def may_view_payloads(request: HttpRequest) -> bool:
    """Whether recorded values are shown to the request's user (``view_payloads``)."""
    return has_permission(request, PERM_PAYLOADS)


def may_start_builtin(user: Any, name: str) -> bool:
    """Whether ``user`` may start (or schedule) ``name`` by name from the admin: any
    workflow but a built-in; a built-in with the permissions listed for it."""
    if not is_builtin_workflow(name):
        return True
    needed = BUILTIN_START_PERMISSIONS.get(name)
    return needed is not None and bool(user.has_perms(needed))


def instance_url(site_name: str, instance_id: str) -> str:
    """Return the URL of an instance's admin page on the admin site named ``site_name``."""
    return reverse(f"{site_name}:{APP}_workflowinstance_change", args=(quote(instance_id),))


class ReadOnlyAdmin(admin.ModelAdmin):
    """Views only: nothing is added, changed or deleted by hand."""

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
        """Return the URL of an instance's page on this admin site."""
        return instance_url(self.admin_site.name, instance_id)

    def instance_link(self, instance_id: str) -> str:
        """Return a link to an instance's page, its id truncated; empty without an id."""
        if not instance_id:
            return ""
        return format_html(
            '<a href="{}">{}</a>', self.instance_url(instance_id), truncate(instance_id, ID_CHARS)
        )
