"""What the app's model admins share: the permissions, the read-only base class.

Besides Django's view permission, each action needs its own: ``cancel``,
``terminate``, ``resume``, ``fork``, ``start``, ``pause`` (instances and queues)
and ``signal_workflowinstance``,
``export_history``, ``trigger_schedule``; a built-in workflow is started only
with ``start_builtin_workflows`` and what it amounts to (see
:data:`BUILTIN_START_PERMISSIONS`); recorded values are shown only with
``view_payloads`` (all declared in the models' ``Meta.permissions``). A query's
answer needs ``view_payloads``, a replay check ``export_history``.

Which database a page reads (:class:`FreshReadsAdmin`, :func:`reads_for`): with a
``SELVEDGE["READ_DATABASE"]`` set apart, pages read that replica, except a request
that acts (a POST: its reads decide what it writes) and every page of the same
session for :data:`FRESH_AFTER_ACTION` seconds after one, so the page an operator
lands on after "cancel" shows the cancel. A POST that only reads (a query, a replay
check, an export) reads the replica as a page does.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.template.response import SimpleTemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from ..conf import get_settings
from ..operations.base import primary_reads, read_alias
from ..registry import is_builtin_workflow
from .display import EMPTY, ID_CHARS, truncate

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


# After an action, the pages of the operator's session read the primary this long: the
# redirect that follows lands at once, and the next few clicks need not race the replica.
FRESH_AFTER_ACTION = 10.0
# The session key holding when the session last acted (Unix seconds).
ACTED_AT = "selvedge_acted_at"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")
# The changelist actions that only read (their POST acts on nothing).
READING_ACTIONS = frozenset({"export_instances"})


def reads_primary(request: HttpRequest, *, reading: bool = False) -> bool:
    """Whether ``request``'s reads must see the writes just made: it acts, or its
    session acted less than :data:`FRESH_AFTER_ACTION` seconds ago. An acting request
    marks its session; a ``reading`` view's POST (or a changelist action of
    :data:`READING_ACTIONS`) does not act. Always False without a read database set
    apart (and the session is left alone)."""
    settings = get_settings()
    if settings.read_database in (None, settings.database):
        return False
    session = getattr(request, "session", None)
    reading = reading or request.POST.get("action") in READING_ACTIONS
    if request.method not in SAFE_METHODS and not reading:
        if session is not None:
            session[ACTED_AT] = time.time()
        return True
    acted = session.get(ACTED_AT) if session is not None else None
    return isinstance(acted, int | float) and 0 <= time.time() - acted < FRESH_AFTER_ACTION


def reads_for(
    view: Callable[..., HttpResponseBase], *, reading: bool = False
) -> Callable[..., HttpResponseBase]:
    """Wrap an admin view so that its reads, and those of rendering its template later,
    read the primary when :func:`reads_primary` says so (else the read database);
    ``reading``: the view writes nothing, whatever the method."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not reads_primary(request, reading=reading):
            return view(request, *args, **kwargs)
        with primary_reads():
            response = view(request, *args, **kwargs)
        if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
            # Django renders a template response after the view returned; the display
            # functions that read (search attributes, the timeline) run then.
            def render() -> SimpleTemplateResponse:
                del response.render  # the class's own again (and picklable)
                with primary_reads():
                    return response.render()

            response.render = render  # type: ignore[method-assign]
        return response

    return wrapped


def extra_view(
    model_admin: admin.ModelAdmin,
    pattern: str,
    view: Callable[..., HttpResponseBase],
    name: str,
    *,
    reading: bool = False,
) -> URLPattern:
    """The URL of one of a model admin's own views, ``view(model_admin, request, ...)``,
    behind the admin site's login and :func:`reads_for` (``reading``: it writes nothing)."""

    def bound(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return view(model_admin, request, *args, **kwargs)

    functools.update_wrapper(bound, view)
    opts = model_admin.opts
    return path(
        pattern,
        model_admin.admin_site.admin_view(reads_for(bound, reading=reading)),
        name=f"{opts.app_label}_{opts.model_name}_{name}",
    )


class FreshReadsAdmin(admin.ModelAdmin):
    """A model admin whose pages read ``SELVEDGE["READ_DATABASE"]`` unless they must not.

    Django's own views (the list, the change form, history, delete) go through
    :func:`reads_for`; a subclass adds its views with :func:`extra_view`.
    """

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(read_alias())

    def get_urls(self) -> list[URLPattern]:
        return [
            URLPattern(url.pattern, reads_for(url.callback), url.default_args, url.name)
            for url in super().get_urls()
        ]


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


class ReadOnlyAdmin(FreshReadsAdmin):
    """Views only: nothing is added, changed or deleted by hand."""

    show_full_result_count = False
    empty_value_display = EMPTY

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

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
