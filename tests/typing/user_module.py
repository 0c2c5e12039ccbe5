"""A user's workflows module, checked by ``mypy --strict`` (tests/typing/check.py).

It must type-check cleanly: definitions carry their input and output types through
``execute``, futures, child handles, ``start_workflow`` and workflow handles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_type

import selvedge_django as sv


@dataclass
class Order:
    order_id: int
    amount: str


@sv.activity(name="typing.greet", start_to_close_timeout=30)
def greet(name: str) -> str:
    return f"Hello, {name}"


@sv.activity(name="typing.count")
def count(items: list[str]) -> int:
    return len(items)


@sv.activity(name="typing.ping")
def ping(_: None) -> bool:
    return True


@sv.activity(name="typing.fetch")
async def fetch(url: str) -> bytes:
    return url.encode()


@sv.workflow(name="typing.child")
def child(ctx: sv.WorkflowContext, order: dict[str, Any]) -> float:
    return 1.5


@sv.workflow(name="typing.no_input")
def no_input(ctx: sv.WorkflowContext, _: None) -> str:
    return "done"


@sv.workflow(name="typing.parent")
def parent(ctx: sv.WorkflowContext, name: str) -> list[str]:
    assert_type(greet, sv.ActivityDefinition[str, str])
    assert_type(fetch, sv.ActivityDefinition[str, bytes])
    assert_type(greet.execute(ctx, name), str)
    assert_type(count.execute(ctx, [name]), int)
    assert_type(ping.execute(ctx), bool)
    assert_type(fetch.execute(ctx, "https://example.com/"), bytes)

    future = greet.execute_async(ctx, name, options=sv.ActivityOptions(queue="mail"))
    assert_type(future, sv.Future[str])
    assert_type(future.get(ctx), str)
    assert_type([f.get(ctx) for f in [count.execute_async(ctx, ["a"])]], list[int])

    handle = ctx.start_child(child, {"id": 1}, child_id="c-1")
    assert_type(handle, sv.ChildHandle[float])
    assert_type(handle.get(ctx), float)
    assert_type(ctx.start_child(no_input), sv.ChildHandle[str])
    assert_type(ctx.start_child("typing.child", 3), sv.ChildHandle[Any])
    assert_type(greet("direct"), str)
    assert_type(ping(), bool)
    with ctx.saga(parallel=True) as saga:
        saga.add_compensation(greet, "undo")
        saga.add_compensation(count, ["a"], options=sv.ActivityOptions(queue="undo"))
        saga.add_compensation(ping)
    return [greet.execute(ctx, name)]


def start_from_a_view(order: Order) -> str:
    assert_type(parent, sv.WorkflowDefinition[str, list[str]])
    instance_id = sv.start_workflow(parent, "Ada", instance_id=f"order-{order.order_id}")
    assert_type(instance_id, str)
    sv.start_workflow(no_input)
    sv.start_workflow("typing.parent", {"any": "json"})
    again = sv.start_workflow(parent, "Ada", instance_id=instance_id, if_exists="return")
    assert_type(again, str)
    sv.signal(instance_id, "approve", {"by": "ada"}, idempotency_key="approve-1")
    cart = sv.signal_with_start(parent, "Ada", instance_id="cart-1", channel="add", payload=1)
    assert_type(cart, str)
    result = sv.wait_workflow(instance_id, timeout=10)
    assert_type(result, sv.WorkflowResult)
    return instance_id


async def start_from_an_async_view() -> str:
    instance_id = await sv.astart_workflow(parent, "Ada")
    assert_type(instance_id, str)
    assert_type(await sv.astart_workflow(no_input), str)
    assert_type(await sv.astart_workflow("typing.parent", {"any": "json"}), str)
    result = await sv.await_workflow(instance_id, timeout=10)
    assert_type(result.status, str)
    history = await sv.aexport_history(instance_id)
    assert_type(history, sv.RecordedHistory)
    return instance_id


def start_with_a_handle(order: Order) -> list[str]:
    handle = parent.start("Ada", instance_id=f"order-{order.order_id}", priority=5)
    assert_type(handle, sv.WorkflowHandle[list[str]])
    assert_type(handle.id, str)
    handle.signal("approve", {"by": "ada"})
    assert_type(handle.query("progress"), Any)
    assert_type(handle.describe(), sv.WorkflowDescription)
    handle.cancel(reason="changed my mind")
    assert_type(no_input.start(), sv.WorkflowHandle[str])
    assert_type(child.start({"id": 1}, if_exists="return").result(timeout=5), float)
    typed = sv.get_handle(handle.id, workflow=parent)
    assert_type(typed, sv.WorkflowHandle[list[str]])
    assert_type(sv.get_handle(handle.id), sv.WorkflowHandle[Any])
    assert_type(handle.result(timeout=10), list[str])
    return handle.result()


async def start_with_a_handle_from_an_async_view() -> str:
    handle = await no_input.astart()
    assert_type(handle, sv.WorkflowHandle[str])
    assert_type(await handle.aresult(timeout=10), str)
    assert_type(await handle.adescribe(), sv.WorkflowDescription)
    await handle.asignal("approve")
    await handle.acancel()
    assert_type(await handle.aquery("progress"), Any)
    assert_type(await (await parent.astart("Ada")).aresult(), list[str])
    forked = await sv.afork_workflow(handle.id, from_key="#1:typing.greet")
    assert_type(forked, str)
    assert_type(sv.resume_workflow(forked), int)
    return forked
