"""A worker process that dies around the continue-as-new commit loses and doubles nothing.

A real ``runselvedge worker`` runs ``can.count`` (two signals a generation, an
activity, then continue-as-new) and exits (``os._exit``) either inside the
continue-as-new transaction, just before its last statements, or right after it
commits. A worker started afterwards takes over once the dead one's lease
lapses. Either way there is exactly one generation 1 in the archive, every
signal is consumed once, and the run ends with the right total. The activity's
inline result commits with the continue-as-new: a crash inside that transaction
loses it, so the activity runs again (its claim lapsed: two attempts); after the
commit it ran once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from django.db import transaction

import selvedge_django as sv
from selvedge_django.models import ArchivedHistoryEvent, SignalMessage, WorkflowInstance
from selvedge_django.testing import FAULT_EXIT_STATUS, FaultInjector
from selvedge_django.worker import Worker
from tests.conftest import WorkerProcess

SHORT_LEASE = {"TTL": 1.0, "RENEW_INTERVAL": 0.25, "MARGIN": 0.25, "MAX_SKEW": 0.1}
WORKER_LEASE = {"TTL": 3.0, "RENEW_INTERVAL": 0.5, "MARGIN": 0.5, "MAX_SKEW": 0.25}
OVERRIDES = {"LEASE": SHORT_LEASE, "LEADER_LEASE_DURATION": 2, "LEADER_HEARTBEAT_INTERVAL": 0.5}


def wait_for(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def waiting_in_generation_2(iid: str) -> bool:
    inst = WorkflowInstance.objects.get(instance_id=iid)
    third = SignalMessage.objects.filter(instance_id=iid, payload="3").values_list(
        "consumed_seq", flat=True
    )
    return inst.generation == 2 and inst.lease_owner == "" and list(third) == [1]


@pytest.mark.parametrize("where", ["inside the transaction", "after the commit"])
def test_a_worker_exiting_around_the_continue_as_new_commit(
    tdb: None, where: str, worker_process: Callable[..., WorkerProcess]
) -> None:
    iid = f"can-crash-{where.split()[0]}"
    injector = FaultInjector()
    if where == "after the commit":
        injector.exit_after_commit(None, 1, operation="continue_as_new", instance_id=iid)
    else:
        injector.exit_at_statement(
            r"DELETE FROM .*history", 1, operation="continue_as_new", instance_id=iid
        )
    env = {**injector.to_env(), "SELVEDGE_TEST_OVERRIDES": json.dumps(OVERRIDES)}
    proc = worker_process(env=env)
    with transaction.atomic():
        sv.start_workflow("can.count", {"total": 0, "batch": 2}, instance_id=iid)
        for value in (1, 2, 3):
            sv.signal(iid, "add", value)
    status = proc.proc.wait(60)
    assert status == FAULT_EXIT_STATUS, proc.output()
    expected_generation = 2 if where == "after the commit" else 1
    assert sv.describe(iid).generation == expected_generation

    with Worker(lease=WORKER_LEASE, run_local_starts=False):
        wait_for(lambda: waiting_in_generation_2(iid))
        sv.signal(iid, "add", "stop")
        result = sv.wait_workflow(iid, timeout=60)
    assert result.status == "completed", result.error
    assert result.output == {"total": 6, "generations": 2}
    archived = list(
        ArchivedHistoryEvent.objects.filter(instance_id=iid)
        .order_by("event_id")
        .values_list("generation", "event_type", "task")
    )
    assert [(g, e) for g, e, _ in archived] == [
        (1, "SignalReceived"),
        (1, "SignalReceived"),
        (1, "ActivityCompleted"),
        (1, "WorkflowContinuedAsNew"),
    ]
    task = json.loads(archived[2][2] or "{}")
    attempts = 1 if where == "after the commit" else 2
    assert (task["status"], task["attempts"]) == ("completed", attempts)
    consumed = list(
        SignalMessage.objects.filter(instance_id=iid)
        .order_by("id")
        .values_list("payload", "archived_generation")
    )
    assert consumed == [("1", 1), ("2", 1), ("3", None), ('"stop"', None)]
    sv.replay_instance(iid)
