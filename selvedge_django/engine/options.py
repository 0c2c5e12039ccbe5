"""Activity options and retry policies: validated at definition or call time."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from .durations import Duration, optional_seconds, to_seconds
from .identifiers import instance_id_problem

__all__ = ["MAX_PRIORITY", "MIN_PRIORITY", "ActivityOptions", "RetryPolicy", "check_priority"]

# Priorities of starts and activity tasks: whole numbers, larger first.
MIN_PRIORITY = -100
MAX_PRIORITY = 100


def check_priority(value: object, what: str = "priority") -> int:
    """Return ``value`` as a priority; TypeError or ValueError names what is wrong."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be a whole number, not {value!r}"[:200])
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{what} must be from {MIN_PRIORITY} to {MAX_PRIORITY}, not {value}")
    return int(value)


@dataclass(frozen=True)
class RetryPolicy:
    """How an activity is retried after a retryable failure.

    ``max_attempts`` counts executions including the first (1 = never retry,
    0 = retry without limit). The delay before retry ``n`` (1-based) is
    ``initial_interval * backoff_coefficient ** (n - 1)``, capped by
    ``max_interval``. ``non_retryable_errors`` lists exception classes that stop
    retrying; it is matched by the worker that runs the attempt and never stored.
    """

    max_attempts: int = 5
    initial_interval: Duration = 1.0
    backoff_coefficient: float = 2.0
    max_interval: Duration = 60.0
    non_retryable_errors: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise TypeError(f"max_attempts must be an int, not {self.max_attempts!r}")
        if self.max_attempts < 0:
            raise ValueError(f"max_attempts must be 0 (unlimited) or more, not {self.max_attempts}")
        initial = to_seconds(self.initial_interval, "initial_interval")
        maximum = to_seconds(self.max_interval, "max_interval")
        if isinstance(self.backoff_coefficient, bool) or not isinstance(
            self.backoff_coefficient, int | float
        ):
            raise TypeError("backoff_coefficient must be a number")
        if math.isnan(self.backoff_coefficient) or not 1.0 <= self.backoff_coefficient < 1e6:
            raise ValueError(
                f"backoff_coefficient must be at least 1, not {self.backoff_coefficient}"
            )
        if maximum < initial:
            raise ValueError("max_interval must not be shorter than initial_interval")
        errors = self.non_retryable_errors
        if not isinstance(errors, Iterable) or isinstance(errors, str | bytes):
            raise TypeError("non_retryable_errors must be a list of exception classes")
        errors = tuple(errors)
        for cls in errors:
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                raise TypeError(f"non_retryable_errors holds {cls!r}, not an exception class")
        object.__setattr__(self, "non_retryable_errors", errors)
        object.__setattr__(self, "initial_interval", initial)
        object.__setattr__(self, "max_interval", maximum)
        object.__setattr__(self, "backoff_coefficient", float(self.backoff_coefficient))

    def delay_for(self, failures: int) -> float:
        """Return the backoff in seconds after ``failures`` failed attempts (1-based)."""
        exponent = max(0, failures - 1)
        initial = float(self.initial_interval)  # type: ignore[arg-type]
        try:
            delay = initial * (self.backoff_coefficient**exponent)
        except OverflowError:
            delay = math.inf
        return min(delay, float(self.max_interval))  # type: ignore[arg-type]

    def exhausted(self, failures: int) -> bool:
        """Return True when ``failures`` failed attempts use up the budget."""
        return self.max_attempts != 0 and failures >= self.max_attempts

    def to_json(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "initial_interval": self.initial_interval,
            "backoff_coefficient": self.backoff_coefficient,
            "max_interval": self.max_interval,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RetryPolicy:
        return cls(
            max_attempts=int(data.get("max_attempts", 5)),
            initial_interval=float(data.get("initial_interval", 1.0)),
            backoff_coefficient=float(data.get("backoff_coefficient", 2.0)),
            max_interval=float(data.get("max_interval", 60.0)),
        )


@dataclass(frozen=True)
class ActivityOptions:
    """Execution policy of one activity task, resolved and recorded at reservation.

    Per-call options override the definition's defaults field by field: a field
    left empty (``""`` or None) inherits the default.
    """

    queue: str = ""
    start_to_close_timeout: Duration | None = None
    schedule_to_start_timeout: Duration | None = None
    heartbeat_timeout: Duration | None = None
    retry_policy: RetryPolicy | None = None
    # Claim order, -100 to 100, larger first (None: inherit; 0 when set nowhere).
    priority: int | None = None
    # At most max_concurrency attempts of tasks sharing concurrency_key run at once,
    # across all workers; max_concurrency alone limits the activity (its name is the key).
    concurrency_key: str | None = None
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.queue, str):
            raise TypeError(f"queue must be a string, not {self.queue!r}")
        if len(self.queue) > 255:
            raise ValueError("queue names are at most 255 characters")
        if self.queue and instance_id_problem(self.queue, "queue") is not None:
            raise ValueError(
                f"queue {self.queue!r} must not contain control characters or lone surrogates"
            )
        for name in ("start_to_close_timeout", "schedule_to_start_timeout", "heartbeat_timeout"):
            object.__setattr__(self, name, optional_seconds(getattr(self, name), name))
        if self.retry_policy is not None and not isinstance(self.retry_policy, RetryPolicy):
            raise TypeError("retry_policy must be a RetryPolicy")
        if self.priority is not None:
            check_priority(self.priority)
        key = self.concurrency_key
        if key is not None:
            if not isinstance(key, str):
                raise TypeError(f"concurrency_key must be a string, not {key!r}"[:200])
            if not 1 <= len(key) <= 255 or instance_id_problem(key, "concurrency_key"):
                raise ValueError(
                    "concurrency_key must be 1 to 255 characters without control characters"
                    " or lone surrogates"
                )
        limit = self.max_concurrency
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000
        ):
            raise ValueError(
                f"max_concurrency must be a whole number from 1 to 10000, not {limit!r}"
            )

    @property
    def effective_priority(self) -> int:
        """The priority recorded on the task (0 when set nowhere)."""
        return 0 if self.priority is None else self.priority

    def concurrency_limit(self, activity_name: str) -> tuple[str, int] | None:
        """The (key, limit) the task's claims respect, or None for no limit.

        A ``concurrency_key`` needs a ``max_concurrency`` (here or on the definition);
        ``max_concurrency`` alone limits every task of the activity.
        """
        if self.max_concurrency is None:
            if self.concurrency_key is not None:
                raise ValueError(
                    f"activity {activity_name!r} has a concurrency_key but no max_concurrency"
                )
            return None
        return (self.concurrency_key or activity_name, self.max_concurrency)

    def merged(self, override: ActivityOptions | None) -> ActivityOptions:
        """Return these defaults with the non-empty fields of ``override`` applied."""
        if override is None:
            return self
        if override.retry_policy is not None and override.retry_policy.non_retryable_errors:
            raise ValueError(
                "non_retryable_errors can only be set on the activity definition, not per call"
            )
        changes: dict[str, Any] = {}
        if override.queue:
            changes["queue"] = override.queue
        for name in (
            "start_to_close_timeout",
            "schedule_to_start_timeout",
            "heartbeat_timeout",
            "retry_policy",
            "priority",
            "concurrency_key",
            "max_concurrency",
        ):
            value = getattr(override, name)
            if value is not None:
                changes[name] = value
        return replace(self, **changes)

    def effective_retry_policy(self) -> RetryPolicy:
        return self.retry_policy or RetryPolicy()

    def to_json(self) -> dict[str, Any]:
        """Return the recorded form (without non-retryable error classes)."""
        return {
            "queue": self.queue,
            "start_to_close_timeout": self.start_to_close_timeout,
            "schedule_to_start_timeout": self.schedule_to_start_timeout,
            "heartbeat_timeout": self.heartbeat_timeout,
            "retry_policy": self.effective_retry_policy().to_json(),
            # Flow control only where set: the stored form of other tasks is unchanged.
            **{
                name: getattr(self, name)
                for name in ("priority", "concurrency_key", "max_concurrency")
                if getattr(self, name) is not None
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ActivityOptions:
        policy = data.get("retry_policy")
        return cls(
            queue=data.get("queue", ""),
            start_to_close_timeout=data.get("start_to_close_timeout"),
            schedule_to_start_timeout=data.get("schedule_to_start_timeout"),
            heartbeat_timeout=data.get("heartbeat_timeout"),
            retry_policy=RetryPolicy.from_json(policy) if policy else None,
            priority=data.get("priority"),
            concurrency_key=data.get("concurrency_key"),
            max_concurrency=data.get("max_concurrency"),
        )
