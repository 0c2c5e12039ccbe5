"""``SelvedgeBackend``: django.tasks tasks as durable activities under ``runselvedge worker``."""

from __future__ import annotations

import dataclasses
import functools
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import checks
from django.db import transaction
from django.utils import timezone

from .. import exceptions as exc
from ..conf import get_settings
from ..engine.options import RetryPolicy
from ..operations.bulk import TaskStart, start_tasks
from ..operations.task_records import database_now_ms, task_record
from . import compat
from .names import TASK_KEY, TASK_WORKFLOW
from .options import activity_options, check_options, parse_retry_policy
from .results import build_result, load_task
from .runner import run_task, run_task_activity, start_task

__all__ = ["SelvedgeBackend", "SelvedgeTask", "aenqueue_many", "enqueue_many"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SelvedgeTask(compat.Task):
    """Django's ``Task`` with a per-task retry policy: ``@task(retry_policy={...})``."""

    retry_policy: RetryPolicy | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        parse_retry_policy(self.retry_policy)  # refused at definition, not at enqueue
        super(SelvedgeTask, self).__post_init__()


class SelvedgeBackend(compat.BaseTaskBackend):
    """Run each enqueued task as one durable activity of the built-in ``selvedge.task``
    workflow: the instance id is the result id, the task's queue is the activity queue.

    ``enqueue`` joins the caller's ``transaction.atomic()`` (the task exists only if
    the transaction commits; ``task_enqueued`` is sent after the commit), the task's
    ``priority`` orders both its dispatch and its activity's claim (larger first, then
    the oldest, a minute of waiting worth a point), ``run_after``
    is a durable timer on the database clock, failures retry under ``OPTIONS
    ["retry_policy"]`` (or the task's own ``retry_policy``), and ``get_result`` reads
    the instance and its task from any process.
    """

    task_class = SelvedgeTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Start the task's instance (inside the caller's transaction when there is one)."""
        result, input = self._prepare(task, args, kwargs, now_ms=None, enqueued_at=None)
        try:
            start_task(
                input,
                instance_id=result.id,
                priority=task.priority,
                enqueued_at=result.enqueued_at,
            )
        except exc.WorkflowStartRejected as error:
            raise compat.InvalidTask(str(error)) from error
        self._enqueued_on_commit([result])
        return result

    def enqueue_many(
        self, calls: Iterable[tuple[Any, Sequence[Any], Mapping[str, Any]]]
    ) -> list[Any]:
        """Enqueue many tasks at once: ``calls`` holds ``(task, args, kwargs)`` triples.

        The bulk form of ``enqueue``, one ``TaskResult`` per call in order: all the
        instances commit in one transaction (the caller's, inside
        ``transaction.atomic()``), one statement per batch and table instead of a
        round trip and a commit each, and a bad call raises ``InvalidTask`` with
        nothing of the call written. The calls are prepared as the store takes them,
        a batch at a time, so that on PostgreSQL their preparation overlaps the
        server's inserts. ``task_enqueued`` is sent for each after commit.
        """
        items = list(calls)
        deferred = any(task.run_after is not None for task, _, _ in items)
        enqueued_at = timezone.now()
        now_ms = database_now_ms() if deferred else None
        checked: dict[int, tuple[dict[str, Any], Any]] = {}
        results: list[Any] = []

        def starts() -> Iterator[TaskStart]:
            ids = _result_ids(len(items))
            for (task, args, kwargs), result_id in zip(items, ids, strict=True):
                result, input = self._prepare(
                    task,
                    args,
                    kwargs,
                    now_ms=now_ms,
                    enqueued_at=enqueued_at,
                    checked=checked,
                    result_id=result_id,
                )
                results.append(result)
                yield TaskStart(
                    input,
                    instance_id=result.id,
                    priority=result.task.priority,
                    enqueued_at=result.enqueued_at,
                    deferred=int(input.get("delay_ms") or 0) > 0,
                )

        try:
            start_tasks(run_task, run_task_activity, starts())
        except exc.WorkflowStartRejected as error:
            raise compat.InvalidTask(str(error)) from error
        self._enqueued_on_commit(results)
        return results

    async def aenqueue_many(
        self, calls: Iterable[tuple[Any, Sequence[Any], Mapping[str, Any]]]
    ) -> list[Any]:
        """Async twin of :meth:`enqueue_many`."""
        return await sync_to_async(self.enqueue_many)(list(calls))

    def _prepare(
        self,
        task: Any,
        args: Any,
        kwargs: Any,
        *,
        now_ms: int | None,
        enqueued_at: datetime | None,
        checked: dict[int, tuple[dict[str, Any], Any]] | None = None,
        result_id: str | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Validate one call; its result and its workflow input.

        ``now_ms`` is the database clock for a deferred task (read here when None);
        ``enqueued_at`` the time recorded as its enqueue (now when None: the calls of one
        ``enqueue_many`` share one); ``result_id`` its id (a new one when None).
        ``checked`` holds, by the task object's id, the activity options and the first
        result of the tasks already validated in this call: a task is immutable, so
        the calls of one share its validation and its options, and a call whose
        arguments are plain JSON values gets a result made like the first one's
        (:func:`_result_like`) instead of validated again.
        """
        seen = None if checked is None else checked.get(id(task))
        if seen is None:
            self.validate_task(task)
        result_id = result_id or uuid.uuid4().hex
        if seen is not None and _plain_json(args, kwargs):
            result = _result_like(seen[1], result_id, list(args), dict(kwargs))
        else:
            # Built first: TaskResult refuses arguments that are not JSON (TypeError,
            # ValueError).
            result = compat.TaskResult(
                task=task,
                id=result_id,
                status=compat.TaskResultStatus.READY,
                enqueued_at=None,
                started_at=None,
                finished_at=None,
                last_attempted_at=None,
                args=list(args),
                kwargs=dict(kwargs),
                backend=self.alias,
                errors=[],
                worker_ids=[],
            )
        if seen is None:
            seen = (activity_options(task, task.queue_name).to_json(), result)
            if checked is not None:
                checked[id(task)] = seen
        input: dict[str, Any] = {
            "task": task.module_path,
            "args": result.args,
            "kwargs": result.kwargs,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "options": seen[0],
        }
        if task.run_after is not None:
            input["run_after"] = task.run_after.isoformat()
            run_after_ms = round(task.run_after.timestamp() * 1000)
            clock_ms = database_now_ms() if now_ms is None else now_ms
            input["delay_ms"] = max(0, run_after_ms - clock_ms)
        # The result reports the start as the instance records it (get_result's value).
        object.__setattr__(result, "enqueued_at", enqueued_at or timezone.now())
        return result, input

    def _enqueued_on_commit(self, results: list[Any]) -> None:
        """Send ``task_enqueued`` for each of ``results`` once the enqueue commits."""
        sender = type(self)

        def send() -> None:
            if not compat.task_enqueued.receivers:  # none to tell (checked at commit)
                return
            for result in results:
                compat.task_enqueued.send(sender, task_result=result)

        transaction.on_commit(send, using=get_settings().database)

    def get_result(self, result_id: str) -> Any:
        """The result of ``result_id`` from the database (any process, no replay)."""
        try:
            record = task_record(str(result_id), TASK_KEY)
        except exc.WorkflowNotFound:
            raise compat.TaskResultDoesNotExist(result_id) from None
        if record.workflow_name != TASK_WORKFLOW or not isinstance(record.input, dict):
            raise compat.TaskResultDoesNotExist(result_id)
        return build_result(load_task(record.input), record)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """selvedge.E101: the app is not installed; selvedge.E102: invalid OPTIONS."""
        problems: list[checks.CheckMessage] = []
        if "selvedge_django" not in {
            name.rsplit(".apps.", 1)[0] for name in settings.INSTALLED_APPS
        }:
            problems.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses SelvedgeBackend, but selvedge_django is not"
                    " in INSTALLED_APPS",
                    hint="Add 'selvedge_django' to INSTALLED_APPS and run migrate.",
                    id="selvedge.E101",
                )
            )
        for problem in check_options(self.options):
            problems.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]: {problem}",
                    hint="See docs/tasks.md for the backend's OPTIONS.",
                    id="selvedge.E102",
                )
            )
        return problems


# The types whose values django.tasks' JSON normalisation returns as they are.
_PLAIN_JSON = frozenset({str, int, float, bool, type(None)})


def _plain_json(args: Any, kwargs: Any) -> bool:
    """Whether ``args`` is a list or tuple, and ``kwargs`` a dict by text keys, of plain
    JSON values only: ``TaskResult`` would keep them as they are (as a list and a dict)."""
    return (
        type(args) in (list, tuple)
        and type(kwargs) is dict
        and all(type(value) in _PLAIN_JSON for value in args)
        and all(type(key) is str and type(value) in _PLAIN_JSON for key, value in kwargs.items())
    )


# The fields of a result that each call of a bulk enqueue has of its own.
_OWN_FIELDS = frozenset({"id", "args", "kwargs", "errors", "worker_ids"})


@functools.cache
def _shared_fields(kind: type) -> tuple[str, ...]:
    """The fields of results of ``kind`` that the calls of one task share."""
    return tuple(f.name for f in dataclasses.fields(kind) if f.name not in _OWN_FIELDS)


def _result_like(first: Any, result_id: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """A ready result of ``first``'s task with its own id and arguments (already as
    ``TaskResult`` normalises them): ``first``'s fields but those, and new lists of
    errors and workers. Validating the arguments again through ``TaskResult`` is most
    of an enqueue's own time in a bulk enqueue of small tasks."""
    kind: type = type(first)
    result: Any = object.__new__(kind)
    put = object.__setattr__
    for name in _shared_fields(kind):
        put(result, name, getattr(first, name))
    put(result, "id", result_id)
    put(result, "args", args)
    put(result, "kwargs", kwargs)
    put(result, "errors", [])
    put(result, "worker_ids", [])
    return result


def _result_ids(count: int) -> list[str]:
    """``count`` new result ids, as ``uuid.uuid4().hex`` spells them (random, version 4,
    RFC 4122 variant), from one read of the system's random source."""
    digits = os.urandom(16 * count).hex()
    ids = []
    for start in range(0, 32 * count, 32):
        text = digits[start : start + 32]
        variant = "89ab"[int(text[16], 16) & 3]
        ids.append(f"{text[:12]}4{text[13:16]}{variant}{text[17:]}")
    return ids


def enqueue_many(calls: Iterable[tuple[Any, Sequence[Any], Mapping[str, Any]]]) -> list[Any]:
    """Enqueue many ``django.tasks`` calls at once: ``(task, args, kwargs)`` triples.

    Each task goes to its own backend (``task.get_backend()``, as ``task.enqueue``
    does), which must be a :class:`SelvedgeBackend`; the calls of one backend are one
    :meth:`SelvedgeBackend.enqueue_many`, and all of them commit in one transaction
    (the caller's inside ``transaction.atomic()``): a bad call raises ``InvalidTask``
    and none is enqueued. Returns the ``TaskResult`` of each call, in order.
    """
    items = list(calls)
    groups: dict[str, tuple[SelvedgeBackend, list[int]]] = {}
    backends: dict[str, Any] = {}  # by TASKS alias: looked up once
    for index, (task, _, _) in enumerate(items):
        backend = backends.get(task.backend)
        if backend is None:
            backend = backends[task.backend] = task.get_backend()
        if not isinstance(backend, SelvedgeBackend):
            raise compat.InvalidTask(
                f"enqueue_many needs SelvedgeBackend tasks; {task.module_path} uses"
                f" {type(backend).__name__} (TASKS[{task.backend!r}])"
            )
        groups.setdefault(backend.alias, (backend, []))[1].append(index)
    results: list[Any] = [None] * len(items)
    with transaction.atomic(using=get_settings().database):
        for backend, indexes in groups.values():
            enqueued = backend.enqueue_many([items[i] for i in indexes])
            for index, result in zip(indexes, enqueued, strict=True):
                results[index] = result
    return results


async def aenqueue_many(
    calls: Iterable[tuple[Any, Sequence[Any], Mapping[str, Any]]],
) -> list[Any]:
    """Async twin of :func:`enqueue_many`."""
    return await sync_to_async(enqueue_many)(list(calls))
