"""The status report: workers, leader, queues, backlogs and troubled instances, in bounded reads.

``runselvedge status`` prints it and the health view (``selvedge_django.urls``)
serves it to staff. Every read walks an index and stops early:

- workers: the heartbeat rows (``sv_worker_expires_idx``), at most
  :data:`MAX_WORKERS` alive and :data:`MAX_LOST_WORKERS` lost;
- the leader: the ``selvedge:leader`` lock row;
- queues: each queue found in the queued tasks' ``sv_task_queue_idx`` (at most
  :data:`MAX_QUEUES`, one index step each), its counts and its oldest due task;
  running tasks through ``sv_task_claim_idx``, which holds only running tasks;
- runnable instances and due timers: ``sv_inst_ready_idx`` and
  ``sv_timer_fire_idx``, oldest first;
- long histories: ``sv_inst_long_history_idx`` (running instances whose last
  suspension was past :data:`~selvedge_django.models.LONG_HISTORY_SEQ` commands;
  a ``HISTORY_WARNING_THRESHOLD`` below that reads every running instance);
- stuck instances: expired leases nobody took over (``sv_inst_lease_idx``) and
  runnable instances no worker dispatched (``sv_inst_ready_idx``), for longer
  than ``stuck_after``;
- hot loops: instances held back after storage errors (``sv_inst_exec_errors_idx``),
  and, among those leased or runnable now, the ones dispatched again and again
  without recording commands.

Each count stops at :data:`COUNT_LIMIT`: a count equal to it means "at least".
Every read is the store's (:mod:`selvedge_django.storage.status_reads`): those of
workers, locks, tasks and timers through the ORM, and the reads of running instances,
whose statements name their partial index.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError

from ..conf import get_settings
from ..storage import Store
from ..storage.status_reads import StatusReads
from ..worker.leader import LEADER_LOCK
from .base import client_store, read_store

__all__ = [
    "COUNT_LIMIT",
    "HOT_LOOP_DISPATCHES",
    "HOT_LOOP_RATIO",
    "MAX_LISTED",
    "MAX_LOST_WORKERS",
    "MAX_QUEUES",
    "MAX_WORKERS",
    "STUCK_AFTER",
    "HealthCheck",
    "check_health",
    "queue_report",
    "status_report",
]

# Where each count stops: a count equal to it means at least this many.
COUNT_LIMIT = 10_000
MAX_WORKERS = 200
MAX_LOST_WORKERS = 20
MAX_QUEUES = 50
# Instances listed per kind of trouble (long histories, stuck, hot loops).
MAX_LISTED = 20
# Seconds after which an expired lease nobody took over, or a runnable instance no
# worker dispatched, counts as stuck.
STUCK_AFTER = 60.0
# A hot loop: dispatched at least this many times, and more than HOT_LOOP_RATIO times
# per recorded command position and history generation.
HOT_LOOP_DISPATCHES = 50
HOT_LOOP_RATIO = 4
# Leased and runnable instances looked at for hot loops (each kind, oldest first).
HOT_LOOP_CANDIDATES = 500


@dataclass(frozen=True)
class HealthCheck:
    """Whether the engine's database answered, and its clock when it did."""

    ok: bool
    database: str
    now_ms: int | None = None
    error: str = ""


def check_health() -> HealthCheck:
    """Read the database clock of ``SELVEDGE["DATABASE"]``: one cheap statement."""
    alias = get_settings().database
    try:
        now = client_store().now_ms()
    except DatabaseError as error:
        return HealthCheck(False, alias, error=f"{type(error).__name__}: {error}"[:500])
    return HealthCheck(True, alias, now)


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _age(now_ms: int, ms: int | None) -> float | None:
    return None if ms is None else round(max(0, now_ms - ms) / 1000, 3)


def status_report(*, stuck_after: float = STUCK_AFTER) -> dict[str, Any]:
    """Return the status report as a JSON-ready dict (see the module docstring).

    Keys: ``status`` ("ok"), ``database``, ``now``, ``count_limit``, ``workers``
    (each with ``worker_id``, ``last_seen``, ``last_seen_age_s``, ``leader``,
    ``executions`` and ``activities`` held now, ...), ``lost_workers``, ``leader``
    (a worker id or None), ``queues`` (queue name -> ``paused``, ``queued``,
    ``due``, ``running``, ``oldest_queued_age_s``), ``running_instances``,
    ``runnable_instances``, ``oldest_runnable_age_s``, ``due_timers``,
    ``oldest_due_timer_age_s``, ``history_warning_threshold``,
    ``long_histories``, ``stuck``, ``hot_loops`` and ``warnings`` (sentences for
    people). Raises the database's error when it does not answer.

    It reads ``SELVEDGE["READ_DATABASE"]`` when one is set (``database`` names the alias
    read): a replica lagging past a worker's heartbeat shows that worker as lost.
    """
    settings = get_settings()
    store = read_store()
    alias = store.alias
    reads = store.status
    now = store.now_ms()
    leader = reads.lock_holder(LEADER_LOCK, now)
    report: dict[str, Any] = {
        "status": "ok",
        "database": alias,
        "now": _iso(now),
        "count_limit": COUNT_LIMIT,
        "leader": leader,
    }
    report.update(_workers(reads, now, leader))
    report["queues"] = queue_report(store, now)
    report.update(_instances(store, now))
    report.update(_timers(reads, now))
    threshold = settings.history_warning_threshold
    report["history_warning_threshold"] = threshold
    report["long_histories"] = _long_histories(store, threshold)
    report["stuck"] = _stuck(store, now, stuck_after)
    report["hot_loops"] = _hot_loops(store, now)
    report["warnings"] = _warnings(report)
    return report


def _workers(reads: StatusReads, now: int, leader: str | None) -> dict[str, Any]:
    alive = reads.live_workers(now, MAX_WORKERS)
    lost = reads.lost_workers(now, MAX_LOST_WORKERS)
    # What each holds now: live leases and claims. Both partial indexes hold only
    # running rows, as many as the workers' concurrency allows.
    executions = reads.leases_by_owner(now)
    activities = reads.claims_by_owner(now)
    workers = [
        {
            "worker_id": row["worker_id"],
            "hostname": row["hostname"],
            "pid": row["pid"],
            "service_name": row["service_name"],
            "code_version": row["code_version"],
            "queues": row["queues"],
            "started_at": _iso(row["started_ms"]),
            "last_seen": _iso(row["last_seen_ms"]),
            "last_seen_age_s": _age(now, row["last_seen_ms"]),
            "expires_at": _iso(row["expires_ms"]),
            "leader": row["worker_id"] == leader,
            "executions": int(executions.get(row["worker_id"], 0)),
            "activities": int(activities.get(row["worker_id"], 0)),
            # Instances it cannot decode (no key): left, unchanged, for another worker.
            "undecodable": list(row["undecodable"] or []),
        }
        for row in sorted(alive, key=lambda row: row["worker_id"])
    ]
    lost_workers = [
        {
            "worker_id": row["worker_id"],
            "hostname": row["hostname"],
            "pid": row["pid"],
            "last_seen": _iso(row["last_seen_ms"]),
            "last_seen_age_s": _age(now, row["last_seen_ms"]),
        }
        for row in lost
    ]
    return {"workers": workers, "lost_workers": lost_workers}


def _queue_names(reads: StatusReads) -> list[str]:
    """The queues of queued tasks: one step along ``sv_task_queue_idx`` each."""
    names: list[str] = []
    while len(names) < MAX_QUEUES:
        name = reads.next_queue(names[-1] if names else None)
        if name is None:
            break
        names.append(name)
    return names


def queue_report(store: Store, now: int) -> dict[str, dict[str, Any]]:
    """Each activity queue (of queued or running tasks, or paused once): ``paused``,
    ``queued``, ``due``, ``running`` and ``oldest_queued_age_s``."""
    reads = store.status
    running = reads.running_by_queue(MAX_QUEUES)
    known = store.pauses.queue_rows()
    queues: dict[str, dict[str, Any]] = {}
    for name in sorted({*_queue_names(reads), *running, *known}):
        oldest = reads.oldest_due_task(name, now)
        age = None
        if oldest is not None:
            # A first attempt is due from its creation (not_before_ms 0), a retry from
            # the end of its backoff.
            since = oldest[0] or round(oldest[1].timestamp() * 1000)
            age = _age(now, since)
        queues[name] = {
            "paused": known.get(name, False),
            "queued": reads.count_queued(name, COUNT_LIMIT),
            "due": reads.count_due(name, now, COUNT_LIMIT),
            "running": int(running.get(name, 0)),
            "oldest_queued_age_s": age,
        }
    return queues


def _instances(store: Store, now: int) -> dict[str, Any]:
    oldest = store.runnable_instances(now, 1)
    return {
        "running_instances": store.status.count_running(COUNT_LIMIT),
        "runnable_instances": store.count_runnable(now, COUNT_LIMIT),
        "oldest_runnable_age_s": _age(now, oldest[0].ready_ms) if oldest else None,
    }


def _timers(reads: StatusReads, now: int) -> dict[str, Any]:
    oldest = reads.oldest_due_timer(now)
    return {
        "due_timers": reads.count_due_timers(now, COUNT_LIMIT),
        "oldest_due_timer_age_s": _age(now, oldest),
    }


def _long_histories(store: Store, threshold: int) -> list[dict[str, Any]]:
    return [
        {"instance_id": s.instance_id, "workflow_name": s.workflow_name, "commands": s.parked_seq}
        for s in store.long_histories(threshold, MAX_LISTED)
    ]


def _stuck(store: Store, now: int, stuck_after: float) -> list[dict[str, Any]]:
    limit = now - round(stuck_after * 1000)
    # A lease that expired and nobody took over: no worker can run it (none alive, none
    # registers the workflow, or none of a compatible code version).
    stuck = [
        {
            "instance_id": s.instance_id,
            "workflow_name": s.workflow_name,
            "reason": "lease_expired",
            "detail": f"leased by {s.lease_owner}, expired and not taken over",
            "since_s": _age(now, s.lease_expires_ms),
        }
        for s in store.leased_instances(limit, MAX_LISTED)
    ]
    stuck += [
        {
            "instance_id": s.instance_id,
            "workflow_name": s.workflow_name,
            "reason": "not_dispatched",
            "detail": "runnable, and no worker dispatched it",
            "since_s": _age(now, s.ready_ms),
        }
        for s in store.runnable_instances(limit, MAX_LISTED)
    ]
    return stuck[:MAX_LISTED]


def _hot_loops(store: Store, now: int) -> list[dict[str, Any]]:
    candidates = [
        *store.erring_instances(MAX_LISTED),
        *(
            s
            for s in (
                *store.leased_instances(limit=HOT_LOOP_CANDIDATES),
                *store.runnable_instances(now, HOT_LOOP_CANDIDATES),
            )
            # A continue-as-new or a resume starts a new generation with a fresh history:
            # each generation's dispatches are what its commands are set against.
            if s.lease_epoch >= HOT_LOOP_DISPATCHES
            and s.lease_epoch > HOT_LOOP_RATIO * (s.parked_seq + 1) * s.generation
        ),
    ]
    found: dict[str, dict[str, Any]] = {}
    for s in candidates:
        if s.instance_id in found or len(found) >= MAX_LISTED:
            continue
        found[s.instance_id] = {
            "instance_id": s.instance_id,
            "workflow_name": s.workflow_name,
            "dispatches": s.lease_epoch,
            "commands": s.parked_seq,
            "execution_errors": s.execution_errors,
            "last_error": s.execution_error[:300],
            "reason": "execution_errors" if s.execution_errors else "dispatched_without_progress",
        }
    return list(found.values())


def _warnings(report: dict[str, Any]) -> list[str]:
    warnings: list[str] = []
    for worker in report.get("workers", []):
        if worker.get("undecodable"):
            warnings.append(
                f"worker {worker['worker_id']} cannot decode {len(worker['undecodable'])}"
                " instance(s) (a key missing from its PAYLOAD_KEYS): it leaves them for"
                " workers that have the key"
            )
    if not report["workers"]:
        warnings.append("no worker is alive")
    elif report["leader"] is None:
        warnings.append("no worker holds the leader lock")
    if report["stuck"]:
        warnings.append(f"{len(report['stuck'])} stuck instance(s)")
    if report["hot_loops"]:
        warnings.append(f"{len(report['hot_loops'])} instance(s) in a hot loop")
    if report["long_histories"]:
        warnings.append(
            f"{len(report['long_histories'])} instance(s) over the history warning threshold"
        )
    return warnings
