"""The health view: a JSON endpoint for load balancers and Kubernetes probes.

``GET health/`` (see :mod:`selvedge_django.urls`) reads the database clock of
``SELVEDGE["DATABASE"]``: ``200 {"status": "ok"}`` when it answers, ``503
{"status": "unavailable"}`` when it does not. Anyone may ask, and that is all an
anonymous caller (or a user without the rights below) gets. An active staff user
with the ``view_workflowinstance`` permission gets the status report of
:func:`selvedge_django.operations.status.status_report` as well (workers, the
leader, queue depths, backlogs, stuck and hot-looping instances); it is bounded
but costs a few dozen index reads, so probes should ask anonymously.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .operations.status import check_health, status_report

__all__ = ["health", "may_see_details"]

logger = logging.getLogger("selvedge_django.health")

DETAILS_PERMISSION = "selvedge_django.view_workflowinstance"


def may_see_details(request: HttpRequest) -> bool:
    """Whether the caller may see the status report: active staff with view permission."""
    user = getattr(request, "user", None)
    return bool(
        user is not None and user.is_active and user.is_staff and user.has_perm(DETAILS_PERMISSION)
    )


@never_cache
@require_safe
def health(request: HttpRequest) -> HttpResponse:
    """Answer 200 and ``{"status": "ok"}`` while the database answers, 503 otherwise."""
    check = check_health()
    if not check.ok:
        logger.warning("health check failed: %s", check.error)
        body: dict[str, Any] = {"status": "unavailable"}
        if may_see_details(request):
            body.update(database=check.database, error=check.error)
        return JsonResponse(body, status=503)
    if not may_see_details(request):
        return JsonResponse({"status": "ok"})
    try:
        return JsonResponse(status_report())
    except DatabaseError as error:  # the database went away between the two reads
        logger.warning("status report failed: %s", error)
        return JsonResponse(
            {"status": "unavailable", "database": check.database, "error": str(error)[:500]},
            status=503,
        )
