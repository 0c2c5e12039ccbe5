"""An instance's streams: values a running workflow or its activities send out as they go.

A :class:`WorkflowStream` is one named stream of an instance (its key, the last
``seq`` given out and whether it is closed); a :class:`WorkflowStreamEntry` is one
value in it. Both hang off the instance (a foreign key that cascades), so a prune
deletes them with it. Entries are read in ``seq`` order through the unique index
on (instance, key, seq).
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .instances import WorkflowInstance

__all__ = ["WorkflowStream", "WorkflowStreamEntry"]


class WorkflowStream(models.Model):
    """One named stream of an instance: the last ``seq`` given out, and whether it is closed.

    Writers take the row (an upsert that adds one to ``last_seq``) before they insert
    their entry, so the entries of one stream commit in ``seq`` order; the sum of an
    instance's ``last_seq`` is how many entries it holds.
    """

    id = models.BigAutoField(primary_key=True)
    instance = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.CASCADE,
        related_name="streams",
        db_index=False,  # the unique (instance, key) index leads with it
    )
    key = models.CharField(max_length=255)
    last_seq = models.BigIntegerField(default=0)
    closed = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("stream")
        ordering = ("instance", "key")
        constraints = [
            models.UniqueConstraint(fields=["instance", "key"], name="sv_stream_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.key}"


class WorkflowStreamEntry(models.Model):
    """One value of a stream, JSON text as the codec stored it.

    ``attempt`` is the activity attempt that wrote it and ``activity_id`` that
    activity's history key; both NULL for the workflow's own writes.
    """

    id = models.BigAutoField(primary_key=True)
    instance = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.CASCADE,
        related_name="stream_entries",
        db_index=False,  # the unique (instance, key, seq) index leads with it
    )
    key = models.CharField(max_length=255)
    seq = models.BigIntegerField()
    value = models.TextField()
    attempt = models.IntegerField(null=True, blank=True)
    activity_id = models.CharField(max_length=255, null=True, blank=True)
    written_at = models.DateTimeField()

    class Meta:
        verbose_name = _("stream entry")
        verbose_name_plural = _("stream entries")
        ordering = ("instance", "key", "seq")
        constraints = [
            # Also the index of every read: one stream's entries in seq order.
            models.UniqueConstraint(
                fields=["instance", "key", "seq"], name="sv_stream_entry_seq_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.key}#{self.seq}"
