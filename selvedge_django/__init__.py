"""selvedge_django: durable execution for Django.

Workflows are plain functions whose every step is recorded in the project's own
database; a workflow resumes after a crash, deploy or restart by replaying its
recorded history. See the README and docs/ for a tour.

The names below are the public API. Those that touch the database are loaded on
first use, so importing this package never imports models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import hooks
from .engine.activity import ActivityInfo, activity_cancelled, activity_info, heartbeat
from .engine.context import WorkflowContext
from .engine.handles import ChildHandle, Future, Timer
from .engine.options import ActivityOptions, RetryPolicy
from .exceptions import (
    ActivityCancelled,
    ActivityNameConflict,
    ActivityTimeoutError,
    ApplicationError,
    Cancelled,
    ExecutionStorageError,
    Fenced,
    HistoryKeyConflict,
    HistoryLimitExceeded,
    InboxFull,
    InstanceClosed,
    InvalidSignalChannel,
    InvalidSignalPayload,
    LeaseLost,
    NondeterminismError,
    NotActivityContext,
    PayloadTooDeep,
    PayloadTooLarge,
    QueryCommandError,
    QueryFailed,
    QueryNotFound,
    QueryTimeout,
    ReceiveTimeout,
    ReplayDecodeError,
    ReplayError,
    ReplayOutcomeError,
    RetryExhaustedError,
    ScopeCancelled,
    SelvedgeError,
    UnsupportedHistoryFormat,
    WorkflowAlreadyCancelled,
    WorkflowAlreadyCompleted,
    WorkflowAlreadyFailed,
    WorkflowAlreadyStarted,
    WorkflowCancelled,
    WorkflowNameConflict,
    WorkflowNotFound,
    WorkflowNotRegistered,
    WorkflowPanicError,
    WorkflowStartRejected,
    WorkflowTerminated,
)
from .registry import ActivityDefinition, WorkflowDefinition, activity, workflow

if TYPE_CHECKING:
    from .history import (
        RecordedEvent,
        RecordedHistory,
        RecordedInstance,
        RecordedSignal,
        export_history,
        parse_history,
        query,
        replay_history,
        replay_instance,
    )
    from .models import WorkflowStatus
    from .operations import (
        ActivityTaskInfo,
        InstancePage,
        WorkflowDescription,
        WorkflowResult,
        acancel_workflow,
        adescribe,
        aexport_history,
        afind_instances,
        aget_workflow_result,
        alist_activity_tasks,
        aquery,
        asignal,
        astart_workflow,
        aterminate_workflow,
        await_workflow,
        cancel_workflow,
        describe,
        find_instances,
        get_workflow_result,
        list_activity_tasks,
        signal,
        start_workflow,
        terminate_workflow,
        wait_workflow,
    )

__version__ = "0.1.0.dev0"

__all__ = [
    "ActivityCancelled",
    "ActivityDefinition",
    "ActivityInfo",
    "ActivityNameConflict",
    "ActivityOptions",
    "ActivityTaskInfo",
    "ActivityTimeoutError",
    "ApplicationError",
    "Cancelled",
    "ChildHandle",
    "ExecutionStorageError",
    "Fenced",
    "Future",
    "HistoryKeyConflict",
    "HistoryLimitExceeded",
    "InboxFull",
    "InstanceClosed",
    "InstancePage",
    "InvalidSignalChannel",
    "InvalidSignalPayload",
    "LeaseLost",
    "NondeterminismError",
    "NotActivityContext",
    "PayloadTooDeep",
    "PayloadTooLarge",
    "QueryCommandError",
    "QueryFailed",
    "QueryNotFound",
    "QueryTimeout",
    "ReceiveTimeout",
    "RecordedEvent",
    "RecordedHistory",
    "RecordedInstance",
    "RecordedSignal",
    "ReplayDecodeError",
    "ReplayError",
    "ReplayOutcomeError",
    "RetryExhaustedError",
    "RetryPolicy",
    "ScopeCancelled",
    "SelvedgeError",
    "Timer",
    "UnsupportedHistoryFormat",
    "WorkflowAlreadyCancelled",
    "WorkflowAlreadyCompleted",
    "WorkflowAlreadyFailed",
    "WorkflowAlreadyStarted",
    "WorkflowCancelled",
    "WorkflowContext",
    "WorkflowDefinition",
    "WorkflowDescription",
    "WorkflowNameConflict",
    "WorkflowNotFound",
    "WorkflowNotRegistered",
    "WorkflowPanicError",
    "WorkflowResult",
    "WorkflowStartRejected",
    "WorkflowStatus",
    "WorkflowTerminated",
    "acancel_workflow",
    "activity",
    "activity_cancelled",
    "activity_info",
    "adescribe",
    "aexport_history",
    "afind_instances",
    "aget_workflow_result",
    "alist_activity_tasks",
    "aquery",
    "asignal",
    "astart_workflow",
    "aterminate_workflow",
    "await_workflow",
    "cancel_workflow",
    "describe",
    "export_history",
    "find_instances",
    "get_workflow_result",
    "heartbeat",
    "hooks",
    "list_activity_tasks",
    "parse_history",
    "query",
    "replay_history",
    "replay_instance",
    "signal",
    "start_workflow",
    "terminate_workflow",
    "wait_workflow",
    "workflow",
]

_LAZY = {
    "RecordedEvent": "selvedge_django.history",
    "RecordedHistory": "selvedge_django.history",
    "RecordedInstance": "selvedge_django.history",
    "RecordedSignal": "selvedge_django.history",
    "export_history": "selvedge_django.history",
    "parse_history": "selvedge_django.history",
    "query": "selvedge_django.history",
    "replay_history": "selvedge_django.history",
    "replay_instance": "selvedge_django.history",
    "aexport_history": "selvedge_django.operations",
    "aquery": "selvedge_django.operations",
    "WorkflowStatus": "selvedge_django.models",
    "ActivityTaskInfo": "selvedge_django.operations",
    "InstancePage": "selvedge_django.operations",
    "WorkflowDescription": "selvedge_django.operations",
    "WorkflowResult": "selvedge_django.operations",
    "adescribe": "selvedge_django.operations",
    "afind_instances": "selvedge_django.operations",
    "aget_workflow_result": "selvedge_django.operations",
    "alist_activity_tasks": "selvedge_django.operations",
    "acancel_workflow": "selvedge_django.operations",
    "asignal": "selvedge_django.operations",
    "cancel_workflow": "selvedge_django.operations",
    "signal": "selvedge_django.operations",
    "astart_workflow": "selvedge_django.operations",
    "await_workflow": "selvedge_django.operations",
    "describe": "selvedge_django.operations",
    "find_instances": "selvedge_django.operations",
    "get_workflow_result": "selvedge_django.operations",
    "list_activity_tasks": "selvedge_django.operations",
    "start_workflow": "selvedge_django.operations",
    "terminate_workflow": "selvedge_django.operations",
    "aterminate_workflow": "selvedge_django.operations",
    "wait_workflow": "selvedge_django.operations",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'selvedge_django' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
