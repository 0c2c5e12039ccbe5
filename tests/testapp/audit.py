"""Audit finished runs of ``fault.flow``: completed, lost or doubled.

Shared by the process-fault tests (tests/processes/test_faults.py) and the soak
(bench/soak.py). Each instance is started with ``{"tag": <its own id>}`` and
sent the signals 1 and 2 on ``go``.

* **lost**: not completed (still running, failed, cancelled or never recorded);
* **doubled**: completed, but something happened more than once or not in the
  first way: an output other than the expected one, a second close record, a
  second child, a signal consumed twice or not by the receive that should
  have, an attempt whose body ran twice, a history that no longer replays.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import selvedge_django as sv
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
)

from .models import Ledger

CHILD_KEY = "#6:child:fault.child"
TASK_KEYS = {"#1:fault.step": "first", "#2:fault.step": "flaky", "#8:fault.step": "parked"}


def expected_output(tag: str) -> dict[str, Any]:
    return {
        "first": f"{tag}:first",
        "flaky": f"{tag}:flaky",
        "signals": [1, 2],
        "child": f"child:{tag}:child",
        "cancelled": 2,
    }


@dataclass
class Audit:
    """The verdict on a set of fault.flow instances."""

    started: int = 0
    completed: int = 0
    lost: dict[str, str] = field(default_factory=dict)
    doubled: dict[str, list[str]] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.doubled

    def summary(self) -> str:
        return (
            f"workflows started: {self.started}, completed: {self.completed}, "
            f"lost: {len(self.lost)}, doubled: {len(self.doubled)}"
        )


def _doubled(instance: WorkflowInstance) -> list[str]:
    """What about one completed instance contradicts exactly-once history."""
    iid = instance.instance_id
    found: list[str] = []
    if json.loads(instance.output or "null") != expected_output(iid):
        found.append(f"output {instance.output}")
    children = list(WorkflowInstance.objects.filter(parent_instance_id=iid))
    if [c.instance_id for c in children] != [f"{iid}/{CHILD_KEY}"]:
        found.append(f"children {[c.instance_id for c in children]}")
    family = [iid, *(c.instance_id for c in children)]
    closes = Counter(
        HistoryEvent.objects.filter(instance_id__in=family, key="$close").values_list(
            "instance_id", flat=True
        )
    )
    if any(closes[i] != 1 for i in family):
        found.append(f"close records {dict(closes)}")
    signals = list(
        SignalMessage.objects.filter(instance_id=iid)
        .order_by("id")
        .values_list("payload", "consumed_key")
    )
    if signals != [("1", "#4:receive:go"), ("2", "#5:receive:go")]:
        found.append(f"signals {signals}")
    if TimerSubscription.objects.filter(instance_id__in=family).exists():
        found.append("timers left armed")
    if ActivityTask.objects.filter(
        instance_id__in=family, status__in=("queued", "running")
    ).exists():
        found.append("tasks left to run")
    # At least once is allowed; one claim running its body twice is not.
    runs = Counter(Ledger.objects.filter(entry__startswith=f"fault:{iid}:").values_list("entry"))
    twice = [entry for (entry,), count in runs.items() if count > 1]
    if twice:
        found.append(f"attempts run twice {twice}")
    for member in family:
        try:
            sv.replay_instance(member)
        except sv.SelvedgeError as error:
            found.append(f"replay of {member}: {error}")
    return found


def audit(instance_ids: Iterable[str]) -> Audit:
    """Classify every instance as completed, lost or doubled."""
    ids = list(instance_ids)
    result = Audit(started=len(ids))
    rows = {i.instance_id: i for i in WorkflowInstance.objects.filter(instance_id__in=ids)}
    for iid in ids:
        instance = rows.get(iid)
        if instance is None:
            result.lost[iid] = "never recorded"
            continue
        if instance.status != "completed":
            result.lost[iid] = f"{instance.status}: {instance.error or ''}"[:500]
            continue
        result.completed += 1
        problems = _doubled(instance)
        if problems:
            result.doubled[iid] = problems
    for key, attempts in ActivityTask.objects.filter(instance_id__in=ids).values_list(
        "key", "attempts"
    ):
        result.attempts[TASK_KEYS.get(key, key)] += attempts
    return result
