"""The operations layer: every way to act on or read workflows from outside them.

The public client API (``selvedge_django.*``), the admin and ``manage.py
runselvedge`` call these functions and nothing below them; none of them sets a
status by hand. One module per job:

- ``instances``: start, signal, cancel, terminate (writes, after-commit wake-ups);
- ``bulk``: many starts in one transaction (``start_workflows``, many ``django.tasks``);
- ``results``: the result now, or a (sync or async) wait for the close;
- ``handles``: ``get_handle``, and the calls a typed ``WorkflowHandle`` makes;
- ``find``: describe one instance, list its activity tasks, find instances;
- ``history``: export a portable history, replay checks, queries;
- ``recovery``: resume a closed instance in place, fork one into a new instance;
- ``streams``: read an instance's stream entries as they come (sync and async);
- ``pauses``: pause and unpause instances and activity queues, list the queues;
- ``prune``: delete old closed instances in bounded batches;
- ``versions``: running instances per code version and per patch;
- ``schedules``: create, change, pause, trigger, backfill, describe schedules;
- ``status``: the status report (workers, leader, queues, backlogs, troubled instances) of
  ``runselvedge status`` and the health view, and the health check itself;
- ``base``: the client store, the read store of the operator's reads (on
  ``SELVEDGE["READ_DATABASE"]``; ``primary_reads()`` for reads that must see a write just
  made), and the id and text rules every lookup shares.

Writes validate their input before anything is written, join the caller's
``transaction.atomic()`` when there is one, and wake workers only after commit.
"""

from __future__ import annotations

from ..engine.portable import (
    RecordedEvent,
    RecordedHistory,
    RecordedInstance,
    RecordedSignal,
    parse_history,
)
from .base import (
    client_store,
    known_id,
    primary_reads,
    read_alias,
    read_store,
    validate_instance_id,
)
from .bulk import astart_workflows, start_workflows
from .find import (
    ActivityTaskInfo,
    InstancePage,
    WorkflowDescription,
    adescribe,
    afind_instances,
    alist_activity_tasks,
    describe,
    find_instances,
    iter_instances,
    list_activity_tasks,
)
from .handles import get_handle
from .history import (
    REDACTED,
    aexport_history,
    aquery,
    export_history,
    query,
    query_handler_names,
    redacted,
    replay_check,
    replay_history,
    replay_instance,
)
from .instances import (
    acancel_workflow,
    asignal,
    asignal_with_start,
    astart_workflow,
    aterminate_workflow,
    cancel_workflow,
    signal,
    signal_with_start,
    start_workflow,
    terminate_workflow,
)
from .keys import rotate_keys
from .pauses import (
    QueueInfo,
    alist_queues,
    apause_queue,
    apause_workflow,
    aunpause_queue,
    aunpause_workflow,
    list_queues,
    pause_queue,
    pause_workflow,
    select_paused,
    unpause_queue,
    unpause_workflow,
)
from .prune import (
    MAX_PRUNE_BATCH,
    prune,
)
from .recovery import (
    afork_workflow,
    aresume_workflow,
    fork_workflow,
    resume_workflow,
    select_instances,
)
from .results import (
    WorkflowResult,
    aget_workflow_result,
    await_workflow,
    get_workflow_result,
    wait_workflow,
)
from .schedules import (
    ScheduleDescription,
    abackfill_schedule,
    acreate_schedule,
    adelete_schedule,
    adescribe_schedule,
    alist_schedules,
    apause_schedule,
    atrigger_schedule,
    aunpause_schedule,
    aupdate_schedule,
    backfill_schedule,
    create_schedule,
    delete_schedule,
    describe_schedule,
    list_schedules,
    pause_schedule,
    trigger_schedule,
    unpause_schedule,
    update_schedule,
)
from .status import (
    HealthCheck,
    check_health,
    status_report,
)
from .streams import (
    StreamEntry,
    aread_stream,
    read_stream,
)
from .versions import (
    WorkflowVersions,
    running_versions,
)

# The client store's old private name (tests, benchmarks and older callers use it).
_store = client_store

__all__ = [
    "MAX_PRUNE_BATCH",
    "REDACTED",
    "ActivityTaskInfo",
    "HealthCheck",
    "InstancePage",
    "QueueInfo",
    "RecordedEvent",
    "RecordedHistory",
    "RecordedInstance",
    "RecordedSignal",
    "ScheduleDescription",
    "StreamEntry",
    "WorkflowDescription",
    "WorkflowResult",
    "WorkflowVersions",
    "abackfill_schedule",
    "acancel_workflow",
    "acreate_schedule",
    "adelete_schedule",
    "adescribe",
    "adescribe_schedule",
    "aexport_history",
    "afind_instances",
    "afork_workflow",
    "aget_workflow_result",
    "alist_activity_tasks",
    "alist_queues",
    "alist_schedules",
    "apause_queue",
    "apause_schedule",
    "apause_workflow",
    "aquery",
    "aread_stream",
    "aresume_workflow",
    "asignal",
    "asignal_with_start",
    "astart_workflow",
    "astart_workflows",
    "aterminate_workflow",
    "atrigger_schedule",
    "aunpause_queue",
    "aunpause_schedule",
    "aunpause_workflow",
    "aupdate_schedule",
    "await_workflow",
    "backfill_schedule",
    "cancel_workflow",
    "check_health",
    "client_store",
    "create_schedule",
    "delete_schedule",
    "describe",
    "describe_schedule",
    "export_history",
    "find_instances",
    "fork_workflow",
    "get_handle",
    "get_workflow_result",
    "iter_instances",
    "known_id",
    "list_activity_tasks",
    "list_queues",
    "list_schedules",
    "parse_history",
    "pause_queue",
    "pause_schedule",
    "pause_workflow",
    "primary_reads",
    "prune",
    "query",
    "query_handler_names",
    "read_alias",
    "read_store",
    "read_stream",
    "redacted",
    "replay_check",
    "replay_history",
    "replay_instance",
    "resume_workflow",
    "rotate_keys",
    "running_versions",
    "select_instances",
    "select_paused",
    "signal",
    "signal_with_start",
    "start_workflow",
    "start_workflows",
    "status_report",
    "terminate_workflow",
    "trigger_schedule",
    "unpause_queue",
    "unpause_schedule",
    "unpause_workflow",
    "update_schedule",
    "validate_instance_id",
    "wait_workflow",
]
