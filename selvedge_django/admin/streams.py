"""The live part of an instance's streams section: one stream as Server-Sent Events.

The instance's page lists each open stream's new entries as they are written, through
an ``EventSource`` on this view. It shows values, so it needs ``view_payloads`` as
well as view access; a response lasts at most :data:`LIVE_SECONDS`, after which the
browser reconnects from the last entry it showed.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponseBadRequest, HttpResponseNotAllowed
from django.http.response import HttpResponseBase

from ..streams import event_stream_response
from .base import PERM_PAYLOADS, ReadOnlyAdmin
from .pages import action_object

__all__ = ["LIVE_SECONDS", "stream_events_view"]

#: How long one response of the page's live list lasts (a server thread is held meanwhile).
LIVE_SECONDS = 30.0


def stream_events_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponseBase:
    """Stream ``?key=`` of the instance after ``?after=`` (GET; needs ``view_payloads``)."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    obj = action_object(model_admin, request, object_id, PERM_PAYLOADS)
    after = request.GET.get("after", "")
    try:
        return event_stream_response(
            request,
            obj.instance_id,
            request.GET.get("key", ""),
            after=int(after) if after.isdigit() else 0,
            max_seconds=LIVE_SECONDS,
        )
    except ValueError:
        return HttpResponseBadRequest("a stream key is 1 to 255 characters")
