"""Calls that ``mypy --strict`` must reject (tests/typing/check.py).

Every line marked ``# error: CODE`` must draw that error, and no other line any.
"""

from __future__ import annotations

import selvedge_django as sv
from selvedge_django.operations import iter_instances
from selvedge_django.testing import FaultInjector


@sv.activity(name="typing.wrong.greet")
def greet(name: str) -> str:
    return f"Hello, {name}"


@sv.activity  # error: call-overload
def unnamed_activity(name: str) -> str:
    return name


@sv.workflow  # error: arg-type
def unnamed_workflow(ctx: sv.WorkflowContext, name: str) -> str:
    return name


@sv.workflow(name="typing.wrong.child")
def child(ctx: sv.WorkflowContext, order_id: int) -> int:
    return order_id


@sv.workflow(name="typing.wrong.parent")
def parent(ctx: sv.WorkflowContext, name: str) -> str:
    greet.execute(ctx, 123)  # error: arg-type
    greet.execute(ctx)  # error: call-arg
    number: int = greet.execute(ctx, name)  # error: assignment
    later: int = greet.execute_async(ctx, name).get(ctx)  # error: assignment
    ctx.start_child(child, "not an int")  # error: misc
    total: str = ctx.start_child(child, 1).get(ctx)  # error: assignment
    greet(42)  # error: arg-type
    with ctx.saga() as saga:
        saga.add_compensation(greet, 42)  # error: misc
        saga.add_compensation(greet)  # error: arg-type
    return f"{number} {later} {total}"


def start() -> None:
    sv.start_workflow(parent, 42)  # error: misc
    sv.start_workflow(parent)  # error: arg-type
    sv.start_workflow(parent, "Ada", if_exists="replace")  # error: call-overload
    sv.signal_with_start(parent, 42, instance_id="c", channel="add")  # error: misc


async def astart() -> None:
    await sv.astart_workflow(parent, 42)  # error: misc


def start_with_a_handle() -> None:
    parent.start(42)  # error: arg-type
    parent.start()  # error: call-arg
    parent.start("Ada", if_exists="replace")  # error: arg-type
    number: int = parent.start("Ada").result()  # error: assignment
    typed: int = sv.get_handle("order-1", workflow=parent).result()  # error: assignment
    parent.start("Ada").signal()  # error: call-arg
    print(number, typed)


async def astart_with_a_handle() -> None:
    await parent.astart(42)  # error: arg-type
    text: str = await (await child.astart(1)).aresult()  # error: assignment
    print(text)


def operate(faults: FaultInjector) -> None:
    sv.update_schedule("nightly", crn="0 3 * * *")  # error: call-arg
    sv.update_schedule("nightly", paused="no")  # error: arg-type
    list(iter_instances(limit=10, state="failed"))  # error: call-arg
    faults.fail_statement("UPDATE", operaton="complete_task")  # error: call-arg
