"""The package root is the public API: pinned, importable, and free of models at import."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

import selvedge_django as sv
from tests.conftest import ROOT

# Changing this list changes the public API: update it on purpose, with the docs.
EXPECTED_ALL = [
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
    "CompensationError",
    "ExecutionStorageError",
    "Fenced",
    "Future",
    "HistoryKeyConflict",
    "HistoryKeyNotFound",
    "HistoryLimitExceeded",
    "InboxFull",
    "InstanceClosed",
    "InstancePage",
    "InvalidSchedule",
    "InvalidSignalChannel",
    "InvalidSignalPayload",
    "InvalidWorkflowState",
    "LeaseLost",
    "NondeterminismError",
    "NotActivityContext",
    "PayloadConversionError",
    "PayloadDecodeError",
    "PayloadTooDeep",
    "PayloadTooLarge",
    "PreparedStatementError",
    "QueryCommandError",
    "QueryFailed",
    "QueryNotFound",
    "QueryTimeout",
    "QueueInfo",
    "ReceiveTimeout",
    "RecordedEvent",
    "RecordedHistory",
    "RecordedInstance",
    "RecordedSignal",
    "RecordedStreamEntry",
    "ReplayDecodeError",
    "ReplayError",
    "ReplayOutcomeError",
    "ReplayResult",
    "RetryExhaustedError",
    "RetryPolicy",
    "ScheduleAlreadyExists",
    "ScheduleDescription",
    "ScheduleNotFound",
    "ScopeCancelled",
    "SelvedgeError",
    "StreamClosed",
    "StreamEntry",
    "StreamLimitExceeded",
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
    "WorkflowHandle",
    "WorkflowNameConflict",
    "WorkflowNotFound",
    "WorkflowNotRegistered",
    "WorkflowPanicError",
    "WorkflowResult",
    "WorkflowStartRejected",
    "WorkflowStatus",
    "WorkflowTerminated",
    "abackfill_schedule",
    "acancel_workflow",
    "acreate_schedule",
    "activity",
    "activity_cancelled",
    "activity_info",
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
    "create_schedule",
    "delete_schedule",
    "describe",
    "describe_schedule",
    "export_history",
    "find_instances",
    "fork_workflow",
    "get_handle",
    "get_workflow_result",
    "heartbeat",
    "hooks",
    "list_activity_tasks",
    "list_queues",
    "list_schedules",
    "parse_history",
    "pause_queue",
    "pause_schedule",
    "pause_workflow",
    "query",
    "read_stream",
    "replay_history",
    "replay_instance",
    "resume_workflow",
    "signal",
    "signal_with_start",
    "start_workflow",
    "start_workflows",
    "terminate_workflow",
    "trigger_schedule",
    "unpause_queue",
    "unpause_schedule",
    "unpause_workflow",
    "update_schedule",
    "wait_workflow",
    "workflow",
    "write_stream",
]


def test_all_is_pinned() -> None:
    assert sorted(sv.__all__) == EXPECTED_ALL
    assert len(sv.__all__) == len(set(sv.__all__))


@pytest.mark.parametrize("name", EXPECTED_ALL)
def test_every_exported_name_resolves(name: str) -> None:
    value = getattr(sv, name)
    assert value is not None
    assert name in dir(sv)


def test_the_type_checker_sees_every_name_the_lazy_loader_loads() -> None:
    # The names under ``if TYPE_CHECKING:`` are the type checker's whole view of the
    # lazily loaded ones: a name missing there is Any to a user's mypy.
    tree = ast.parse((ROOT / "selvedge_django" / "__init__.py").read_text(encoding="utf-8"))
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {
        alias.asname or alias.name
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == set(sv._LAZY)
    assert set(sv._LAZY) <= set(sv.__all__)


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError):
        sv.no_such_name  # noqa: B018


def test_error_tree() -> None:
    errors = [
        getattr(sv, name)
        for name in EXPECTED_ALL
        if isinstance(getattr(sv, name), type) and issubclass(getattr(sv, name), BaseException)
    ]
    assert len(errors) > 30
    for cls in errors:
        if issubclass(cls, sv.Cancelled):
            # Like asyncio.CancelledError: ``except Exception`` does not swallow it.
            assert not issubclass(cls, Exception), cls
        else:
            assert issubclass(cls, sv.SelvedgeError), cls
    assert issubclass(sv.WorkflowNotFound, LookupError)
    assert issubclass(sv.ActivityTimeoutError, TimeoutError)
    assert issubclass(sv.ReceiveTimeout, TimeoutError)
    for closed in (
        sv.WorkflowAlreadyCompleted,
        sv.WorkflowAlreadyFailed,
        sv.WorkflowAlreadyCancelled,
    ):
        assert issubclass(closed, sv.InstanceClosed)
    assert issubclass(sv.InvalidSchedule, ValueError)
    assert issubclass(sv.ScheduleAlreadyExists, sv.InvalidSchedule)
    assert issubclass(sv.ScheduleNotFound, LookupError)
    assert issubclass(sv.WorkflowCancelled, sv.Cancelled)
    assert issubclass(sv.ScopeCancelled, sv.Cancelled)


def test_errors_use_their_docstring_as_default_message() -> None:
    assert str(sv.WorkflowStartRejected()) == "The start was refused before any row was written."
    assert sv.ApplicationError("boom", type="T").message == "boom"


def test_importing_the_package_imports_no_models() -> None:
    code = (
        "import sys\n"
        "import selvedge_django as sv\n"
        "assert sv.activity and sv.workflow and sv.RetryPolicy\n"
        "loaded = [m for m in ('selvedge_django.models', 'selvedge_django.operations',\n"
        "                      'selvedge_django.storage', 'django.db.models')\n"
        "          if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(ROOT),
        env={"PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_the_models_and_schedules_packages_re_export_their_modules_names() -> None:
    """``selvedge_django.models.X`` and ``selvedge_django.schedules.X`` stay the import
    paths of every public name, whichever module of the package defines it."""
    import selvedge_django.flow_models
    from selvedge_django import models, operations, schedules
    from selvedge_django.models import instances, streams, system, tasks
    from selvedge_django.models import schedules as schedule_models
    from selvedge_django.schedules import definitions, slots

    modules = (instances, tasks, schedule_models, streams, system)
    assert sorted(models.__all__) == sorted(name for m in modules for name in m.__all__)
    for module in modules:
        for name in module.__all__:
            assert getattr(models, name) is getattr(module, name), name
    assert sorted(schedules.__all__) == sorted([*definitions.__all__, *slots.__all__])
    for module in (definitions, slots):
        for name in module.__all__:
            assert getattr(schedules, name) is getattr(module, name), name
    # Migrations 0017 and 0018 name the index expression by its old path.
    assert selvedge_django.flow_models.PriorityRank is models.PriorityRank
    assert sv.WorkflowStatus is models.WorkflowStatus
    assert operations.ScheduleDescription is schedules.ScheduleDescription
