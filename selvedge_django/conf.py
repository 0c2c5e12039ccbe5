"""Settings: one dict, ``settings.SELVEDGE``, every key optional, read lazily.

``get_settings()`` validates the dict once and caches the result; the cache is
cleared when Django's ``setting_changed`` fires, so ``override_settings`` works
in tests. ``Worker(**overrides)`` takes the same keys in lower case.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .codecs import codec_setting, resolve_payloads
from .engine.durations import to_seconds

__all__ = [
    "DEFAULTS",
    "LeaseSettings",
    "SelvedgeSettings",
    "WorkflowCacheSettings",
    "get_settings",
    "resolve_settings",
    "workflow_cache_problems",
]

DEFAULT_LEASE = {"TTL": 30.0, "RENEW_INTERVAL": 10.0, "MARGIN": 5.0, "MAX_SKEW": 1.0}
# The worker's cache of suspended executions, on by default (docs/deployment.md): MAX_ENTRIES
# executions (0: none), a thread each, of at most MAX_BYTES estimated together, each
# preferred by its worker's dispatcher for STICKY_WINDOW seconds after it suspended.
DEFAULT_WORKFLOW_CACHE: dict[str, Any] = {
    "MAX_ENTRIES": 100,
    "MAX_BYTES": 64 * 1024 * 1024,
    "STICKY_WINDOW": 2.0,
}

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "WORKER_ID": None,
    "SERVICE_NAME": "",
    "CODE_VERSION": None,
    "COMPATIBLE_VERSIONS": None,
    "MAX_CONCURRENT_ACTIVITIES": 10,
    "MAX_CONCURRENT_RESUMPTIONS": 10,
    "ACTIVITY_QUEUES": None,
    "ACTIVITY_POLL_INTERVAL": 1.0,
    "MAX_POLL_INTERVAL": 60.0,
    "WAIT_POLL_INTERVAL": 1.0,
    "TIMER_CHECK_INTERVAL": 1.0,
    "WORKFLOW_RESUMPTION_INTERVAL": 1.0,
    "MAX_WORKFLOWS_PER_BATCH": 100,
    "MAX_TIMERS_PER_BATCH": 100,
    "LEASE": DEFAULT_LEASE,
    "WORKFLOW_CACHE": DEFAULT_WORKFLOW_CACHE,
    "LEADER_LEASE_DURATION": 45.0,
    "LEADER_HEARTBEAT_INTERVAL": 15.0,
    "LISTEN_NOTIFY": None,
    "LISTEN_DATABASE": None,
    "RENEWAL_DATABASE": None,
    "READ_DATABASE": None,
    "PREPARED_STATEMENTS": True,
    "RUN_LOCAL_STARTS": True,
    "SHUTDOWN_TIMEOUT": 30.0,
    "CLOCK": None,
    "HOOKS": None,
    "METRICS": False,
    "PAYLOAD_CONVERTER": None,
    "PAYLOAD_CODEC": None,
    "PAYLOAD_KEYS": None,
    "MODULES": (),
    "MAX_PAYLOAD_BYTES": 2 * 1024 * 1024,
    "HISTORY_WARNING_THRESHOLD": 10_000,
    "MAX_HISTORY_EVENTS": 100_000,
    "MAX_HISTORY_BYTES": 64 * 1024 * 1024,
    "MAX_PENDING_SIGNALS": 10_000,
    "MAX_STREAM_ENTRIES": 100_000,
    "SQLITE_SYNCHRONOUS": "FULL",
    "EXECUTION_ERROR_BACKOFF": 1.0,
    "MAX_EXECUTION_ERROR_BACKOFF": 300.0,
    "MAX_EXECUTION_ERRORS": 50,
    "SCHEDULES": {},
    "QUEUE_RATE_LIMITS": {},
}

# QUEUE_RATE_LIMITS periods: a rate is "N/s", "N/m" or "N/h" (N from 1 to MAX_RATE).
RATE_PERIODS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}
MAX_RATE = 1_000_000

# PRAGMA synchronous values offered for the engine's SQLite database: FULL syncs the
# write-ahead log at every commit (an acknowledged commit survives a power loss);
# NORMAL syncs only at checkpoints (faster; the last commits can be lost on power loss,
# never on a process crash).
SQLITE_SYNCHRONOUS_MODES = ("FULL", "NORMAL")

_DURATIONS = (
    "ACTIVITY_POLL_INTERVAL",
    "MAX_POLL_INTERVAL",
    "WAIT_POLL_INTERVAL",
    "TIMER_CHECK_INTERVAL",
    "WORKFLOW_RESUMPTION_INTERVAL",
    "LEADER_LEASE_DURATION",
    "LEADER_HEARTBEAT_INTERVAL",
    "SHUTDOWN_TIMEOUT",
    "EXECUTION_ERROR_BACKOFF",
    "MAX_EXECUTION_ERROR_BACKOFF",
)
_POSITIVE_INTS = (
    "MAX_CONCURRENT_ACTIVITIES",
    "MAX_CONCURRENT_RESUMPTIONS",
    "MAX_WORKFLOWS_PER_BATCH",
    "MAX_TIMERS_PER_BATCH",
    "MAX_PAYLOAD_BYTES",
    "HISTORY_WARNING_THRESHOLD",
    "MAX_HISTORY_EVENTS",
    "MAX_HISTORY_BYTES",
    "MAX_PENDING_SIGNALS",
    "MAX_STREAM_ENTRIES",
)
# Batches whose ids end up in one IN list of a statement: at most this many.
_BATCH_CEILING = 5000
_BATCHES = ("MAX_WORKFLOWS_PER_BATCH", "MAX_TIMERS_PER_BATCH")


def default_clock() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(UTC)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseSettings:
    """Execution lease timing: ``ttl`` on the database clock, renewed every ``renew_interval``."""

    ttl: float = 30.0
    renew_interval: float = 10.0
    margin: float = 5.0
    max_skew: float = 1.0

    @property
    def belief(self) -> float:
        """How long after a renewal started the holder may still trust its lease."""
        return self.ttl - self.margin - self.max_skew

    @property
    def renewer_tick(self) -> float:
        """How often a worker's renewer looks at what it holds."""
        return min(0.25, self.renew_interval / 4)

    @property
    def renewal_lead(self) -> float:
        """How long before its belief ends a lease is renewed at the latest: a renewer
        tick to notice it is due and another for the statement."""
        return 2 * self.renewer_tick

    @property
    def renew_by(self) -> float:
        """How long after its last proof a lease is renewed at the latest for its holder
        to go on trusting it (0 when the belief is shorter than the lead)."""
        return max(0.0, self.belief - self.renewal_lead)

    @property
    def renew_every(self) -> float:
        """How long after its last proof a lease is due a renewal: ``renew_interval``,
        or sooner when that would come after :attr:`renew_by`."""
        return min(self.renew_interval, self.renew_by)


@dataclass(frozen=True)
class WorkflowCacheSettings:
    """The worker's cache of suspended executions; ``max_entries`` 0 turns it off."""

    max_entries: int = 100
    max_bytes: int = 64 * 1024 * 1024
    sticky_window: float = 2.0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0


@dataclass(frozen=True)
class SelvedgeSettings:
    """The validated ``SELVEDGE`` settings (lower-case attribute names)."""

    database: str = "default"
    worker_id: str = ""
    # False when ``worker_id`` was generated: each Worker then generates its own.
    worker_id_configured: bool = False
    service_name: str = ""
    # Recorded on every instance this process starts; None when unset.
    code_version: str | None = None
    # The recorded versions a worker leases (None: any; None in it: unversioned ones).
    compatible_versions: tuple[str | None, ...] | None = None
    max_concurrent_activities: int = 10
    max_concurrent_resumptions: int = 10
    activity_queues: tuple[str, ...] | None = None
    activity_poll_interval: float = 1.0
    max_poll_interval: float = 60.0
    wait_poll_interval: float = 1.0
    timer_check_interval: float = 1.0
    workflow_resumption_interval: float = 1.0
    max_workflows_per_batch: int = 100
    max_timers_per_batch: int = 100
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    workflow_cache: WorkflowCacheSettings = field(default_factory=WorkflowCacheSettings)
    leader_lease_duration: float = 45.0
    leader_heartbeat_interval: float = 15.0
    listen_notify: bool | None = None
    # The aliases of the LISTEN connection and of the renewer (None: DATABASE): direct
    # connections when DATABASE goes through a transaction-pooling proxy (pgbouncer).
    listen_database: str | None = None
    renewal_database: str | None = None
    # The alias of the operator's reads (None: DATABASE): a read replica of DATABASE, whose
    # lag the admin's lists, the dashboard, status, find_instances, exports and queries
    # accept; writes, and reads that must see them, stay on DATABASE (operations/base.py).
    read_database: str | None = None
    # The engine's own statements prepared on PostgreSQL (off behind a pooler that can't).
    prepared_statements: bool = True
    run_local_starts: bool = True
    shutdown_timeout: float = 30.0
    clock: Callable[[], datetime] = default_clock
    hooks: Any = None
    # METRICS: False (off), True (the global meter provider) or a MeterProvider.
    metrics: Any = False
    # PAYLOAD_CONVERTER, resolved: None (JSON) or a converter instance.
    payload_converter: Any = None
    # PAYLOAD_CODEC built with PAYLOAD_KEYS (as written, for to_raw()), and what opens
    # stored envelopes (the codec; without it, a reader of the keys): codecs.py.
    payload_codec: Any = None
    payload_keys: Any = None
    payload_reader: Any = None
    modules: tuple[str, ...] = ()
    max_payload_bytes: int = 2 * 1024 * 1024
    history_warning_threshold: int = 10_000
    max_history_events: int = 100_000
    max_history_bytes: int = 64 * 1024 * 1024
    max_pending_signals: int = 10_000
    # The most stream entries one instance holds (ctx.write_stream, sv.write_stream).
    max_stream_entries: int = 100_000
    sqlite_synchronous: str = "FULL"
    # An execution that ends on a storage error holds its instance back this long, twice
    # as long after each consecutive one up to the maximum; the last error allowed fails it.
    execution_error_backoff: float = 1.0
    max_execution_error_backoff: float = 300.0
    max_execution_errors: int | None = 50
    # SCHEDULES: name -> definition, checked by the system checks and at worker start.
    schedules: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # QUEUE_RATE_LIMITS parsed: queue -> (claims, period in ms).
    queue_rate_limits: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # ... and as written, for to_raw().
    queue_rate_limits_raw: Mapping[str, str] = field(default_factory=dict)

    @property
    def engine_aliases(self) -> tuple[str, ...]:
        """The ``DATABASES`` aliases the engine connects through: ``DATABASE`` and the
        ``RENEWAL_DATABASE`` and ``READ_DATABASE`` set apart."""
        others = (self.renewal_database, self.read_database)
        return (self.database, *(alias for alias in others if alias not in (None, self.database)))

    def with_overrides(self, **overrides: Any) -> SelvedgeSettings:
        """Return a copy with lower-case ``SELVEDGE`` keys overridden and revalidated."""
        raw = self.to_raw()
        for key, value in overrides.items():
            upper = key.upper()
            if upper not in DEFAULTS:
                raise ImproperlyConfigured(f"unknown selvedge setting {key!r}")
            raw[upper] = value
        return resolve_settings(raw)

    def to_raw(self) -> dict[str, Any]:
        return {
            "DATABASE": self.database,
            "WORKER_ID": self.worker_id if self.worker_id_configured else None,
            "SERVICE_NAME": self.service_name,
            "CODE_VERSION": self.code_version,
            "COMPATIBLE_VERSIONS": self.compatible_versions,
            "MAX_CONCURRENT_ACTIVITIES": self.max_concurrent_activities,
            "MAX_CONCURRENT_RESUMPTIONS": self.max_concurrent_resumptions,
            "ACTIVITY_QUEUES": self.activity_queues,
            "ACTIVITY_POLL_INTERVAL": self.activity_poll_interval,
            "MAX_POLL_INTERVAL": self.max_poll_interval,
            "WAIT_POLL_INTERVAL": self.wait_poll_interval,
            "TIMER_CHECK_INTERVAL": self.timer_check_interval,
            "WORKFLOW_RESUMPTION_INTERVAL": self.workflow_resumption_interval,
            "MAX_WORKFLOWS_PER_BATCH": self.max_workflows_per_batch,
            "MAX_TIMERS_PER_BATCH": self.max_timers_per_batch,
            "LEASE": {
                "TTL": self.lease.ttl,
                "RENEW_INTERVAL": self.lease.renew_interval,
                "MARGIN": self.lease.margin,
                "MAX_SKEW": self.lease.max_skew,
            },
            "WORKFLOW_CACHE": {
                "MAX_ENTRIES": self.workflow_cache.max_entries,
                "MAX_BYTES": self.workflow_cache.max_bytes,
                "STICKY_WINDOW": self.workflow_cache.sticky_window,
            },
            "LEADER_LEASE_DURATION": self.leader_lease_duration,
            "LEADER_HEARTBEAT_INTERVAL": self.leader_heartbeat_interval,
            "LISTEN_NOTIFY": self.listen_notify,
            "LISTEN_DATABASE": self.listen_database,
            "RENEWAL_DATABASE": self.renewal_database,
            "READ_DATABASE": self.read_database,
            "PREPARED_STATEMENTS": self.prepared_statements,
            "RUN_LOCAL_STARTS": self.run_local_starts,
            "SHUTDOWN_TIMEOUT": self.shutdown_timeout,
            "CLOCK": self.clock,
            "HOOKS": self.hooks,
            "METRICS": self.metrics,
            "PAYLOAD_CONVERTER": self.payload_converter,
            "PAYLOAD_CODEC": codec_setting(self.payload_codec, self.payload_keys),
            "PAYLOAD_KEYS": self.payload_keys,
            "MODULES": self.modules,
            "MAX_PAYLOAD_BYTES": self.max_payload_bytes,
            "HISTORY_WARNING_THRESHOLD": self.history_warning_threshold,
            "MAX_HISTORY_EVENTS": self.max_history_events,
            "MAX_HISTORY_BYTES": self.max_history_bytes,
            "MAX_PENDING_SIGNALS": self.max_pending_signals,
            "MAX_STREAM_ENTRIES": self.max_stream_entries,
            "SQLITE_SYNCHRONOUS": self.sqlite_synchronous,
            "EXECUTION_ERROR_BACKOFF": self.execution_error_backoff,
            "MAX_EXECUTION_ERROR_BACKOFF": self.max_execution_error_backoff,
            "MAX_EXECUTION_ERRORS": self.max_execution_errors,
            "SCHEDULES": self.schedules,
            "QUEUE_RATE_LIMITS": dict(self.queue_rate_limits_raw),
        }


def _duration(raw: Mapping[str, Any], key: str) -> float:
    try:
        return to_seconds(raw[key], f"SELVEDGE[{key!r}]")
    except (TypeError, ValueError) as error:
        raise ImproperlyConfigured(str(error)) from error


def _import(path: str, key: str) -> Any:
    try:
        return import_string(path)
    except ImportError as error:
        raise ImproperlyConfigured(
            f"SELVEDGE[{key!r}] {path!r} cannot be imported: {error}"
        ) from error


def lease_problems(lease: Mapping[str, Any]) -> list[str]:
    """Return what is unsafe about a LEASE dict (empty when it is safe)."""
    problems: list[str] = []
    unknown = set(lease) - set(DEFAULT_LEASE)
    if unknown:
        problems.append(f"unknown LEASE keys: {sorted(unknown)}")
    values: dict[str, float] = {}
    for key, default in DEFAULT_LEASE.items():
        try:
            values[key] = to_seconds(lease.get(key, default), f"LEASE[{key!r}]")
        except (TypeError, ValueError) as error:
            problems.append(str(error))
    if problems:
        return problems
    if values["RENEW_INTERVAL"] + values["MARGIN"] >= values["TTL"]:
        problems.append("LEASE RENEW_INTERVAL + MARGIN must be less than TTL")
    if values["MARGIN"] + values["MAX_SKEW"] >= values["TTL"]:
        problems.append("LEASE MARGIN + MAX_SKEW must be less than TTL")
    return problems


def parse_rate(value: object) -> tuple[int, int] | None:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` as (N, period in ms); None when malformed."""
    if not isinstance(value, str) or len(value) > 20:
        return None
    count, _, unit = value.strip().partition("/")
    if unit not in RATE_PERIODS_MS or not count.isdigit() or not 1 <= int(count) <= MAX_RATE:
        return None
    return int(count), RATE_PERIODS_MS[unit]


def rate_limit_problems(limits: object) -> list[str]:
    """What is wrong with a QUEUE_RATE_LIMITS value (empty when it is valid)."""
    if not isinstance(limits, Mapping):
        return ["SELVEDGE['QUEUE_RATE_LIMITS'] must be a dict of queue names to rates"]
    problems: list[str] = []
    for queue, rate in limits.items():
        if not isinstance(queue, str) or len(queue) > 255:
            problems.append(f"queue name {queue!r} is not a string of at most 255 characters"[:300])
        elif parse_rate(rate) is None:
            problems.append(
                f"rate {rate!r} of queue {queue!r} is not 'N/s', 'N/m' or 'N/h'"
                f" with N from 1 to {MAX_RATE}"[:300]
            )
    return problems


MAX_COMPATIBLE_VERSIONS = 100


def workflow_cache_problems(cache: object) -> list[str]:
    """Return what is wrong with a WORKFLOW_CACHE dict (empty when it is valid)."""
    if not isinstance(cache, Mapping):
        return ["WORKFLOW_CACHE must be a dict"]
    unknown = set(cache) - set(DEFAULT_WORKFLOW_CACHE)
    if unknown:
        return [f"unknown WORKFLOW_CACHE keys: {sorted(unknown)}"]
    problems = []
    entries = cache.get("MAX_ENTRIES", DEFAULT_WORKFLOW_CACHE["MAX_ENTRIES"])
    if isinstance(entries, bool) or not isinstance(entries, int) or not 0 <= entries <= 10_000:
        problems.append("WORKFLOW_CACHE MAX_ENTRIES must be an integer from 0 (off) to 10000")
    size = cache.get("MAX_BYTES", DEFAULT_WORKFLOW_CACHE["MAX_BYTES"])
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        problems.append("WORKFLOW_CACHE MAX_BYTES must be a positive integer")
    try:
        window = to_seconds(
            cache.get("STICKY_WINDOW", DEFAULT_WORKFLOW_CACHE["STICKY_WINDOW"]),
            "WORKFLOW_CACHE['STICKY_WINDOW']",
            allow_nonpositive=True,
        )
    except (TypeError, ValueError) as error:
        problems.append(str(error))
    else:
        if window < 0 or window > 60:
            problems.append("WORKFLOW_CACHE STICKY_WINDOW must be from 0 to 60 seconds")
    return problems


def _version_ok(value: object) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= 255 and value.isprintable()


def _versions(
    code_version: Any, compatible: Any
) -> tuple[str | None, tuple[str | None, ...] | None]:
    """Validate CODE_VERSION and COMPATIBLE_VERSIONS."""
    if code_version is not None and not _version_ok(code_version):
        raise ImproperlyConfigured(
            "SELVEDGE['CODE_VERSION'] must be None or a string of 1 to 255 printable characters"
        )
    if compatible is None:
        return code_version, None
    if isinstance(compatible, str | bytes) or not isinstance(compatible, list | tuple):
        raise ImproperlyConfigured(
            "SELVEDGE['COMPATIBLE_VERSIONS'] must be None or a list of versions (strings or None)"
        )
    if len(compatible) > MAX_COMPATIBLE_VERSIONS or not all(
        v is None or _version_ok(v) for v in compatible
    ):
        raise ImproperlyConfigured(
            f"SELVEDGE['COMPATIBLE_VERSIONS'] must hold at most {MAX_COMPATIBLE_VERSIONS}"
            " versions, each None or a string of 1 to 255 printable characters"
        )
    return code_version, tuple(dict.fromkeys(compatible))


def resolve_settings(raw_in: Mapping[str, Any] | None) -> SelvedgeSettings:
    """Validate a ``SELVEDGE`` dict; raise ImproperlyConfigured naming the bad key."""
    raw_in = raw_in or {}
    if not isinstance(raw_in, Mapping):
        raise ImproperlyConfigured("settings.SELVEDGE must be a dict")
    unknown = set(raw_in) - set(DEFAULTS)
    if unknown:
        raise ImproperlyConfigured(f"unknown SELVEDGE settings: {sorted(unknown)}")
    raw = {**DEFAULTS, **raw_in}
    durations = {key: _duration(raw, key) for key in _DURATIONS}
    ints: dict[str, int] = {}
    for key in _POSITIVE_INTS:
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ImproperlyConfigured(f"SELVEDGE[{key!r}] must be a positive integer")
        if key in _BATCHES and value > _BATCH_CEILING:
            raise ImproperlyConfigured(f"SELVEDGE[{key!r}] must be at most {_BATCH_CEILING}")
        ints[key] = value
    lease_raw = raw["LEASE"] or {}
    if not isinstance(lease_raw, Mapping):
        raise ImproperlyConfigured("SELVEDGE['LEASE'] must be a dict")
    problems = lease_problems(lease_raw)
    if problems:
        raise ImproperlyConfigured("unsafe SELVEDGE['LEASE']: " + "; ".join(problems))
    lease_values = {k: to_seconds(lease_raw.get(k, d), k) for k, d in DEFAULT_LEASE.items()}
    lease = LeaseSettings(
        ttl=lease_values["TTL"],
        renew_interval=lease_values["RENEW_INTERVAL"],
        margin=lease_values["MARGIN"],
        max_skew=lease_values["MAX_SKEW"],
    )
    cache_raw = raw["WORKFLOW_CACHE"] or {}
    problems = workflow_cache_problems(cache_raw)
    if problems:
        raise ImproperlyConfigured("invalid SELVEDGE['WORKFLOW_CACHE']: " + "; ".join(problems))
    cache_values = {**DEFAULT_WORKFLOW_CACHE, **cache_raw}
    workflow_cache = WorkflowCacheSettings(
        max_entries=cache_values["MAX_ENTRIES"],
        max_bytes=cache_values["MAX_BYTES"],
        sticky_window=to_seconds(
            cache_values["STICKY_WINDOW"], "STICKY_WINDOW", allow_nonpositive=True
        ),
    )
    if durations["LEADER_HEARTBEAT_INTERVAL"] >= durations["LEADER_LEASE_DURATION"]:
        raise ImproperlyConfigured(
            "SELVEDGE LEADER_HEARTBEAT_INTERVAL must be shorter than LEADER_LEASE_DURATION"
        )
    queues = raw["ACTIVITY_QUEUES"]
    if queues is not None:
        if isinstance(queues, str) or not all(isinstance(q, str) for q in queues):
            raise ImproperlyConfigured("SELVEDGE['ACTIVITY_QUEUES'] must be a list of strings")
        queues = tuple(queues)
    code_version, compatible = _versions(raw["CODE_VERSION"], raw["COMPATIBLE_VERSIONS"])
    clock = raw["CLOCK"]
    if clock is None:
        clock = default_clock
    elif isinstance(clock, str):
        clock = _import(clock, "CLOCK")
    if not callable(clock):
        raise ImproperlyConfigured("SELVEDGE['CLOCK'] must be a callable or a dotted path")
    hooks = raw["HOOKS"]
    if isinstance(hooks, str):
        hooks = _import(hooks, "HOOKS")
    if isinstance(hooks, type):
        hooks = hooks()
    metrics = raw["METRICS"]
    if metrics is None:
        metrics = False
    if not isinstance(metrics, bool) and not callable(getattr(metrics, "get_meter", None)):
        raise ImproperlyConfigured(
            "SELVEDGE['METRICS'] must be True, False or an OpenTelemetry MeterProvider"
        )
    converter, payload_codec, payload_reader = resolve_payloads(raw)
    listen = raw["LISTEN_NOTIFY"]
    if listen is not None and not isinstance(listen, bool):
        raise ImproperlyConfigured("SELVEDGE['LISTEN_NOTIFY'] must be None, True or False")
    # Django aliases
    for key in ("DATABASE", "LISTEN_DATABASE", "RENEWAL_DATABASE", "READ_DATABASE"):
        alias = raw[key]
        if (alias is not None or key == "DATABASE") and (
            not isinstance(alias, str) or alias not in django_settings.DATABASES
        ):
            raise ImproperlyConfigured(f"SELVEDGE[{key!r}] {alias!r} is not in DATABASES")
    prepared = raw["PREPARED_STATEMENTS"]
    if not isinstance(prepared, bool):
        raise ImproperlyConfigured("SELVEDGE['PREPARED_STATEMENTS'] must be True or False")
    run_local = raw["RUN_LOCAL_STARTS"]
    if not isinstance(run_local, bool):
        raise ImproperlyConfigured("SELVEDGE['RUN_LOCAL_STARTS'] must be True or False")
    synchronous = raw["SQLITE_SYNCHRONOUS"]
    if synchronous not in SQLITE_SYNCHRONOUS_MODES:
        raise ImproperlyConfigured(
            f"SELVEDGE['SQLITE_SYNCHRONOUS'] must be one of {list(SQLITE_SYNCHRONOUS_MODES)},"
            f" not {synchronous!r}"
        )
    if durations["EXECUTION_ERROR_BACKOFF"] > durations["MAX_EXECUTION_ERROR_BACKOFF"]:
        raise ImproperlyConfigured(
            "SELVEDGE EXECUTION_ERROR_BACKOFF must not be longer than MAX_EXECUTION_ERROR_BACKOFF"
        )
    max_errors = raw["MAX_EXECUTION_ERRORS"]
    if max_errors is not None and (
        isinstance(max_errors, bool) or not isinstance(max_errors, int) or max_errors < 1
    ):
        raise ImproperlyConfigured(
            "SELVEDGE['MAX_EXECUTION_ERRORS'] must be a positive integer or None (no limit)"
        )
    modules = raw["MODULES"] or ()
    if isinstance(modules, str):
        raise ImproperlyConfigured("SELVEDGE['MODULES'] must be a list of module paths")
    schedules = raw["SCHEDULES"] or {}
    if not isinstance(schedules, Mapping) or not all(isinstance(name, str) for name in schedules):
        raise ImproperlyConfigured("SELVEDGE['SCHEDULES'] must be a dict of names to dicts")
    rate_limits = raw["QUEUE_RATE_LIMITS"] or {}
    problems = rate_limit_problems(rate_limits)
    if problems:
        raise ImproperlyConfigured("; ".join(problems))
    return SelvedgeSettings(
        database=raw["DATABASE"],
        worker_id=str(raw["WORKER_ID"] or default_worker_id()),
        worker_id_configured=bool(raw["WORKER_ID"]),
        service_name=str(raw["SERVICE_NAME"] or ""),
        code_version=code_version,
        compatible_versions=compatible,
        max_concurrent_activities=ints["MAX_CONCURRENT_ACTIVITIES"],
        max_concurrent_resumptions=ints["MAX_CONCURRENT_RESUMPTIONS"],
        activity_queues=queues,
        activity_poll_interval=durations["ACTIVITY_POLL_INTERVAL"],
        max_poll_interval=durations["MAX_POLL_INTERVAL"],
        wait_poll_interval=durations["WAIT_POLL_INTERVAL"],
        timer_check_interval=durations["TIMER_CHECK_INTERVAL"],
        workflow_resumption_interval=durations["WORKFLOW_RESUMPTION_INTERVAL"],
        max_workflows_per_batch=ints["MAX_WORKFLOWS_PER_BATCH"],
        max_timers_per_batch=ints["MAX_TIMERS_PER_BATCH"],
        lease=lease,
        workflow_cache=workflow_cache,
        leader_lease_duration=durations["LEADER_LEASE_DURATION"],
        leader_heartbeat_interval=durations["LEADER_HEARTBEAT_INTERVAL"],
        listen_notify=listen,
        listen_database=raw["LISTEN_DATABASE"],
        renewal_database=raw["RENEWAL_DATABASE"],
        read_database=raw["READ_DATABASE"],
        prepared_statements=prepared,
        run_local_starts=run_local,
        shutdown_timeout=durations["SHUTDOWN_TIMEOUT"],
        clock=clock,
        hooks=hooks,
        metrics=metrics,
        payload_converter=converter,
        payload_codec=payload_codec,
        payload_keys=raw["PAYLOAD_KEYS"],
        payload_reader=payload_reader,
        modules=tuple(modules),
        max_payload_bytes=ints["MAX_PAYLOAD_BYTES"],
        history_warning_threshold=ints["HISTORY_WARNING_THRESHOLD"],
        max_history_events=ints["MAX_HISTORY_EVENTS"],
        max_history_bytes=ints["MAX_HISTORY_BYTES"],
        max_pending_signals=ints["MAX_PENDING_SIGNALS"],
        max_stream_entries=ints["MAX_STREAM_ENTRIES"],
        sqlite_synchronous=synchronous,
        execution_error_backoff=durations["EXECUTION_ERROR_BACKOFF"],
        max_execution_error_backoff=durations["MAX_EXECUTION_ERROR_BACKOFF"],
        max_execution_errors=max_errors,
        schedules=dict(schedules),
        queue_rate_limits={queue: parse_rate(rate) for queue, rate in rate_limits.items()},  # type: ignore[misc]
        queue_rate_limits_raw=dict(rate_limits),
    )


_cached: SelvedgeSettings | None = None


def get_settings() -> SelvedgeSettings:
    """Return the validated settings (cached until a setting changes)."""
    global _cached
    if _cached is None:
        _cached = resolve_settings(getattr(django_settings, "SELVEDGE", None))
    return _cached


def settings_with(**overrides: Any) -> SelvedgeSettings:
    base = get_settings()
    return base.with_overrides(**overrides) if overrides else replace(base)


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting in ("SELVEDGE", "DATABASES"):
        _cached = None
