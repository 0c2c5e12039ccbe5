"""The admin's dashboard: counts, recent failures, slowest steps, queues and workers.

One page (a "Dashboard" button of the instance changelist, view permission),
built from bounded reads (:class:`~selvedge_django.storage.admin_reads.AdminReads`),
each walking an index:

- counts by status: one capped count per status (``sv_inst_status_idx``);
- counts by workflow and status among the :data:`RECENT_SAMPLE` most recently
  started instances (``sv_inst_started_idx``);
- failures in the last hour: failed runs closed since then, newest first, at
  most :data:`MAX_FAILURES` (``sv_inst_closed_idx``), by error type;
- slowest steps: activity and child steps among the last :data:`STEP_WINDOW`
  history rows (a range of the primary key), by name;
- queue depths, workers, the leader and troubled instances: the status report
  of :mod:`selvedge_django.operations.status`.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext

from ..models import WorkflowStatus
from ..operations.status import COUNT_LIMIT, status_report
from ..storage.admin_reads import AdminReads
from .base import APP, ReadOnlyAdmin
from .display import ID_CHARS, admin_reads, format_duration, format_time, truncate

__all__ = ["dashboard_data", "dashboard_view"]

RECENT_SAMPLE = 5000
MAX_FAILURES = 1000
MAX_WORKFLOWS = 50
STEP_WINDOW = 10_000
SLOWEST = 10
FAILURE_WINDOW = timedelta(hours=1)
TEMPLATE = "admin/selvedge_django/workflowinstance/dashboard.html"

_STATUSES = [str(status) for status in WorkflowStatus]


def _step_name(key: str) -> str:
    """A step's name without its command position (``#5:shop.charge`` -> ``shop.charge``)."""
    if key.startswith("#") and ":" in key:
        return key.split(":", 1)[1]
    return key


def dashboard_data(reads: AdminReads) -> dict[str, Any]:
    """Read everything the dashboard shows (bounded; see the module docstring)."""
    now = timezone.now()
    counts = {status: reads.count_status(status, limit=COUNT_LIMIT) for status in _STATUSES}
    most = max([*counts.values(), 1])
    by_status: list[dict[str, Any]] = [
        {"status": status, "count": n, "percent": round(100 * n / most)}
        for status, n in counts.items()
    ]

    grouped: dict[str, dict[str, int]] = {}
    for name, status, n in reads.recent_workflow_counts(sample=RECENT_SAMPLE):
        grouped.setdefault(name, dict.fromkeys(_STATUSES, 0))[status] = n
    ranked = sorted(grouped.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    by_workflow: list[dict[str, Any]] = [
        {"name": truncate(name, ID_CHARS), **counts, "total": sum(counts.values())}
        for name, counts in ranked[:MAX_WORKFLOWS]
    ]

    since = now - FAILURE_WINDOW
    failed = reads.failures_since(since, limit=MAX_FAILURES)
    error_types = Counter(error_type or gettext("(no type)") for _, _, error_type, _ in failed)

    return {
        "by_status": by_status,
        "by_workflow": by_workflow,
        "recent_sample": RECENT_SAMPLE,
        "recent_total": sum(row["total"] for row in by_workflow),
        "failures": {
            "count": len(failed),
            "capped": len(failed) >= MAX_FAILURES,
            "by_type": [
                {"type": truncate(kind, ID_CHARS), "count": n}
                for kind, n in error_types.most_common(10)
            ],
            "latest": [
                {
                    "instance_id": iid,
                    "label": truncate(iid, ID_CHARS),
                    "workflow_name": truncate(name, ID_CHARS),
                    "error_type": truncate(kind, ID_CHARS),
                    "closed_at": format_time(closed),
                }
                for iid, name, kind, closed in failed[:10]
            ],
        },
        "slowest": _slowest_steps(reads),
        "step_window": STEP_WINDOW,
        "count_limit": COUNT_LIMIT,
    }


def _slowest_steps(reads: AdminReads) -> list[dict[str, Any]]:
    """Activity and child steps among the last STEP_WINDOW history rows, slowest first."""
    rows = reads.recent_step_times(window=STEP_WINDOW)
    steps: dict[str, dict[str, Any]] = {}
    for iid, key, created, arrived in rows:
        if arrived is None or created is None:
            continue
        took = max((arrived - created).total_seconds(), 0.0)
        name = _step_name(key)
        step = steps.setdefault(name, {"count": 0, "total": 0.0, "max": -1.0, "slowest": ""})
        step["count"] += 1
        step["total"] += took
        if took > step["max"]:
            step["max"], step["slowest"] = took, iid
    ranked = sorted(steps.items(), key=lambda item: -item[1]["max"])[:SLOWEST]
    return [
        {
            "name": truncate(name, ID_CHARS),
            "count": step["count"],
            "mean": format_duration(step["total"] / step["count"]),
            "max": format_duration(step["max"]),
            "slowest": step["slowest"],
            "slowest_label": truncate(step["slowest"], ID_CHARS),
        }
        for name, step in ranked
    ]


def dashboard_view(model_admin: ReadOnlyAdmin, request: HttpRequest) -> HttpResponseBase:
    """Show the dashboard (GET); needs view permission on instances."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    site = model_admin.admin_site
    report = status_report()
    context = {
        **site.each_context(request),
        "title": gettext("Workflow dashboard"),
        "opts": model_admin.opts,
        "dashboard": dashboard_data(admin_reads()),
        "report": report,
        "queues": [
            {"name": name or gettext("(default)"), **queue}
            for name, queue in report["queues"].items()
        ],
        "changelist_url": reverse(f"{site.name}:{APP}_workflowinstance_changelist"),
        "instance_url": model_admin.instance_url,
    }
    for row in context["dashboard"]["failures"]["latest"]:
        row["url"] = model_admin.instance_url(row["instance_id"])
    for row in context["dashboard"]["slowest"]:
        row["url"] = model_admin.instance_url(row["slowest"]) if row["slowest"] else ""
    for kind in ("stuck", "hot_loops", "long_histories"):
        for row in report[kind]:
            row["url"] = model_admin.instance_url(row["instance_id"])
            row["label"] = truncate(row["instance_id"], ID_CHARS)
    return TemplateResponse(request, TEMPLATE, context)
