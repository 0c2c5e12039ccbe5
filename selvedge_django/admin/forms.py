"""The admin's forms: what a cancel, terminate, resume, fork, signal, start, query or
schedule asks for.

They validate as the operations layer does, so a bad value is refused on the
form, with its message, before any operation runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.utils.html import escape
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import exceptions as exc
from ..models import Schedule, ScheduleOverlap
from ..registry import is_builtin_workflow, registered_workflow_names
from ..schedules import check_name, definition
from .display import CELL_CHARS, VALUE_CHARS, admin_reads, codec, truncate


class CancelForm(forms.Form):
    """The reason given with a cancellation request."""

    reason = forms.CharField(
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        label=_("Reason"),
        help_text=_("Recorded with the request and shown to the workflow as the reason."),
    )


class TerminateForm(forms.Form):
    """The reason recorded with a terminate (in the instance's WorkflowTerminated error)."""

    reason = forms.CharField(
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Recorded as the reason of the instance's WorkflowTerminated error.",
    )


class PauseForm(forms.Form):
    """The reason recorded with a pause (``describe().paused_reason``)."""

    reason = forms.CharField(
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        label=_("Reason"),
        help_text=_("Shown with the instance while it is paused."),
    )


class ConfirmForm(forms.Form):
    """Nothing to ask: the page only confirms the action (an unpause)."""


class ResumeForm(forms.Form):
    """A resume's reason (logged) and, optionally, the history key to archive from."""

    from_key = forms.CharField(
        required=False,
        max_length=255,
        strip=False,
        label=_("From key"),
        help_text=_(
            "Archive the history from this key on. Empty: from the row that recorded the"
            " failure that closed the run, or the wait its cancel request reached (for a run"
            " closed otherwise, only the close)."
        ),
        widget=forms.TextInput(attrs={"size": 60}),
    )
    reason = forms.CharField(
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        label=_("Reason"),
        help_text=_("Written to the admin log with the resume."),
    )


class BulkResumeForm(ResumeForm):
    """A bulk resume's form: the resume's, and whether runs that did not fail go too."""

    include_closed = forms.BooleanField(
        required=False,
        label=_("Also resume completed, cancelled and terminated runs"),
        help_text=_(
            "Without this, only the failed runs of the selection are resumed and the others"
            " are skipped."
        ),
    )


class ForkForm(forms.Form):
    """A fork's history key (optional) and new instance id (optional)."""

    from_key = forms.CharField(
        required=False,
        max_length=255,
        strip=False,
        label=_("From key"),
        help_text=_(
            "Copy the history before this key. Empty: before the failure (a completed run:"
            " every row but the close)."
        ),
        widget=forms.TextInput(attrs={"size": 60}),
    )
    new_instance_id = forms.CharField(
        required=False,
        max_length=255,
        strip=False,
        label=_("New instance id"),
        help_text=_("Empty: <instance id>/fork-<n>."),
        widget=forms.TextInput(attrs={"size": 60}),
    )


class SignalForm(forms.Form):
    """A signal's channel and JSON payload, validated as the client API does."""

    channel = forms.CharField(
        strip=False,
        max_length=255,
        label=_("Channel"),
        help_text=_("1 to 255 UTF-8 bytes."),
        widget=forms.TextInput(attrs={"size": 60}),
    )
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
        label=_("Payload"),
        help_text=_("A JSON value; leave empty to send null."),
    )

    def clean_channel(self) -> str:
        channel: str = self.cleaned_data["channel"]
        if not 1 <= len(channel.encode("utf-8")) <= 255:
            raise forms.ValidationError(_("The channel must contain 1 to 255 UTF-8 bytes."))
        return channel

    def clean_payload(self) -> Any:
        return _json_value(self.cleaned_data.get("payload") or "", "payload")


def _json_value(text: str, what: str) -> Any:
    """Parse a form's JSON text (empty: None), or raise the field's validation error."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:
        raise forms.ValidationError(
            _("The %(what)s is not valid JSON: %(error)s"),
            params={"what": what, "error": truncate(str(error), CELL_CHARS)},
        )


class StartWorkflowForm(forms.Form):
    """A start: a workflow this process registers and the user may start (``names``),
    a JSON input, an optional id and execution timeout."""

    workflow = forms.ChoiceField(label=_("Workflow"), choices=())
    input = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 60}),
        label=_("Input"),
        help_text=_("A JSON value; leave empty to start with null."),
    )
    instance_id = forms.CharField(
        required=False,
        max_length=255,
        strip=False,
        label=_("Instance id"),
        help_text=_(
            "Empty: a new random id. An id already used, even by a closed run, is refused."
        ),
        widget=forms.TextInput(attrs={"size": 60}),
    )
    execution_timeout = forms.FloatField(
        required=False,
        min_value=0.001,
        label=_("Execution timeout"),
        help_text=_(
            "Seconds; empty: none. A run still open after this long is terminated"
            " (the reason: execution timeout)."
        ),
    )

    def __init__(self, *args: Any, names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["workflow"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(name, truncate(name, CELL_CHARS)) for name in names]

    def clean_input(self) -> Any:
        return _json_value(self.cleaned_data.get("input") or "", str(_("input")))


class QueryForm(forms.Form):
    """The name of the query handler to ask (handlers take no argument)."""

    name = forms.CharField(
        max_length=255,
        strip=False,
        label=_("Query"),
        help_text=_("The name a query handler was registered under (ctx.set_query_handler)."),
        widget=forms.TextInput(attrs={"size": 40, "list": "selvedge-query-names"}),
    )

    at = forms.CharField(
        max_length=255,
        required=False,
        strip=True,
        label=_("At step"),
        help_text=_(
            "Answer as of this step: a history key (as the history table shows it) or a"
            " command position. Empty: now."
        ),
        widget=forms.TextInput(attrs={"size": 40}),
    )

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if not 1 <= len(name.encode("utf-8")) <= 255:
            raise forms.ValidationError(_("A query name contains 1 to 255 UTF-8 bytes."))
        return name

    def clean_at(self) -> str | int | None:
        return history_step(self.cleaned_data.get("at") or "")


def history_step(text: str) -> str | int | None:
    """A step of a history as typed: digits are a command position, other text a key."""
    if not text:
        return None
    return int(text) if text.isdigit() else text


# -- schedules ------------------------------------------------------------------


def _seconds(ms: int | None) -> int | None:
    return None if ms is None else ms // 1000


class ScheduleForm(forms.ModelForm):
    """A schedule's definition, validated by the operations layer's own rules."""

    name = forms.CharField(
        max_length=200,
        # Escaped: the admin shows a field's help text as HTML.
        help_text=escape(
            _("Letters, digits and _ . : - ; each run is <name>@<slot as ISO 8601 UTC>.")
        ),
    )
    workflow = forms.CharField(
        max_length=255, help_text=_("The workflow each run starts (its name).")
    )
    cron = forms.CharField(
        required=False,
        max_length=255,
        help_text=_(
            "Five fields: minute hour day-of-month month day-of-week (e.g. 0 6 * * MON-FRI)."
        ),
    )
    interval = forms.IntegerField(
        required=False, min_value=1, help_text=_("Or: every this many seconds (not both).")
    )
    timezone = forms.CharField(
        max_length=64,
        required=False,
        help_text=_("The IANA timezone the cron fields are read in (default: TIME_ZONE)."),
    )
    input = forms.JSONField(
        required=False,
        help_text=_("The JSON input of every run."),
        widget=forms.Textarea({"rows": 3}),
    )
    overlap = forms.ChoiceField(choices=ScheduleOverlap.choices, initial="skip")
    catchup_window = forms.IntegerField(
        min_value=10, initial=60, help_text=_("Seconds: older missed slots are skipped.")
    )
    jitter = forms.IntegerField(
        min_value=0, initial=0, help_text=_("Seconds: each run starts up to this much later.")
    )
    paused = forms.BooleanField(required=False)
    start_at = forms.DateTimeField(required=False, help_text=_("No slot before this moment."))
    end_at = forms.DateTimeField(required=False, help_text=_("No slot after this moment."))

    class Meta:
        model = Schedule
        fields: list[str] = []

    def __init__(
        self,
        *args: Any,
        show_input: bool = True,
        may_start: Callable[[str], bool] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.show_input = show_input
        # Whether the user may start a workflow by name (the built-ins need permissions
        # of their own): a schedule starts its workflow with its input as often as it says.
        self.may_start = may_start or (lambda name: not is_builtin_workflow(name))
        row = self.instance
        if row is not None and not row._state.adding:
            self.fields["name"].disabled = True
            try:  # shown as code sees it; one this server cannot decrypt is not offered
                stored_input = codec().open(row.input)
            except exc.PayloadDecodeError:
                stored_input, show_input = None, False
            self.initial.update(
                name=row.name,
                workflow=row.workflow_name,
                cron=row.cron,
                interval=_seconds(row.interval_ms),
                timezone=row.timezone,
                input=stored_input,
                overlap=row.overlap,
                catchup_window=_seconds(row.catchup_window_ms),
                jitter=_seconds(row.jitter_ms),
                paused=row.paused,
                start_at=row.start_at,
                end_at=row.end_at,
            )
        if not show_input:
            self.fields.pop("input")
        names = registered_workflow_names()[:50]
        if names:
            self.fields["workflow"].help_text = gettext(
                "The workflow each run starts (its name). Registered here: %(names)s"
            ) % {"names": ", ".join(names)}

    def clean_workflow(self) -> str:
        name = str(self.cleaned_data["workflow"]).strip()
        if not self.may_start(name):
            raise forms.ValidationError(
                gettext(
                    "%(name)s is a built-in workflow: scheduling it needs the permissions"
                    " made for it (selvedge.task is never scheduled by name)."
                )
                % {"name": name},
                code="builtin",
            )
        return name

    def schedule_fields(self) -> dict[str, Any]:
        """The cleaned data as the keyword arguments of create_schedule."""
        data = self.cleaned_data
        fields = {
            "workflow": data.get("workflow"),
            "cron": data.get("cron") or None,
            "interval": data.get("interval"),
            "timezone": data.get("timezone") or None,
            "overlap": data.get("overlap"),
            "catchup_window": data.get("catchup_window"),
            "jitter": data.get("jitter") or 0,
            "paused": bool(data.get("paused")),
            "start_at": data.get("start_at"),
            "end_at": data.get("end_at"),
        }
        if self.show_input:
            fields["input"] = data.get("input")
        elif not self.instance._state.adding:
            fields["input"] = self.instance.input
        return fields

    def _post_clean(self) -> None:
        """No model validation: the form never writes its instance (the operations do)."""

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            if self.instance._state.adding:
                name = check_name(data.get("name"))
                if admin_reads().schedule_exists(name):
                    raise exc.ScheduleAlreadyExists(name)
            definition(**self.schedule_fields())
        except exc.InvalidSchedule as error:
            raise forms.ValidationError(truncate(str(error), VALUE_CHARS)) from None
        return data
