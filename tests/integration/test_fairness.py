"""Dispatch fairness: the instance runnable longest is leased first, whatever its name.

A workflow type whose instances are runnable again right after each execution
must not keep other types from ever running, on either database: dispatch leases
oldest-runnable first, through an index, so a busy type waits its turn.
"""

from __future__ import annotations

import uuid

from django.db import connection

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.models import WorkflowInstance
from selvedge_django.storage import DjangoStore, set_clock_offset_ms, store_for
from tests.conftest import wait_until


def store() -> DjangoStore:
    return store_for(connection.alias, Codec())


def test_lease_batch_takes_the_instances_runnable_longest_first(tdb: None) -> None:
    tag = uuid.uuid4().hex[:6]
    s = store()
    busy = [sv.start_workflow("fair.busy", 1, instance_id=f"busy-{tag}-{n}") for n in range(6)]
    try:
        # The late instances become runnable one second (database clock) after the busy
        # ones; then the busy ones run and are runnable again one second later still.
        set_clock_offset_ms(1000)
        late = [
            sv.start_workflow("fair.late", "x", instance_id=f"late-{tag}-{n}") for n in range(3)
        ]
        set_clock_offset_ms(2000)
        for fence, _ in s.instances.lease_batch("owner", 30, 10, ["fair.busy"]):
            s.release_lease(fence, runnable=True)
        leased = [
            fence.instance_id
            for fence, _ in s.instances.lease_batch("owner", 30, 3, ["fair.busy", "fair.late"])
        ]
    finally:
        set_clock_offset_ms(0)
    assert sorted(leased) == sorted(late), busy


def test_one_busy_workflow_type_does_not_starve_another(make_worker: object) -> None:
    # Two resumption slots, and so many instances of one type, runnable again right after
    # each execution, that some are always runnable: every batch could be filled with
    # them. Instances of another type started later must still run. (Unordered, SQLite
    # walked an index on the name: 0 of 5 ran in 60 s.) Forty are plenty to keep a batch
    # of two full; the deadlines are generous because each late instance waits for every
    # busy one runnable before it, which on a loaded machine takes a while.
    tag = uuid.uuid4().hex[:6]
    busy = [
        sv.start_workflow("fair.busy", 100_000, instance_id=f"busy-{tag}-{n}") for n in range(40)
    ]
    make_worker(  # type: ignore[operator]
        max_concurrent_resumptions=2, max_workflows_per_batch=2, run_local_starts=False
    )
    wait_until(
        lambda: (
            WorkflowInstance.objects.filter(instance_id__in=busy, lease_epoch__gte=2).count() >= 2
        ),
        timeout=90,
    )
    late = [
        sv.start_workflow("fair.late", f"late-{n}", instance_id=f"late-{tag}-{n}") for n in range(5)
    ]
    try:
        wait_until(
            lambda: (
                WorkflowInstance.objects.filter(instance_id__in=late, status="completed").count()
                == 5
            ),
            timeout=90,
        )
        # The busy type kept the batch full all along.
        assert WorkflowInstance.objects.filter(instance_id__in=busy, status="running").count() == 40
    finally:
        for iid in busy:
            sv.cancel_workflow(iid)
