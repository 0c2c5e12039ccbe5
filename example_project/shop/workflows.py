"""The order workflow: reserve stock, wait for payment approval, charge, ship, confirm.

Workflow code only decides what happens next. Everything that touches the world
(the database, the payment provider, the courier, email) happens in activities,
whose results are recorded in the workflow's history. After a crash or a deploy
a worker replays the function from the start: recorded steps return their
recorded results instead of running again, and the workflow carries on where it
stopped.

selvedge_django finds this module by itself (a ``workflows`` module in an
installed app), so the worker and the web process know these names.
"""

from __future__ import annotations

import logging
import zlib
from decimal import Decimal
from typing import Any

from django.db.models import F
from django.utils import timezone

import selvedge_django as sv

from .models import AcceptedCard, EmailOutbox, Order, Payment, Product

logger = logging.getLogger(__name__)

# The signal a view (or the admin, or ``runselvedge signal``) sends to let an order be charged.
APPROVAL_CHANNEL = "approve-payment"
# The query the order page asks for the workflow's live progress.
PROGRESS_QUERY = "progress"
# The stream the order page shows live: one entry per step of the workflow, and the
# payment attempts' own notes (each tagged with its attempt).
STEPS_STREAM = "steps"
# Defaults for the request fields that tune the two timers.
DEFAULT_APPROVAL_TIMEOUT = 24 * 3600.0
DEFAULT_PACKING_SECONDS = 2.0


class CardDeclined(Exception):
    """The payment provider refused the card: retrying will not help."""


class PaymentGatewayError(Exception):
    """The payment provider did not answer: worth another try."""


class CourierUnavailable(Exception):
    """The courier's booking service did not answer: worth another try."""


# -- activities -------------------------------------------------------------------------


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
    # Live, from the attempt itself: the order page shows each attempt's notes.
    sv.write_stream(STEPS_STREAM, {"note": f"charging {request['amount']} to the card"})
    # The provider's own records: a card an operator told it to accept is charged.
    if card == "declined" and not AcceptedCard.objects.filter(card=card).exists():
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


@sv.activity(
    name="shop.book_courier",
    start_to_close_timeout=30,
    retry_policy=sv.RetryPolicy(max_attempts=5, initial_interval=1, max_interval=5),
)
def book_courier(order_id: int) -> str:
    """Book a pick-up at the (simulated) courier; returns the tracking number.

    The number is derived from the workflow instance, so a repeated attempt books
    the same parcel.
    """
    info = sv.activity_info()
    assert info is not None
    return f"SV{order_id:06d}-{zlib.crc32(info.instance_id.encode()) % 10_000:04d}"


@sv.activity(name="shop.mark_shipped", transactional=True)
def mark_shipped(request: dict[str, Any]) -> None:
    """Record the tracking number and mark the order shipped, unless it was cancelled."""
    shipped = Order.objects.filter(pk=request["order_id"], status=Order.Status.PAID).update(
        status=Order.Status.SHIPPED,
        tracking_number=request["tracking_number"],
        updated_at=timezone.now(),
    )
    if not shipped:
        raise sv.ApplicationError(
            f"order #{request['order_id']} is no longer waiting to ship",
            type="NotShippable",
            non_retryable=True,
        )


@sv.activity(name="shop.send_confirmation", transactional=True)
def send_confirmation(request: dict[str, Any]) -> int:
    """Queue the confirmation email in the outbox and mark the order confirmed."""
    order = Order.objects.select_related("product").get(pk=request["order_id"])
    email = EmailOutbox.objects.create(
        order=order,
        to=order.customer_email,
        subject=f"Your order #{order.pk} is on its way",
        body=(
            f"{order.quantity} x {order.product.name}, {order.total} charged "
            f"(payment {request['payment_reference']}), "
            f"tracking number {request['tracking_number']}."
        ),
    )
    order.status = Order.Status.CONFIRMED
    order.save(update_fields=["status", "updated_at"])
    return email.pk


@sv.activity(name="shop.screen_payment", start_to_close_timeout=30)
def screen_payment(request: dict[str, Any]) -> dict[str, Any]:
    """Ask the (simulated) fraud service about a payment before it is charged."""
    risky = request.get("card") == "stolen"
    return {"risk": "high" if risky else "low"}


@sv.activity(name="shop.reject_order", transactional=True)
def reject_order(request: dict[str, Any]) -> None:
    """Mark the order rejected, putting reserved stock back when asked to."""
    order = Order.objects.get(pk=request["order_id"])
    if request.get("release_stock"):
        Product.objects.filter(pk=order.product_id).update(stock=F("stock") + order.quantity)
    order.status = Order.Status.REJECTED
    order.status_detail = str(request.get("reason", ""))[:255]
    order.save(update_fields=["status", "status_detail", "updated_at"])


# The compensations of the order's saga. Each may run again after a crash (activities
# run at least once), so each checks the state it undoes: running twice undoes once.
@sv.activity(name="shop.refund_payment", transactional=True)
def refund_payment(request: dict[str, Any]) -> int:
    """Refund the order's charged payments; return how many were refunded."""
    return Payment.objects.filter(
        order_id=request["order_id"], status=Payment.Status.CHARGED
    ).update(status=Payment.Status.REFUNDED)


@sv.activity(name="shop.release_order", transactional=True)
def release_order(request: dict[str, Any]) -> None:
    """Put the order's items back in stock unless they shipped, and mark it cancelled.

    It runs in one transaction, as ``mark_shipped`` does: whichever commits first
    decides whether the items are back in stock or on their way. The order's status
    detail is the cancellation's reason when one was requested.
    """
    info = sv.activity_info()
    assert info is not None
    order = Order.objects.get(pk=request["order_id"])
    if order.status in (Order.Status.RESERVED, Order.Status.PAID):
        Product.objects.filter(pk=order.product_id).update(stock=F("stock") + order.quantity)
    elif order.status in (Order.Status.CANCELLED, Order.Status.REJECTED):
        return  # released already (an attempt that ran before a crash), or rejected
    described = sv.describe(info.instance_id)
    reason = described.cancel_reason if described.cancel_requested else "undone after a failure"
    order.status = Order.Status.CANCELLED
    order.status_detail = (reason or "cancelled")[:255]
    order.save(update_fields=["status", "status_detail", "updated_at"])


# -- workflows --------------------------------------------------------------------------


@sv.workflow(name="shop.shipping")
def shipping_workflow(ctx: sv.WorkflowContext, request: dict[str, Any]) -> dict[str, Any]:
    """Book a courier, wait while the parcel is packed (a durable timer), mark it shipped.

    Runs as a child of ``shop.order``; it is cancelled with its parent.
    """
    order_id = request["order_id"]
    tracking_number = book_courier.execute(ctx, order_id)
    ctx.sleep(request.get("packing_seconds", DEFAULT_PACKING_SECONDS), sleep_id="packing")
    mark_shipped.execute(ctx, {"order_id": order_id, "tracking_number": tracking_number})
    return {"tracking_number": tracking_number, "shipped_at": ctx.now().isoformat()}


@sv.workflow(name="shop.order")
def order_workflow(ctx: sv.WorkflowContext, request: dict[str, Any]) -> dict[str, Any]:
    """Run one order from reservation to confirmation, undoing what it did if it stops early.

    ``request`` is ``{"order_id": int, "card": "ok" | "flaky" | "declined",
    "approval_timeout": seconds, "packing_seconds": seconds, "on_decline": "reject" |
    "fail"}``. A refused charge rejects the order, or with ``"on_decline": "fail"``
    fails the run, for an operator to fix the cause and resume it. Workflow code must
    be deterministic: no I/O, no wall clock (use ctx.now()), no randomness;
    activities do those things.
    """
    order_id = request["order_id"]
    # Live progress for the order page: stored on the instance by ctx.set_progress()
    # and read by sv.describe(instance_id).progress, without replaying anything. The
    # same dict also answers sv.query(instance_id, "progress"), which replays.
    progress: dict[str, Any] = {"step": "", "done": []}
    ctx.set_query_handler(PROGRESS_QUERY, lambda: progress)

    def report(**details: Any) -> None:
        progress.update(details)
        ctx.set_progress(progress)

    # Each step also goes to the order's stream, which the order page shows as it
    # happens (Server-Sent Events). Added while orders were running, so behind a
    # patch: an order recorded before it replays without the stream's commands.
    streamed = ctx.patched("steps-stream")

    def step(name: str) -> None:
        if progress["step"]:
            progress["done"].append(progress["step"])
        progress["step"] = name
        ctx.set_progress(progress)
        if streamed:
            ctx.write_stream(STEPS_STREAM, {"step": name})

    def reject(reason: str, release_stock: bool) -> dict[str, Any]:
        step("rejected")
        reject_order.execute(
            ctx, {"order_id": order_id, "reason": reason, "release_stock": release_stock}
        )
        return {"order_id": order_id, "status": "rejected", "reason": reason}

    # A saga: when the block fails or the order is cancelled, the compensations added
    # so far run as durable activities, last added first, even after a cancellation or
    # a worker crash; a block that completes (or returns a rejection) runs none. Each
    # compensation is added before its step, since a step may have happened even when
    # its outcome is lost.
    held: BaseException | None = None  # a refused charge, held for an operator
    try:
        with ctx.saga() as saga:
            saga.add_compensation(release_order, {"order_id": order_id})
            step("reserving stock")
            try:
                reservation = reserve_stock.execute(ctx, order_id)
            except sv.ApplicationError as error:
                return reject(str(error), release_stock=False)

            # A signal from the shop's "approve payment" button, with a durable timer.
            step("awaiting payment approval")
            timeout = request.get("approval_timeout", DEFAULT_APPROVAL_TIMEOUT)
            try:
                approval = ctx.receive_with_timeout(APPROVAL_CHANNEL, timeout)
            except sv.ReceiveTimeout:
                return reject(f"payment not approved within {timeout:g} s", release_stock=True)
            approved_by = str((approval or {}).get("approved_by", "")) or "someone"
            report(approved_by=approved_by)

            # Added while orders were running, so behind a patch: an order recorded
            # before the change (already charged, or charging) replays without the
            # screen; every order that reaches this point from now on records the
            # patch's marker and runs it. Once no order on the old path is left,
            # deprecate_patch() replaces the `if` (see docs/changing-workflows.md).
            if ctx.patched("fraud-screen"):
                step("screening payment")
                screen = screen_payment.execute(
                    ctx, {"order_id": order_id, "card": request.get("card", "ok")}
                )
                if screen["risk"] == "high":
                    return reject("payment refused by the fraud screen", release_stock=True)

            step("charging payment")
            saga.add_compensation(refund_payment, {"order_id": order_id})
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
                if request.get("on_decline") != "fail":
                    return reject(str(error), release_stock=True)
                # Held for an operator: the block ends without an error, so nothing is
                # undone, and the run fails below with the stock still reserved; once
                # the cause is fixed, resuming it charges again.
                held = error
            if held is None:
                step("shipping")
                shipment = ctx.start_child(
                    shipping_workflow,
                    {
                        "order_id": order_id,
                        "packing_seconds": request.get("packing_seconds", DEFAULT_PACKING_SECONDS),
                    },
                    child_id=f"{ctx.instance_id}-shipping",
                )
                report(shipping_instance_id=shipment.id)
                shipped = shipment.get(ctx)
                report(tracking_number=shipped["tracking_number"])

                step("sending confirmation")
                email_id = send_confirmation.execute(
                    ctx,
                    {
                        "order_id": order_id,
                        "payment_reference": payment["reference"],
                        "tracking_number": shipped["tracking_number"],
                    },
                )
        if held is not None:
            raise held
        step("completed")
        return {
            "order_id": order_id,
            "status": "confirmed",
            "amount": payment["amount"],
            "approved_by": approved_by,
            "payment_reference": payment["reference"],
            "tracking_number": shipped["tracking_number"],
            "confirmation_email_id": email_id,
            "confirmed_at": ctx.now().isoformat(),
        }
    except sv.WorkflowCancelled as cancelled:
        # The cancellation request reached a wait; the saga has refunded and released
        # the order by now (on a detached context, which ignores the request). Let
        # the instance close as cancelled; a running shipping child is asked to
        # cancel too.
        progress["cancel_reason"] = cancelled.reason
        step("cancelled")
        raise
