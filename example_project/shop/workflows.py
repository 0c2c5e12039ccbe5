"""The order workflow: reserve stock, charge the card, confirm by email.

Workflow code only decides what happens next. Everything that touches the world
(the database, the payment provider, email) happens in activities, whose results
are recorded in the workflow's history. After a crash or a deploy a worker
replays the function from the start: recorded steps return their recorded
results instead of running again, and the workflow carries on where it stopped.

selvedge_django finds this module by itself (a ``workflows`` module in an
installed app), so the worker knows these names.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django.db.models import F
from django.utils import timezone

import selvedge_django as sv

from .models import EmailOutbox, Order, Payment, Product

logger = logging.getLogger(__name__)


class CardDeclined(Exception):
    """The payment provider refused the card: retrying will not help."""


class PaymentGatewayError(Exception):
    """The payment provider did not answer: worth another try."""


# Transactional activities run inside transaction.atomic() and their recorded
# result commits in that same transaction: their own writes happen exactly once.
@sv.activity(name="shop.reserve_stock", transactional=True, start_to_close_timeout=30)
def reserve_stock(order_id: int) -> dict[str, Any]:
    """Take the order's items out of stock and mark the order reserved."""
    order = Order.objects.select_related("product").get(pk=order_id)
    taken = Product.objects.filter(pk=order.product_id, stock__gte=order.quantity).update(
        stock=F("stock") - order.quantity
    )
    if not taken:
        raise sv.ApplicationError(
            f"not enough {order.product.sku} in stock for {order.quantity}",
            type="OutOfStock",
            non_retryable=True,
        )
    order.status = Order.Status.RESERVED
    order.save(update_fields=["status", "updated_at"])
    return {"sku": order.product.sku, "quantity": order.quantity, "amount": str(order.total)}


# A plain activity runs at least once: after a crash it may run again, so it
# sends the provider an idempotency key that is the same on every attempt.
@sv.activity(
    name="shop.charge_payment",
    start_to_close_timeout=30,
    retry_policy=sv.RetryPolicy(
        max_attempts=4,
        initial_interval=1,
        backoff_coefficient=2,
        max_interval=10,
        non_retryable_errors=[CardDeclined],
    ),
)
def charge_payment(request: dict[str, Any]) -> dict[str, Any]:
    """Charge the card at the (simulated) provider; the same reference charges once."""
    info = sv.activity_info()
    assert info is not None
    reference = f"{info.instance_id}/{info.activity_id}"
    logger.info("charging %s for %s, attempt %d", request["amount"], reference, info.attempt)
    card = request.get("card", "ok")
    if card == "declined":
        raise CardDeclined("card declined by the issuer (simulated)")
    if card == "flaky" and info.attempt == 1:
        raise PaymentGatewayError("payment gateway timed out (simulated)")
    payment, _ = Payment.objects.get_or_create(
        reference=reference,
        defaults={"order_id": request["order_id"], "amount": Decimal(request["amount"])},
    )
    Order.objects.filter(pk=request["order_id"]).update(
        status=Order.Status.PAID, updated_at=timezone.now()
    )
    return {"reference": payment.reference, "amount": str(payment.amount)}


@sv.activity(name="shop.send_confirmation", transactional=True)
def send_confirmation(request: dict[str, Any]) -> int:
    """Queue the confirmation email in the outbox and mark the order confirmed."""
    order = Order.objects.select_related("product").get(pk=request["order_id"])
    email = EmailOutbox.objects.create(
        order=order,
        to=order.customer_email,
        subject=f"Your order #{order.pk} is confirmed",
        body=(
            f"{order.quantity} x {order.product.name}, {order.total} charged "
            f"(payment {request['payment_reference']})."
        ),
    )
    order.status = Order.Status.CONFIRMED
    order.save(update_fields=["status", "updated_at"])
    return email.pk


@sv.activity(name="shop.reject_order", transactional=True)
def reject_order(request: dict[str, Any]) -> None:
    """Mark the order rejected, putting reserved stock back when asked to."""
    order = Order.objects.get(pk=request["order_id"])
    if request.get("release_stock"):
        Product.objects.filter(pk=order.product_id).update(stock=F("stock") + order.quantity)
    order.status = Order.Status.REJECTED
    order.status_detail = str(request.get("reason", ""))[:255]
    order.save(update_fields=["status", "status_detail", "updated_at"])


@sv.workflow(name="shop.order")
def order_workflow(ctx: sv.WorkflowContext, request: dict[str, Any]) -> dict[str, Any]:
    """Reserve, charge and confirm one order, undoing the reservation if payment fails.

    ``request`` is ``{"order_id": int, "card": "ok" | "flaky" | "declined"}``.
    Workflow code must be deterministic: no I/O, no wall clock (use ctx.now()),
    no randomness; activities do those things.
    """
    order_id = request["order_id"]
    try:
        reservation = reserve_stock.execute(ctx, order_id)
    except sv.ApplicationError as error:
        reject_order.execute(ctx, {"order_id": order_id, "reason": str(error)})
        return {"order_id": order_id, "status": "rejected", "reason": str(error)}

    try:
        payment = charge_payment.execute(
            ctx,
            {
                "order_id": order_id,
                "amount": reservation["amount"],
                "card": request.get("card", "ok"),
            },
        )
    except (sv.ApplicationError, sv.RetryExhaustedError) as error:
        reject_order.execute(
            ctx, {"order_id": order_id, "reason": str(error), "release_stock": True}
        )
        return {"order_id": order_id, "status": "rejected", "reason": str(error)}

    email_id = send_confirmation.execute(
        ctx, {"order_id": order_id, "payment_reference": payment["reference"]}
    )
    return {
        "order_id": order_id,
        "status": "confirmed",
        "amount": payment["amount"],
        "payment_reference": payment["reference"],
        "confirmation_email_id": email_id,
        "confirmed_at": ctx.now().isoformat(),
    }
