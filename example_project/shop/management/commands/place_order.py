"""``manage.py place_order``: place one order, let a worker run it, show what happened.

A worker must be running (``manage.py runselvedge worker``) in another process:
this command only starts the workflow, approves its payment with a signal (as
the shop's "Approve payment" button does, unless ``--no-approve``), waits for
its result and prints the durable record the engine kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

import selvedge_django as sv
from selvedge_django.models import ArchivedHistoryEvent, HistoryEvent, WorkflowInstance
from selvedge_django.testing import replay_debug

from ...models import AcceptedCard, EmailOutbox, Order, Payment, Product
from ...workflows import APPROVAL_CHANNEL, order_workflow


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class Command(BaseCommand):
    help = "Place one order through the shop.order workflow and print its durable record."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sku", default="mug", help="product to order (default: mug)")
        parser.add_argument("--quantity", type=int, default=2)
        parser.add_argument("--email", default="customer@example.com")
        parser.add_argument(
            "--user",
            default="demo-customer",
            help="username the order belongs to, created (without a password) when missing",
        )
        parser.add_argument(
            "--card",
            choices=["ok", "flaky", "declined"],
            default="flaky",
            help="simulated card: 'flaky' fails the first charge attempt (default), "
            "'declined' is refused for good",
        )
        parser.add_argument(
            "--on-decline",
            choices=["reject", "fail"],
            default=None,
            help="what a refused charge does: reject the order (default), or fail the run "
            "with the stock still reserved, for an operator to fix the cause and resume it",
        )
        parser.add_argument(
            "--then-fix",
            action="store_true",
            help="the recovery walkthrough (with --card declined): the run fails on the "
            "decline, the payment provider is told to accept the card, the run is resumed "
            "(sv.resume_workflow, as `runselvedge resume` does) and completes",
        )
        parser.add_argument(
            "--approve",
            action=argparse.BooleanOptionalAction,
            default=True,
            help=f"send the {APPROVAL_CHANNEL!r} signal right after placing the order "
            "(default); with --no-approve the order waits until --approval-timeout",
        )
        parser.add_argument(
            "--approval-timeout",
            type=float,
            default=None,
            help="seconds the workflow waits for the approval (default: SHOP_APPROVAL_TIMEOUT)",
        )
        parser.add_argument(
            "--packing-seconds",
            type=float,
            default=None,
            help="the shipping child workflow's timer (default: SHOP_PACKING_SECONDS)",
        )
        parser.add_argument(
            "--timeout", type=float, default=60, help="seconds to wait for the workflow"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            product = Product.objects.get(sku=options["sku"])
        except Product.DoesNotExist:
            skus = ", ".join(Product.objects.values_list("sku", flat=True)) or "none: migrate"
            raise CommandError(f"unknown sku {options['sku']!r} (known: {skus})") from None
        if options["quantity"] < 1:
            raise CommandError("--quantity must be at least 1")

        on_decline = options["on_decline"] or ("fail" if options["then_fix"] else "reject")
        if options["then_fix"] and (options["card"] != "declined" or on_decline != "fail"):
            raise CommandError("--then-fix needs --card declined (and --on-decline fail)")
        if options["then_fix"]:
            # A fresh walkthrough: the provider declines the card until told otherwise.
            AcceptedCard.objects.filter(card=options["card"]).delete()

        customer, _ = get_user_model().objects.get_or_create(
            username=options["user"], defaults={"email": options["email"]}
        )
        # The order row and the workflow start commit together, or not at all.
        with transaction.atomic():
            order = Order.objects.create(
                product=product,
                quantity=options["quantity"],
                customer=customer,
                customer_email=options["email"],
            )
            order.instance_id = sv.start_workflow(
                order_workflow,
                {
                    "order_id": order.pk,
                    "card": options["card"],
                    "on_decline": on_decline,
                    "approval_timeout": _or(
                        options["approval_timeout"], settings.SHOP_APPROVAL_TIMEOUT
                    ),
                    "packing_seconds": _or(
                        options["packing_seconds"], settings.SHOP_PACKING_SECONDS
                    ),
                },
                instance_id=f"order-{order.pk}",
            )
            order.save(update_fields=["instance_id"])
        instance_id = order.instance_id
        self.stdout.write(
            f"Placed order #{order.pk}: {order.quantity} x {product.sku} "
            f"(stock {product.stock}), card {options['card']!r}"
        )
        self.stdout.write(f"Started workflow shop.order as instance {instance_id!r}")
        if options["approve"]:
            # A signal is accepted from the start: the workflow consumes it once
            # it reaches its wait for the approval.
            sv.signal(instance_id, APPROVAL_CHANNEL, {"approved_by": "place_order"})
            self.stdout.write(f"Sent the {APPROVAL_CHANNEL!r} signal")
        self.stdout.write("Waiting for the workflow...")
        result = self.wait(instance_id, options["timeout"])
        if options["then_fix"]:
            result = self.fix_and_resume(order, result, options)

        self.section("Result")
        self.stdout.write(f"status: {result.status}")
        if result.error is not None:
            self.stdout.write(f"error:  {type(result.error).__name__}: {result.error}")
        else:
            self.stdout.write("output: " + json.dumps(result.output, indent=2))

        self.section("History (one row per recorded step, replayed after a crash)")
        rows = HistoryEvent.objects.filter(instance_id=instance_id).order_by("id")
        self.stdout.write(f"{'seq':>4}  {'key':<28} {'command':<10} {'event_type':<20} data")
        for row in rows:
            seq = "" if row.seq is None else str(row.seq)
            data = "" if row.data is None else _short(row.data)
            self.stdout.write(
                f"{seq:>4}  {row.key:<28} {row.command:<10} {row.event_type:<20} {data}"
            )

        self.section("Activity tasks (at-least-once attempts, exactly-once results)")
        for task in sv.list_activity_tasks(instance_id):
            line = (
                f"{task.name:<22} {task.status:<10} attempts={task.attempts} "
                f"failures={task.failures}"
            )
            if task.last_error is not None:
                line += f"  last error: {type(task.last_error).__name__}: {task.last_error}"
            self.stdout.write(line)

        for child in WorkflowInstance.objects.filter(parent_instance_id=instance_id):
            self.section(f"Child workflow {child.workflow_name} ({child.instance_id})")
            self.stdout.write(f"status: {child.status}")
            for row in HistoryEvent.objects.filter(instance_id=child.instance_id).order_by("id"):
                data = "" if row.data is None else _short(row.data)
                self.stdout.write(f"  {row.key:<28} {row.command:<10} {row.event_type:<20} {data}")

        order.refresh_from_db()
        product.refresh_from_db()
        self.section("Shop data written by the activities")
        detail = f" ({order.status_detail})" if order.status_detail else ""
        self.stdout.write(f"order #{order.pk}: {order.status}{detail}")
        if order.tracking_number:
            self.stdout.write(f"tracking number: {order.tracking_number}")
        self.stdout.write(f"{product.sku} stock now: {product.stock}")
        for payment in Payment.objects.filter(order=order):
            self.stdout.write(f"payment {payment.reference}: {payment.amount} {payment.status}")
        for email in EmailOutbox.objects.filter(order=order):
            self.stdout.write(f"outbox email to {email.to}: {email.subject!r}")

        if result.status != sv.WorkflowStatus.COMPLETED:
            raise CommandError(f"workflow {instance_id} ended {result.status}")

    def wait(self, instance_id: str, timeout: float) -> sv.WorkflowResult:
        try:
            return sv.wait_workflow(instance_id, timeout=timeout)
        except TimeoutError:
            raise CommandError(
                f"{instance_id} still running after {timeout} s: is a worker "
                "running? (python example_project/manage.py runselvedge worker)"
            ) from None

    def look_at_the_failure(self, instance_id: str) -> None:
        """Replay the failed run up to its charge, as ``runselvedge debug`` does in pdb.

        Here the breakpoint hook reads the workflow's own frame instead of stopping, so
        the demo runs unattended; in a terminal, pdb stops there.
        """
        failed = next(
            row.key
            for row in HistoryEvent.objects.filter(instance_id=instance_id).order_by("seq")
            if row.key.endswith(":shop.charge_payment")
        )
        self.section("   Look at it: the failed run replayed up to the charge (writes nothing)")
        seen: dict[str, Any] = {}

        def hook(*args: Any, **kwargs: Any) -> None:
            frame = sys._getframe(1)  # where replay_debug stopped; the workflow is above
            for _ in range(frame.f_locals["frames_up"]):
                frame = frame.f_back  # type: ignore[assignment]
            seen.update(step=frame.f_locals["progress"]["step"])
            seen.update(card=frame.f_locals["request"].get("card"))

        previous, sys.breakpointhook = sys.breakpointhook, hook
        try:
            replay = replay_debug(instance_id, stop_at=failed)
        finally:
            sys.breakpointhook = previous
        self.stdout.write(
            f"stopped before {failed}: step {seen.get('step')!r}, card {seen.get('card')!r};"
            f" the replay then ended {replay.outcome}: {replay.error}"
        )
        self.stdout.write(
            f"  in pdb: python example_project/manage.py runselvedge debug {instance_id}"
            f" --stop-at '{failed}'"
        )

    def fix_and_resume(
        self, order: Order, result: sv.WorkflowResult, options: dict[str, Any]
    ) -> sv.WorkflowResult:
        """The recovery walkthrough: the run failed on the decline; fix the cause, resume."""
        instance_id = order.instance_id
        self.section("1. The run failed on the declined card")
        if result.status != sv.WorkflowStatus.FAILED:
            raise CommandError(f"expected {instance_id} to fail, but it ended {result.status}")
        self.stdout.write(f"status: {result.status}")
        self.stdout.write(f"error:  {type(result.error).__name__}: {result.error}")
        order.refresh_from_db()
        self.stdout.write(f"order #{order.pk}: {order.status} (the stock stays reserved)")
        self.look_at_the_failure(instance_id)

        self.section("2. Fix the cause: the payment provider accepts the card now")
        AcceptedCard.objects.get_or_create(
            card=options["card"], defaults={"note": "the issuer lifted its block"}
        )
        self.stdout.write(
            f"AcceptedCard {options['card']!r} saved: the worker process reads it from the database"
        )

        self.section("3. Resume the run (as `runselvedge resume` does)")
        generation = sv.resume_workflow(instance_id, reason="card accepted by the provider now")
        self.stdout.write(
            f"resumed {instance_id} (generation {generation}): the failed charge and the close"
            " are archived, the earlier steps replay from the history"
        )
        self.stdout.write(
            f"  same as: python example_project/manage.py runselvedge resume {instance_id}"
            ' --reason "card accepted by the provider now"'
        )
        self.stdout.write("Waiting for the workflow...")
        result = self.wait(instance_id, options["timeout"])
        description = sv.describe(instance_id)
        self.section("4. The outcome")
        self.stdout.write(
            f"status: {result.status} (generation {description.generation},"
            f" resumed {description.resumed_count} time(s))"
        )
        archived = ArchivedHistoryEvent.objects.filter(instance_id=instance_id).order_by("id")
        for row in archived:
            self.stdout.write(
                f"  archived (generation {row.generation}): {row.key:<28} {row.event_type}"
            )
        if result.status != sv.WorkflowStatus.COMPLETED:
            raise CommandError(f"the resumed run {instance_id} ended {result.status}")
        self.stdout.write(self.style.SUCCESS("The resumed order completed."))
        return result

    def section(self, title: str) -> None:
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(title))
