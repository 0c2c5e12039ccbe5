"""The basics: adding, recording and a crashable ledger."""

from __future__ import annotations

import os
import time
from typing import Any

import selvedge_django as sv

from ..models import Ledger


@sv.activity(name="test.add")
def add(data: dict[str, int]) -> int:
    return data["a"] + data["b"]


@sv.activity(name="test.record")
def record(entry: str) -> str:
    Ledger.objects.create(entry=entry)
    return entry


@sv.activity(name="test.slow_record")
def slow_record(data: dict[str, Any]) -> str:
    """Record an entry after waiting for a marker file to disappear (crash tests)."""
    Ledger.objects.create(entry=f"started:{data['entry']}")
    marker = data.get("hold_while")
    deadline = time.monotonic() + 60
    while marker and os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return data["entry"]


@sv.workflow(name="test.sum3")
def sum3(ctx: sv.WorkflowContext, data: dict[str, int]) -> int:
    x = add.execute(ctx, {"a": data["a"], "b": data["b"]})
    y = add.execute(ctx, {"a": x, "b": data["c"]})
    return add.execute(ctx, {"a": y, "b": 0})


@sv.workflow(name="test.ledger")
def ledger(ctx: sv.WorkflowContext, entries: list[str]) -> list[str]:
    return [record.execute(ctx, entry) for entry in entries]


@sv.workflow(name="test.crashable")
def crashable(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    first = record.execute(ctx, "before")
    second = slow_record.execute(ctx, data)
    return f"{first}+{second}"
