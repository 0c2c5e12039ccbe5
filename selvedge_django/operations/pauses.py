"""Pause and unpause: instances an operator freezes, activity queues no claim takes from.

A paused instance stays ``running``: nothing of it is dispatched, no task of it
claimed and no timer of it fired until the unpause; what arrives meanwhile
(signals, cancel requests, activity results, child outcomes) is recorded and
takes effect after it. ``terminate_workflow`` and the execution timeout still
close it. A paused queue keeps its tasks queued for every worker and for inline
claims. docs/operations.md ("Stop the bleeding") says when to use which.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction

from .base import client_store, filter_text, known_id, read_store, reason_text
from .recovery import MAX_SELECTION_BATCH, select_instances
from .status import queue_report

__all__ = [
    "QueueInfo",
    "alist_queues",
    "apause_queue",
    "apause_workflow",
    "aunpause_queue",
    "aunpause_workflow",
    "list_queues",
    "pause_queue",
    "pause_workflow",
    "select_paused",
    "unpause_queue",
    "unpause_workflow",
]

logger = logging.getLogger("selvedge_django.operations")


@dataclass(frozen=True)
class QueueInfo:
    """One activity queue: whether it is paused, and its tasks now."""

    name: str
    paused: bool
    # Queued tasks (due or not) and running attempts, each counted up to the status
    # report's limit; how long the queued task due longest has waited (None: none due).
    queued: int
    running: int
    oldest_queued_age_s: float | None

    def to_json(self) -> dict[str, Any]:
        """Return the queue as JSON-safe data."""
        return {
            "name": self.name,
            "paused": self.paused,
            "queued": self.queued,
            "running": self.running,
            "oldest_queued_age_s": self.oldest_queued_age_s,
        }


def pause_workflow(instance_id: str, reason: str = "") -> None:
    """Pause a running instance: nothing of it runs until :func:`unpause_workflow`.

    In one transaction the instance's lease passes to the pause under a new epoch
    (an execution running it is fenced out at its next write; its step runs again
    after the unpause), and its activity tasks and timers are held: no task of it
    is claimed (an attempt already running finishes and its outcome is recorded)
    and timers that come due wait. Signals and cancel requests are accepted and
    take effect after the unpause; :func:`terminate_workflow` and the execution
    timeout still close it. ``describe(id).paused`` is True with ``paused_reason``.
    Inside ``transaction.atomic()`` it commits with the caller.

    Raises :class:`WorkflowNotFound`, or :class:`InvalidWorkflowState` when the
    instance is closed or paused already (nothing written).
    """
    reason = reason_text(reason)
    instance_id = known_id(instance_id)
    store = client_store()
    store.pauses.pause(instance_id, reason)

    def paused() -> None:
        logger.info("paused %s%s", instance_id, f": {reason}" if reason else "")

    transaction.on_commit(paused, using=store.alias)


def unpause_workflow(instance_id: str) -> None:
    """Let a paused instance run again: what arrived while it was paused takes effect,
    timers that came due fire (in the order they came due), held tasks are claimed.

    Raises :class:`WorkflowNotFound`, or :class:`InvalidWorkflowState` when the
    instance is closed or not paused (nothing written).
    """
    instance_id = known_id(instance_id)
    store = client_store()
    store.pauses.unpause(instance_id)

    def unpaused() -> None:
        logger.info("unpaused %s", instance_id)

    transaction.on_commit(unpaused, using=store.alias)


def _queue_name(name: object) -> str:
    """A queue name as tasks carry it: a string of at most 255 characters ("" is the
    default queue)."""
    text = filter_text(name, "queue name")
    if len(text) > 255:
        raise ValueError("a queue name has at most 255 characters")
    return text


def pause_queue(name: str) -> bool:
    """Pause the activity queue ``name`` for every worker (persisted: across restarts).

    Its tasks stay ``queued``: no worker claims them and no execution claims them
    inline; attempts already running finish. Nothing times out for being paused
    except a task's ``schedule_to_start`` timeout. Workers notice at once on
    PostgreSQL (NOTIFY) and within ``ACTIVITY_POLL_INTERVAL`` otherwise. Return
    whether it was running before (pausing a paused queue changes nothing).
    """
    name = _queue_name(name)
    store = client_store()
    changed = store.pauses.set_queue_paused(name, True)
    if changed:
        transaction.on_commit(lambda: logger.info("paused queue %r", name), using=store.alias)
    return changed


def unpause_queue(name: str) -> bool:
    """Let workers claim from the activity queue ``name`` again; return whether it was
    paused (unpausing a queue that is not changes nothing)."""
    name = _queue_name(name)
    store = client_store()
    changed = store.pauses.set_queue_paused(name, False)
    if changed:
        transaction.on_commit(lambda: logger.info("unpaused queue %r", name), using=store.alias)
    return changed


def list_queues() -> list[QueueInfo]:
    """Every activity queue with queued or running tasks, or paused once, by name."""
    store = read_store()
    report = queue_report(store, store.now_ms())
    return [
        QueueInfo(
            name=name,
            paused=bool(row["paused"]),
            queued=int(row["queued"]),
            running=int(row["running"]),
            oldest_queued_age_s=row["oldest_queued_age_s"],
        )
        for name, row in report.items()
    ]


def select_paused(
    *,
    paused: bool,
    workflow_name: str | None = None,
    since: timedelta | None = None,
    batch: int = MAX_SELECTION_BATCH,
) -> Iterator[list[str]]:
    """The running instances a bulk pause (``paused`` False: not paused now) or unpause
    (True: paused now) acts on, in batches of at most ``batch`` ids, each read after
    the previous batch was handed over (keyset pagination on the id)."""
    yield from select_instances(
        status="running", workflow_name=workflow_name, since=since, batch=batch, paused=paused
    )


apause_workflow = sync_to_async(pause_workflow)
aunpause_workflow = sync_to_async(unpause_workflow)
apause_queue = sync_to_async(pause_queue)
aunpause_queue = sync_to_async(unpause_queue)
alist_queues = sync_to_async(list_queues)
