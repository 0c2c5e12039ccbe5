"""An instance and what belongs to it: its history, archived history, timers and signals.

Every row here hangs off one ``WorkflowInstance`` (a foreign key that cascades); its
activity tasks are in :mod:`selvedge_django.models.tasks`.

Times that decide ownership (lease and claim expiry, task due times) are Unix
milliseconds on the database clock (``*_ms`` columns); workflow time (timer
expiry) is a datetime on the configured clock. JSON values that must keep
"absent" distinct from JSON null are stored as text (NULL = absent).
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .system import PriorityRank

__all__ = [
    "LONG_HISTORY_SEQ",
    "PAUSED_OWNER",
    "ArchivedHistoryEvent",
    "HistoryEvent",
    "SignalMessage",
    "TimerSubscription",
    "WorkflowAttribute",
    "WorkflowInstance",
    "WorkflowInstanceQuerySet",
    "WorkflowStatus",
]


# The lease owner of a paused instance (sv.pause_workflow): an operator's lease that
# never expires (``lease_expires_ms`` NULL, so no renewal or release matches it) under
# a new epoch that fenced out any execution that ran. Dispatch takes only unowned or
# expired leases, so a paused instance is found by neither of its index walks
# (sv_inst_rank_idx holds unowned rows; sv_inst_lease_idx is read up to now).
PAUSED_OWNER = "$paused"


class WorkflowStatus(models.TextChoices):
    """The durable status of a workflow instance."""

    RUNNING = "running", _("Running")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


# ``now_ms`` below is Unix milliseconds on the database clock: a number, or the store's
# expression of the clock itself (``DbNowMs``), so the database compares with its own now.


class WorkflowInstanceQuerySet(models.QuerySet["WorkflowInstance"]):
    def running(self) -> WorkflowInstanceQuerySet:
        return self.filter(status=WorkflowStatus.RUNNING)

    def dispatchable(self, now_ms: Any) -> WorkflowInstanceQuerySet:
        """What a dispatcher may lease: running, and unowned and marked for dispatch, or
        owned under a lease that expired before ``now_ms``."""
        return self.filter(
            Q(status=WorkflowStatus.RUNNING)
            & (
                Q(runnable=True, lease_owner="")
                | (Q(lease_expires_ms__lt=now_ms) & ~Q(lease_owner=""))
            )
        )


# Running instances whose last suspension was at this command position or later are
# indexed for the status report's "long histories" (sv_inst_long_history_idx); a
# HISTORY_WARNING_THRESHOLD below it is checked without that index.
LONG_HISTORY_SEQ = 1000


class WorkflowInstance(models.Model):
    """One run of a workflow; its id is the run's identity and is never reused."""

    instance_id = models.CharField(primary_key=True, max_length=255)
    workflow_name = models.CharField(max_length=255)
    status = models.CharField(
        max_length=16, choices=WorkflowStatus.choices, default=WorkflowStatus.RUNNING
    )
    input = models.JSONField(null=True, blank=True)
    output = models.TextField(null=True, blank=True, help_text="JSON text of the result")
    error = models.TextField(null=True, blank=True, help_text="JSON error envelope")
    error_type = models.CharField(
        max_length=255,
        default="",
        db_default="",
        blank=True,
        help_text="the type of the error that closed a failed run (empty otherwise), for the"
        " admin's error type filter",
    )
    lease_owner = models.CharField(max_length=255, default="", blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    lease_expires_ms = models.BigIntegerField(null=True, blank=True)
    runnable = models.BooleanField(default=True)
    ready_ms = models.BigIntegerField(
        default=0,
        db_default=0,
        help_text="when the instance last became runnable (database clock, Unix ms): dispatch"
        " leases the oldest first, and never before this time",
    )
    priority = models.SmallIntegerField(
        default=0, db_default=0, help_text="dispatch order, -100 to 100, larger first"
    )
    created_seq = models.BigIntegerField(
        default=0,
        db_default=0,
        help_text="the order of creation (a sequence, larger is newer): dispatch takes the"
        " oldest first among equal ranks",
    )
    execution_errors = models.IntegerField(
        default=0,
        db_default=0,
        help_text="executions in a row that ended on a storage error (0 after one that did not)",
    )
    execution_error = models.TextField(
        default="", db_default="", blank=True, help_text="the last of those errors"
    )
    cancel_requested = models.BooleanField(default=False)
    cancel_reason = models.TextField(default="", blank=True)
    parent_instance_id = models.CharField(max_length=255, default="", blank=True)
    parent_key = models.CharField(max_length=255, default="", blank=True)
    service_name = models.CharField(max_length=255, default="", blank=True)
    current_step = models.CharField(max_length=255, default="", blank=True)
    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    generation = models.IntegerField(
        default=1,
        db_default=1,
        help_text="history generations from 1: a resume archives rows and starts the next",
    )
    resumed_count = models.IntegerField(default=0, db_default=0)
    history_generation = models.IntegerField(
        default=1,
        db_default=1,
        help_text="the generation the current history began with: 1, or the one a"
        " continue-as-new opened (a resume keeps it); default child ids include it",
    )
    parent_generation = models.IntegerField(
        default=1,
        db_default=1,
        help_text="the parent's history_generation when it started this child: only that"
        " history receives the child's outcome",
    )
    forked_from = models.CharField(max_length=255, default="", db_default="", blank=True)
    code_version = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="SELVEDGE['CODE_VERSION'] of the process that started the instance",
    )
    parked_seq = models.IntegerField(
        default=0,
        db_default=0,
        help_text="the command position where the last execution suspended (0: none)",
    )
    parked_key = models.CharField(
        max_length=255,
        default="",
        db_default="",
        blank=True,
        help_text="the key of the command where the last execution suspended",
    )
    # The worker whose workflow cache keeps the last execution ("": none), and until when
    # (database clock, Unix ms) other workers' dispatchers leave the instance to it.
    sticky_owner = models.CharField(max_length=255, default="", db_default="", blank=True)
    sticky_until_ms = models.BigIntegerField(default=0, db_default=0)
    execution_timeout_ms = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="the execution timeout the run was started with (ms; NULL: none)",
    )
    execution_deadline_ms = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="when the leader terminates the run if it is still running (database clock,"
        " Unix ms; NULL: never)",
    )
    progress = models.TextField(
        null=True,
        blank=True,
        help_text="JSON text of the last ctx.set_progress() value (NULL: none set)",
    )

    # W3C trace contexts (JSON: traceparent, tracestate; NULL: none) of the span that started
    # the run (the spans of its executions, attempts, timers and signals belong to it) and of
    # the span that requested the cancellation.
    trace_context = models.TextField(null=True, blank=True)
    cancel_trace_context = models.TextField(null=True, blank=True)
    # Why and since when an operator paused it (lease_owner is PAUSED_OWNER while it is).
    paused_reason = models.TextField(default="", db_default="", blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)

    objects = WorkflowInstanceQuerySet.as_manager()

    class Meta:
        verbose_name = _("workflow instance")
        ordering = ("-started_at", "-instance_id")
        permissions = [
            ("cancel_workflowinstance", _("Can cancel workflow instances")),
            ("signal_workflowinstance", _("Can signal workflow instances")),
            ("export_history", _("Can export workflow history")),
            ("view_payloads", _("Can view workflow inputs, outputs and signal payloads")),
            ("terminate_workflowinstance", _("Can terminate workflow instances")),
            ("resume_workflowinstance", _("Can resume workflow instances")),
            ("fork_workflowinstance", _("Can fork workflow instances")),
            ("pause_workflowinstance", _("Can pause and unpause workflow instances and queues")),
            ("start_workflowinstance", _("Can start workflow instances")),
            (
                "start_builtin_workflows",
                _("Can start built-in workflows (selvedge.prune also needs delete)"),
            ),
        ]
        indexes = [
            # The ready instances by age (sv_inst_ready_idx: the longest waiting, which the
            # status report reads) and by rank, then creation (sv_inst_rank_idx: the order
            # dispatch walks, sql.READY_RANK and created_seq).
            models.Index(
                fields=["ready_ms", "workflow_name", "code_version"],
                name="sv_inst_ready_idx",
                condition=Q(status="running", runnable=True, lease_owner=""),
            ),
            models.Index(
                PriorityRank("ready_ms", "priority"),
                "created_seq",
                "ready_ms",
                "workflow_name",
                "code_version",
                name="sv_inst_rank_idx",
                condition=Q(status="running", runnable=True, lease_owner=""),
            ),
            models.Index(
                fields=["lease_expires_ms", "code_version"],
                name="sv_inst_lease_idx",
                condition=Q(status="running") & ~Q(lease_owner=""),
            ),
            models.Index(fields=["status", "-started_at"], name="sv_inst_status_idx"),
            models.Index(fields=["workflow_name", "-started_at"], name="sv_inst_name_idx"),
            models.Index(
                fields=["workflow_name", "status", "-started_at"], name="sv_inst_name_status_idx"
            ),
            models.Index(fields=["-started_at", "-instance_id"], name="sv_inst_started_idx"),
            models.Index(fields=["closed_at"], name="sv_inst_closed_idx"),
            models.Index(
                fields=["error_type", "-started_at"],
                name="sv_inst_error_type_idx",
                condition=Q(status="failed"),
            ),
            models.Index(
                fields=["workflow_name", "code_version"],
                name="sv_inst_version_idx",
                condition=Q(status="running"),
            ),
            models.Index(
                fields=["execution_deadline_ms"],
                name="sv_inst_deadline_idx",
                condition=Q(status="running", execution_deadline_ms__isnull=False),
            ),
            models.Index(
                fields=["parent_instance_id"],
                name="sv_inst_parent_idx",
                condition=~Q(parent_instance_id=""),
            ),
            # The status report's long histories: only the rare running instances past
            # LONG_HISTORY_SEQ commands are in it, so suspensions of others never write it.
            models.Index(
                fields=["-parked_seq"],
                name="sv_inst_long_history_idx",
                condition=Q(status="running", parked_seq__gte=LONG_HISTORY_SEQ),
            ),
            # The status report's instances held back after storage errors (a hot loop's
            # brake): only those with at least one are in it.
            models.Index(
                fields=["-execution_errors"],
                name="sv_inst_exec_errors_idx",
                condition=Q(status="running", execution_errors__gt=0),
            ),
        ]

    def __str__(self) -> str:
        return self.instance_id


class HistoryEvent(models.Model):
    """One recorded command of an instance (or its close record); first value wins."""

    id = models.BigAutoField(primary_key=True)
    instance = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.CASCADE,
        related_name="history",
        db_index=False,  # the unique (instance, key) index leads with it
    )
    key = models.CharField(max_length=255)
    seq = models.BigIntegerField(null=True, blank=True, help_text="command position")
    command = models.CharField(max_length=32)
    event_type = models.CharField(max_length=32)
    data = models.TextField(null=True, blank=True, help_text="JSON value; NULL = no value yet")
    reservation = models.TextField(null=True, blank=True)
    delivered_seq = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    arrived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("history event")
        ordering = ("instance", "id")
        constraints = [
            models.UniqueConstraint(fields=["instance", "key"], name="sv_history_key_uniq"),
        ]
        indexes = [
            models.Index(
                fields=["instance"],
                name="sv_history_undelivered_idx",
                condition=Q(delivered_seq__isnull=True, data__isnull=False),
            ),
            # Patch markers, for counting the running instances that passed each patch.
            models.Index(
                fields=["instance"], name="sv_history_patch_idx", condition=Q(command="patch")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.key}"


class ArchivedHistoryEvent(models.Model):
    """A history row a resume moved out of the current generation, kept as it was.

    ``generation`` is the generation the row belonged to; ``task`` is a JSON
    summary of the activity task the row owned (status, attempts, failures, last
    error), whose row the re-run replaces. Pruning deletes these with their
    instance; nothing else does.
    """

    id = models.BigAutoField(primary_key=True)
    instance = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.CASCADE,
        related_name="archived_history",
        db_index=False,  # the unique (instance, generation, key) index leads with it
    )
    generation = models.IntegerField()
    event_id = models.BigIntegerField(help_text="the row's id in the history table")
    key = models.CharField(max_length=255)
    seq = models.BigIntegerField(null=True, blank=True)
    command = models.CharField(max_length=32)
    event_type = models.CharField(max_length=32)
    data = models.TextField(null=True, blank=True)
    reservation = models.TextField(null=True, blank=True)
    delivered_seq = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    arrived_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField()
    task = models.TextField(null=True, blank=True, help_text="JSON summary of its activity task")

    class Meta:
        verbose_name = _("archived history event")
        ordering = ("instance", "generation", "event_id")
        constraints = [
            models.UniqueConstraint(
                fields=["instance", "generation", "key"], name="sv_archive_key_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.key} (generation {self.generation})"


class TimerSubscription(models.Model):
    """An armed durable timer: the poller fires it once ``fire_at_ms`` has passed on the
    database clock, and records ``expires_at`` (workflow time) as its value."""

    id = models.BigAutoField(primary_key=True)
    instance = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.CASCADE,
        related_name="timers",
        db_index=False,  # the unique (instance, key) index leads with it
    )
    key = models.CharField(max_length=255)
    expires_at = models.DateTimeField(help_text="workflow time (CLOCK): the value recorded at fire")
    fire_at_ms = models.BigIntegerField(
        help_text="when it fires, on the database clock (Unix ms): the arming time plus the"
        " timer's duration"
    )
    fired = models.BooleanField(
        default=False, help_text="fired for a timed receive; retired by its observation"
    )
    held = models.BooleanField(
        default=False, db_default=False, help_text="its instance is paused: fires after unpause"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("timer subscription")
        constraints = [
            models.UniqueConstraint(fields=["instance", "key"], name="sv_timer_key_uniq"),
        ]
        indexes = [
            # The armed timers by due time; a held one (its instance paused) is not in it.
            models.Index(
                fields=["fire_at_ms", "id"],
                name="sv_timer_fire_idx",
                condition=Q(fired=False, held=False),
            )
        ]

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.key} @ {self.expires_at.isoformat()}"


class SignalMessage(models.Model):
    """One entry of an instance's signal inbox (per-channel order by id)."""

    id = models.BigAutoField(primary_key=True)
    instance = models.ForeignKey(WorkflowInstance, on_delete=models.CASCADE, related_name="signals")
    channel = models.CharField(max_length=255)
    payload = models.TextField()
    sent_at = models.DateTimeField(auto_now_add=True)
    delivered_seq = models.BigIntegerField(null=True, blank=True)
    consumed_seq = models.BigIntegerField(null=True, blank=True)
    consumed_key = models.CharField(max_length=255, default="", blank=True)
    archived_generation = models.IntegerField(
        null=True,
        blank=True,
        help_text="consumed by this generation, which a continue-as-new closed (NULL: the"
        " current history's, or pending)",
    )
    # W3C trace context (JSON: traceparent, tracestate) of the span that sent the signal.
    trace_context = models.TextField(null=True, blank=True)
    idempotency_key = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="the sender's key: a second signal with it to the same instance writes nothing",
    )

    class Meta:
        verbose_name = _("signal")
        ordering = ("instance", "id")
        constraints = [
            models.UniqueConstraint(
                fields=["instance", "idempotency_key"],
                name="sv_signal_idempotency_uniq",
                condition=Q(idempotency_key__isnull=False),
            ),
        ]
        indexes = [
            models.Index(
                fields=["instance", "channel", "id"],
                name="sv_signal_pending_idx",
                condition=Q(consumed_seq__isnull=True),
            ),
            # The signals a delivery batch marks: without it each delivery walked every
            # signal the instance ever received (O(n^2) for n signals handled one by one).
            models.Index(
                fields=["instance"],
                name="sv_signal_undelivered_idx",
                condition=Q(delivered_seq__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.channel}#{self.id}"


class WorkflowAttribute(models.Model):
    """One search attribute of an instance: a name and a typed value.

    ``kind`` says which column holds the value: ``s`` a string and ``b`` a bool
    (``true``/``false``) in ``text_value``; ``i`` an int (also exactly, as text, in
    ``text_value``) and ``f`` a float in ``number_value``; ``t`` an aware datetime in
    ``time_value``. Each lookup of ``find_instances(attributes=...)`` walks one index
    keyed by the name and the value: strings and bools by (name, kind, text), numbers
    by (name, number), times by (name, time). Each index ends with the instance id, so
    the ids a lookup matches come from the index alone (no read of the table's rows).
    """

    id = models.BigAutoField(primary_key=True)
    instance = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.CASCADE,
        related_name="attributes",
        db_index=False,  # the unique (instance, name) index leads with it
    )
    name = models.CharField(max_length=64)
    kind = models.CharField(max_length=1)
    text_value = models.CharField(max_length=255, null=True, blank=True)
    number_value = models.FloatField(null=True, blank=True)
    time_value = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("search attribute")
        ordering = ("instance", "name")
        constraints = [
            models.UniqueConstraint(fields=["instance", "name"], name="sv_attr_name_uniq"),
        ]
        indexes = [
            models.Index(
                fields=["name", "kind", "text_value", "instance"], name="sv_attr_text_idx"
            ),
            models.Index(
                fields=["name", "number_value", "instance"],
                name="sv_attr_number_idx",
                condition=Q(number_value__isnull=False),
            ),
            models.Index(
                fields=["name", "time_value", "instance"],
                name="sv_attr_time_idx",
                condition=Q(time_value__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.name}"
