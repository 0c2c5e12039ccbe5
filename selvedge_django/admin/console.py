"""The admin's console pages: start a workflow, run a query, check a replay.

- "Start workflow" (a button of the changelist): a workflow this process
  registers, a JSON input, an optional id and an optional execution timeout,
  started through the operations layer; needs ``start_workflowinstance``. A
  built-in workflow (``selvedge.*``) is offered and started only with the
  permissions :data:`~.base.BUILTIN_START_PERMISSIONS` names for it, and
  ``selvedge.task`` never. Bad JSON, a workflow the user may not start, or a
  start the operations layer refuses (a taken or invalid id, an unencodable
  input, a timeout out of range), is shown on the form and nothing is written.
  The log entry names the workflow and the size of its input, not the input.
- "Run query" (an instance's page): asks a query handler the instance has
  registered, through ``operations.query`` bounded by :data:`QUERY_TIMEOUT`
  (the replay and the handler's run: a handler that never returns is
  interrupted), and shows the answer or the typed error. An answer is computed from the
  recorded values, so it needs ``view_payloads`` besides view access. With a step
  ("At step", a history key or position; the history table's "State here" link on
  each row fills it in) it answers as of that step (``query(..., at=)``), and offers
  the handlers registered there.
- "Replay check" (an instance's page): replays the instance's history against
  the code deployed now (``operations.replay_instance``) and shows whether it
  matched, or the divergence. It reads the whole history as an export does and
  costs as much, so it needs ``export_history`` besides view access.

Each is a POST with CSRF protection and is written to the admin log. The views
are module-level functions taking the model admin first, wired by
:class:`~.instances.WorkflowInstanceAdmin`.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase, HttpResponseNotAllowed, HttpResponseRedirect
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from .. import operations
from ..models import WorkflowInstance
from ..registry import registered_workflow_names
from .base import (
    PERM_QUERY,
    PERM_REPLAY_CHECK,
    PERM_START,
    ReadOnlyAdmin,
    has_permission,
    may_start_builtin,
)
from .display import ID_CHARS, VALUE_CHARS, truncate
from .forms import QueryForm, StartWorkflowForm, history_step
from .pages import action_object, render_action_page

__all__ = [
    "QUERY_TIMEOUT",
    "may_start",
    "query_view",
    "replay_check_view",
    "start_view",
    "startable_workflows",
]

# Seconds a query's replay and handler may take before the admin gives up (QueryTimeout).
QUERY_TIMEOUT = 10.0
# Most query handler names the query page suggests.
MAX_QUERY_NAMES = 50

START_INTRO = _(
    "Start a new instance of a workflow this process registers. It commits at once and a"
    " worker runs it; an id already used, even by a closed run, is refused. Built-in"
    " workflows are listed only for users allowed to start them."
)
QUERY_INTRO = _(
    "Ask one of this instance's query handlers: its history is replayed, read-only, and the"
    " handler answers where the replay stops (now, or right after the step you give)."
    " Nothing is written."
)


def error_text(error: BaseException) -> str:
    """An error as ``Type: message``, truncated for a page."""
    return truncate(f"{type(error).__name__}: {error}", VALUE_CHARS)


# -- start --------------------------------------------------------------------------------


def may_start(model_admin: ReadOnlyAdmin, request: HttpRequest) -> bool:
    """Whether the user may open the start page: view access and ``start_workflowinstance``."""
    return model_admin.has_view_permission(request) and has_permission(request, PERM_START)


def startable_workflows(request: HttpRequest) -> list[str]:
    """The registered workflows the user may start here, sorted: any workflow but a
    built-in; a built-in with the permissions listed for it."""
    return [name for name in registered_workflow_names() if may_start_builtin(request.user, name)]


def start_view(model_admin: ReadOnlyAdmin, request: HttpRequest) -> HttpResponseBase:
    """Ask for a workflow, its input and an optional id (GET), then start it (POST)."""
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if not may_start(model_admin, request):
        raise PermissionDenied
    form = StartWorkflowForm(
        request.POST if request.method == "POST" else None,
        names=startable_workflows(request),
    )
    if form.is_bound and form.is_valid():
        try:
            instance_id = perform_start(model_admin, request, form.cleaned_data)
        except exc.SelvedgeError as error:
            form.add_error(None, error_text(error))
        else:
            model_admin.message_user(
                request,
                gettext("Started %(name)s as %(id)s.")
                % {
                    "name": truncate(form.cleaned_data["workflow"], ID_CHARS),
                    "id": truncate(instance_id, ID_CHARS),
                },
                messages.SUCCESS,
            )
            return HttpResponseRedirect(model_admin.instance_url(instance_id))
    return render_action_page(
        model_admin,
        request,
        form,
        title=gettext("Start workflow"),
        intro=str(START_INTRO),
        submit=gettext("Start"),
        objects=[],
    )


def perform_start(model_admin: ReadOnlyAdmin, request: HttpRequest, data: dict[str, Any]) -> str:
    """Start the workflow through the operations layer and log the addition."""
    name = data["workflow"]
    if not may_start_builtin(request.user, name):
        raise PermissionDenied  # the form offers only what may be started
    instance_id = operations.start_workflow(
        name,
        data["input"],
        instance_id=data.get("instance_id") or None,
        execution_timeout=data.get("execution_timeout"),
    )
    # The input stays out of the log, as signal payloads do: its size is enough to
    # tell one start from another.
    size = len(json.dumps(data["input"], separators=(",", ":"), ensure_ascii=False).encode())
    model_admin.log_addition(
        request,
        WorkflowInstance(instance_id=instance_id, workflow_name=name),
        f"Started workflow {name!r} with a {size}-byte input.",
    )
    return instance_id


# -- query ----------------------------------------------------------------------------------


def query_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Offer the instance's query handlers (GET), then ask one and show the answer (POST)."""
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    obj = action_object(model_admin, request, object_id, PERM_QUERY)
    at = history_step(str(request.GET.get("at", "")).strip()[:255])
    if request.method == "POST":
        form = QueryForm(request.POST)
    elif "name" in request.GET:
        form = QueryForm(request.GET)
    else:  # a "State here" link: the step filled in, the handler still to choose
        form = QueryForm(initial={"at": "" if at is None else at})
    result: dict[str, str] | None = None
    if request.method == "POST" and form.is_valid():
        name = form.cleaned_data["name"]
        at = form.cleaned_data["at"]
        try:
            answer = operations.query(obj.instance_id, name, timeout=QUERY_TIMEOUT, at=at)
        except (exc.SelvedgeError, TimeoutError) as error:
            result = {"title": gettext("Error"), "text": error_text(error), "kind": "error"}
            outcome = f"failed: {type(error).__name__}"
        else:
            text = json.dumps(answer, indent=2, ensure_ascii=False, sort_keys=True)
            result = {"title": gettext("Answer"), "text": truncate(text, VALUE_CHARS)}
            result["kind"] = "answer"
            outcome = "answered"
        step = "" if at is None else f" at {at!r}"
        model_admin.log_change(request, obj, f"Ran query {name!r}{step}: {outcome}.")
    try:
        names = operations.query_handler_names(obj.instance_id, timeout=QUERY_TIMEOUT, at=at)
    except (exc.SelvedgeError, TimeoutError):
        names = []  # the form still asks by name; the answer shows the error
    return render_action_page(
        model_admin,
        request,
        form,
        title=gettext("Run query"),
        intro=str(QUERY_INTRO),
        submit=gettext("Run query"),
        objects=[obj],
        object_url=model_admin.instance_url(obj.instance_id),
        extra={
            "result": result,
            "datalist": {"id": "selvedge-query-names", "options": names[:MAX_QUERY_NAMES]},
        },
    )


# -- replay check ------------------------------------------------------------------------------


def replay_check_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Replay the instance against the deployed code (POST only); show pass or fail."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    obj = action_object(model_admin, request, object_id, PERM_REPLAY_CHECK)
    label = truncate(obj.instance_id, ID_CHARS)
    try:
        result = operations.replay_instance(obj.instance_id)
    except exc.SelvedgeError as error:
        cause = error.divergence if isinstance(error, exc.ReplayError) else None
        shown = error_text(cause or error)
        model_admin.log_change(
            request, obj, f"Replay check failed: {type(cause or error).__name__}."
        )
        model_admin.message_user(
            request,
            gettext("Replay check of %(id)s failed: %(error)s") % {"id": label, "error": shown},
            messages.ERROR,
        )
    else:
        patches = result.describe_patches()
        model_admin.log_change(request, obj, "Replay check passed.")
        message = gettext(
            "Replay check of %(id)s passed: the code deployed now replays its history."
        ) % {"id": label}
        if patches:
            message += " " + gettext("Patches: %(patches)s") % {"patches": patches}
        model_admin.message_user(request, message, messages.SUCCESS)
    return HttpResponseRedirect(model_admin.instance_url(obj.instance_id))
