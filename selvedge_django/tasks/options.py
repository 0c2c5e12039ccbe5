"""The backend's ``OPTIONS`` and a task's own options, validated and turned into activity options.

``OPTIONS`` keys (all optional):

- ``retry_policy``: a :class:`~selvedge_django.RetryPolicy`, or a dict of its fields
  (``non_retryable_errors`` as exception classes or their dotted paths);
- ``start_to_close_timeout``: seconds or a ``timedelta`` for each attempt;
- ``task_modules``: dotted module paths that define tasks outside the apps' ``tasks``
  modules; the worker imports them (``results.discover_tasks``) before it runs a task.

A task defined with ``@task(retry_policy=...)`` (the backend's task class takes it)
overrides the backend's policy. What an enqueue records is the policy without its
error classes; those are matched by the worker from its own configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils.module_loading import import_string

from ..engine.options import ActivityOptions, RetryPolicy

__all__ = ["OPTION_KEYS", "activity_options", "parse_retry_policy", "retry_policy_for"]

OPTION_KEYS = frozenset({"retry_policy", "start_to_close_timeout", "task_modules"})


def parse_retry_policy(value: object) -> RetryPolicy | None:
    """A RetryPolicy from a RetryPolicy, a dict of its fields, or None; TypeError or ValueError
    for anything else."""
    if value is None or isinstance(value, RetryPolicy):
        return value
    if not isinstance(value, Mapping):
        raise TypeError("retry_policy must be a RetryPolicy or a dict of its fields")
    fields = dict(value)
    unknown = set(fields) - {
        "max_attempts",
        "initial_interval",
        "backoff_coefficient",
        "max_interval",
        "non_retryable_errors",
    }
    if unknown:
        raise ValueError(f"retry_policy has unknown keys: {', '.join(sorted(unknown))}")
    errors = fields.get("non_retryable_errors", ())
    if isinstance(errors, str):
        raise TypeError("non_retryable_errors must be a list")
    fields["non_retryable_errors"] = tuple(
        import_string(e) if isinstance(e, str) else e for e in errors
    )
    return RetryPolicy(**fields)


def check_options(options: Mapping[str, Any]) -> list[str]:
    """The problems of a backend's OPTIONS, one sentence each (empty when valid)."""
    if not isinstance(options, Mapping):
        return ["OPTIONS must be a dict"]
    problems = []
    unknown = set(options) - OPTION_KEYS
    if unknown:
        problems.append(
            f"unknown OPTIONS {', '.join(map(repr, sorted(unknown)))}"
            f" (known: {', '.join(sorted(OPTION_KEYS))})"
        )
    try:
        parse_retry_policy(options.get("retry_policy"))
    except (TypeError, ValueError, ImportError) as error:
        problems.append(f"OPTIONS['retry_policy'] is invalid: {error}")
    modules = options.get("task_modules", ())
    if not isinstance(modules, list | tuple) or not all(isinstance(m, str) and m for m in modules):
        problems.append("OPTIONS['task_modules'] must be a list of dotted module paths")
    try:
        ActivityOptions(start_to_close_timeout=options.get("start_to_close_timeout"))
    except (TypeError, ValueError) as error:
        problems.append(f"OPTIONS['start_to_close_timeout'] is invalid: {error}")
    return problems


def retry_policy_for(task: Any) -> RetryPolicy | None:
    """The task's own policy (``@task(retry_policy=...)``), else its backend's OPTIONS one."""
    own = getattr(task, "retry_policy", None)
    if own is not None:
        return parse_retry_policy(own)
    return parse_retry_policy(task.get_backend().options.get("retry_policy"))


def activity_options(task: Any, queue: str) -> ActivityOptions:
    """The options the task's activity runs under (recorded at enqueue): its queue, its
    priority (claims take the highest first), the timeout and the retry policy."""
    options = task.get_backend().options
    return ActivityOptions(
        queue=queue,
        start_to_close_timeout=options.get("start_to_close_timeout"),
        retry_policy=retry_policy_for(task),
        priority=task.priority,
    )
