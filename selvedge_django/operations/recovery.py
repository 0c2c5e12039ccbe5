"""Recovery operations: resume a closed instance in place, fork a run into a new one.

Like the rest of the operations layer, these are what the client API, the admin
and ``manage.py runselvedge`` call; each is one transaction of the store, joins
the caller's ``transaction.atomic()`` and wakes workers only after commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from .. import hooks as hooks_module
from ..conf import get_settings
from ..engine.attributes import parse_filters
from ..models import WorkflowStatus
from ..storage.resume import TERMINATED_TYPE, ResumeOutcome
from .base import client_store, known_id, reason_text, validate_instance_id

__all__ = [
    "MAX_SELECTION_BATCH",
    "TERMINATED_TYPE",
    "afork_workflow",
    "aresume_workflow",
    "fork_workflow",
    "resume_workflow",
    "select_instances",
]

# The most instance ids one read of a bulk operation takes.
MAX_SELECTION_BATCH = 100

logger = logging.getLogger("selvedge_django.operations")


def resume_workflow(
    instance_id: str, *, from_key: str | None = None, reason: str = "", only_failed: bool = False
) -> int:
    """Run a closed instance again, in place, with the current code; return its new
    generation.

    The history rows from ``from_key`` on (default: the first row whose recorded
    outcome is the failure that closed the run; for a cancelled run, the first
    wait that observed the cancel request, so the re-run waits there again; for a
    terminated run, only the close) and the close row move to the archive, never
    deleted, under the generation they belonged to; when the close left a row
    earlier than that without a value (a terminated run's open activity, timer or
    child) or filled it with its cancellation, the cut moves back to that row.
    The instance is ``running`` again under a new lease epoch (a worker still
    holding the old one is fenced) and the next generation; its cancel request
    is withdrawn in the same transaction (a new one cancels the run as usual).
    It replays from the start: the rows before the cut return their recorded
    values and the archived steps run again (an archived activity gets a new
    task, so a fresh retry budget; an archived sleep sleeps its full duration
    again from the re-run; a child the re-run starts again under the same id and
    workflow re-attaches to the existing instance and receives its outcome, so a
    child's result is never lost). Signals that archived rows consumed return to
    the inbox in their original order. ``reason`` is logged. ``only_failed``
    (what bulk resumes use) refuses, in the resume's own transaction, a run that
    did not fail on its own: a completed, cancelled or terminated one.

    Raises :class:`WorkflowNotFound`, :class:`InvalidWorkflowState` (the instance
    is running, or with ``only_failed`` did not fail) or
    :class:`HistoryKeyConflict` (``from_key`` is not in its current history).
    """
    reason = reason_text(reason)
    instance_id = known_id(instance_id)
    if from_key is not None and not isinstance(from_key, str):
        raise TypeError("from_key must be a string")
    if not isinstance(only_failed, bool):
        raise TypeError("only_failed must be a bool")
    store = client_store()
    outcome: ResumeOutcome = store.recovery.resume(instance_id, from_key, only_failed=only_failed)
    # The resumed run keeps its start's trace; the operator's span links to it.
    hooks_module.capture_trace_context(
        get_settings().hooks, "resume", instance_id=instance_id, workflow_name=outcome.workflow_name
    )

    def resumed() -> None:
        logger.info(
            "resumed %s (%s) as generation %d, archived %s%s",
            instance_id,
            outcome.workflow_name,
            outcome.generation,
            ", ".join(outcome.archived_keys),
            f": {reason}" if reason else "",
        )

    transaction.on_commit(resumed, using=store.alias)
    return outcome.generation


def fork_workflow(
    instance_id: str, *, from_key: str | None = None, new_instance_id: str | None = None
) -> str:
    """Start a new instance that replays a copy of another's history before ``from_key``,
    and return its id.

    The new instance (default id ``<instance_id>/fork-<n>``) has the source's
    workflow name and input, no parent, and ``describe(new).forked_from`` naming
    the source. It holds a copy of the source's history rows before the cut
    (``from_key``, or as for :func:`resume_workflow`; a completed source: every
    row but the close) and of its signals, those the source consumed from the
    cut on pending again, and runs the rest with the current code. The source is
    read, never written, whatever its status. A child the copied part started
    stays the source's; a child the fork starts again under an explicit id that
    the source's child holds fails to start with :class:`WorkflowAlreadyStarted`
    (default child ids derive from the parent's id, so a fork's differ).

    Raises :class:`WorkflowNotFound`, :class:`HistoryKeyConflict` (``from_key``
    is not in the source's history), :class:`WorkflowStartRejected` (an invalid
    ``new_instance_id``) or :class:`WorkflowAlreadyStarted` (it is taken).
    """
    instance_id = known_id(instance_id)
    if from_key is not None and not isinstance(from_key, str):
        raise TypeError("from_key must be a string")
    if new_instance_id is not None:
        new_instance_id = validate_instance_id(new_instance_id)
    store = client_store()
    hooks = get_settings().hooks

    def trace(new_id: str, name: str) -> str | None:
        return hooks_module.capture_trace_context(
            hooks, "fork", instance_id=new_id, workflow_name=name, source=instance_id
        )

    new_id, name = store.recovery.fork(instance_id, from_key, new_instance_id, trace)

    def forked() -> None:
        logger.info("forked %s (%s) as %s", instance_id, name, new_id)

    transaction.on_commit(forked, using=store.alias)
    return new_id


aresume_workflow = sync_to_async(resume_workflow)
afork_workflow = sync_to_async(fork_workflow)


def select_instances(
    *,
    status: str,
    workflow_name: str | None = None,
    since: timedelta | None = None,
    batch: int = MAX_SELECTION_BATCH,
    exclude_terminated: bool = False,
    attributes: Mapping[str, Any] | None = None,
    paused: bool | None = None,
) -> Iterator[list[str]]:
    """The ids of the instances a bulk operation acts on, in batches of at most ``batch``.

    ``status`` is required; ``workflow_name`` is an exact name; ``since`` keeps
    the instances that closed (a running one: started) within that duration;
    ``exclude_terminated`` leaves out failed runs closed by a terminate;
    ``attributes`` are search attribute filters as :func:`find_instances` takes them
    (every bulk operation selects with them: resume, fork, terminate, pause,
    unpause); ``paused`` keeps only the paused (True) or only the other (False)
    running instances. Ids
    come in order, each batch read after the previous one was handed over (keyset
    pagination on the id), so acting on a batch before asking for the next is
    safe and each read is bounded.
    """
    if status not in WorkflowStatus.values:
        raise ValueError(f"unknown status {status!r}: one of {', '.join(WorkflowStatus.values)}")
    if not 1 <= batch <= MAX_SELECTION_BATCH:
        raise ValueError(f"batch must be between 1 and {MAX_SELECTION_BATCH}")
    conditions = parse_filters(attributes)
    reads = client_store().operator_reads
    cutoff = None if since is None else timezone.now() - since
    after = ""
    while True:
        ids = reads.selected_ids(
            status=status,
            workflow_name=workflow_name,
            exclude_terminated=exclude_terminated,
            paused=paused,
            since=cutoff,
            attributes=conditions,
            after=after,
            limit=batch,
        )
        if not ids:
            return
        yield ids
        if len(ids) < batch:
            return
        after = ids[-1]
