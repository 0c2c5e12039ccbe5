"""The instance changelist's filters and query set, cheap on large tables.

A filter's choices are bounded reads (:class:`~selvedge_django.storage.admin_reads.AdminReads`);
filtering and the changelist's own query set are Django's query set plumbing.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.db.models import Q, QuerySet
from django.db.models.functions import Substr
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..engine.attributes import AttributeCondition, check_name, parse_filters, value_from_text
from ..models import PAUSED_OWNER, WorkflowStatus
from ..registry import registered_workflow_names
from .display import ID_CHARS, admin_reads, truncate

# Most workflow names the name filter lists (taken from the registry, not the table).
MAX_FILTER_NAMES = 200
# How much of a stored error the changelist reads per row (its type and message lead).
ERROR_HEAD_CHARS = 600


class PausedFilter(admin.SimpleListFilter):
    """Paused (running, held by an operator's pause) or not."""

    title = _("paused")
    parameter_name = "paused"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        paused = Q(status=WorkflowStatus.RUNNING, lease_owner=PAUSED_OWNER)
        if self.value() == "yes":
            return queryset.filter(paused)
        if self.value() == "no":
            return queryset.exclude(paused)
        return queryset


class WorkflowNameFilter(admin.SimpleListFilter):
    """Filter by exact workflow name; the choices come from the workflow registry.

    Listing the names stored in the table would need a ``SELECT DISTINCT`` over
    every instance on each changelist load. The registry is what this process
    can run; any other name still filters through ``?workflow_name=...``.
    """

    title = _("workflow name")
    parameter_name = "workflow_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = registered_workflow_names()[:MAX_FILTER_NAMES]
        current = self.value()
        if current and current not in names:
            names = [current, *names]
        return [(name, truncate(name, ID_CHARS)) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(workflow_name=value) if value else queryset


# The parameter value of "no code version recorded".
NO_VERSION = "-"


class CodeVersionFilter(admin.SimpleListFilter):
    """Filter by recorded code version (or none).

    The choices are this process's ``CODE_VERSION`` and ``COMPATIBLE_VERSIONS``
    and the versions of running instances (a partial index holds those), at
    most :data:`MAX_FILTER_NAMES`; any other version filters through
    ``?code_version=...``.
    """

    title = _("code version")
    parameter_name = "code_version"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        settings = get_settings()
        found: list[str | None] = [settings.code_version, *(settings.compatible_versions or ())]
        found += admin_reads().running_code_versions(limit=MAX_FILTER_NAMES)
        current = self.value()
        if current and current != NO_VERSION:
            found.insert(0, current)
        versions = sorted({v for v in found if v is not None})[:MAX_FILTER_NAMES]
        choices = [(v, truncate(v, ID_CHARS)) for v in versions]
        return [*choices, (NO_VERSION, str(_("(none)")))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value == NO_VERSION:
            return queryset.filter(code_version__isnull=True)
        return queryset.filter(code_version=value)


# How many of the most recently started failed runs the error type filter reads its
# choices from (through the (status, started_at) index: never the whole table).
ERROR_TYPE_SAMPLE = 1000


class ErrorTypeFilter(admin.SimpleListFilter):
    """Filter failed runs by the type of the error that closed them.

    The type is stored on the instance when it fails (``error_type``, indexed
    for failed runs with the start time, so a filtered changelist reads the
    index in its own order). The choices are the distinct types of the
    :data:`ERROR_TYPE_SAMPLE` most recently started failed runs, at most
    :data:`MAX_FILTER_NAMES`: a bounded read, where a ``SELECT DISTINCT`` over
    every failed run would not be. An older type still filters through
    ``?error_type=...``.
    """

    title = _("error type")
    parameter_name = "error_type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = admin_reads().recent_error_types(sample=ERROR_TYPE_SAMPLE)
        found = {kind for kind in recent if kind}
        current = self.value()
        if current:
            found.add(current)
        return [(kind, truncate(kind, ID_CHARS)) for kind in sorted(found)[:MAX_FILTER_NAMES]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(status="failed", error_type=value) if value else queryset


# How many of the most recently started instances the attribute filter box takes its
# name suggestions from, and how many names it suggests.
ATTRIBUTE_NAME_SAMPLE = 1000
MAX_ATTRIBUTE_NAMES = 50


def attribute_conditions(values: list[str]) -> list[AttributeCondition]:
    """The conditions of ``?attr=name:value`` parameters (all must hold); ValueError for
    one that is not ``name:value`` with a valid name.

    A value matches an attribute holding the text, or the number, bool or aware ISO
    datetime it spells, as ``runselvedge ... --attr name=value`` does.
    """
    conditions: list[AttributeCondition] = []
    for text in values:
        name, colon, value = text.partition(":")
        if not colon:
            raise ValueError(f"an attribute filter is name:value, not {text!r}"[:300])
        conditions += parse_filters({f"{check_name(name)}__in": value_from_text(value)})
    return conditions


class AttributeFilter(admin.ListFilter):
    """Filter by search attributes: ``?attr=tenant:acme``, repeatable (all must match).

    Rendered as a text box (suggesting the attribute names of recently started
    instances, a bounded read) with the applied filters listed, each with a link
    that removes it. Each filter is answered from the attribute index of its value's
    type; bulk actions on the filtered changelist act on what it shows.
    """

    title = _("search attributes")
    parameter_name = "attr"
    template = "admin/selvedge_django/workflowinstance/attribute_filter.html"

    def __init__(
        self, request: HttpRequest, params: dict[str, Any], model: Any, model_admin: Any
    ) -> None:
        super().__init__(request, params, model, model_admin)
        value = params.pop(self.parameter_name, [])
        self.values: list[str] = [v for v in (value if isinstance(value, list) else [value]) if v]
        self.used_parameters = {self.parameter_name: self.values} if self.values else {}
        try:
            self.conditions = attribute_conditions(self.values)
        except ValueError as error:
            raise IncorrectLookupParameters(str(error)) from error
        # The other parameters of the page, which the box's form carries along.
        self.hidden_params = [
            (key, item)
            for key, items in request.GET.lists()
            if key not in (PAGE_VAR, "e")
            for item in items
        ]

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [self.parameter_name]

    def common_names(self) -> list[str]:
        return admin_reads().common_attribute_names(
            sample=ATTRIBUTE_NAME_SAMPLE, limit=MAX_ATTRIBUTE_NAMES
        )

    def choices(self, changelist: ChangeList) -> Any:
        yield {
            "selected": not self.values,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": _("All"),
        }
        for i, value in enumerate(self.values):
            rest = [v for j, v in enumerate(self.values) if j != i]
            yield {
                "selected": True,
                "query_string": changelist.get_query_string({self.parameter_name: rest or None}),
                "display": truncate(value, ID_CHARS),
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.conditions:
            return queryset
        return queryset.filter(admin_reads().attribute_condition(self.conditions))


class InstanceChangeList(ChangeList):
    """The changelist, without loading the (possibly large) stored values of each row."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        qs = super().get_queryset(request, exclude_parameters)
        # Only the head of an error: its type and message, for the error column.
        return qs.defer("input", "output", "error", "cancel_reason").annotate(
            error_head=Substr("error", 1, ERROR_HEAD_CHARS)
        )
