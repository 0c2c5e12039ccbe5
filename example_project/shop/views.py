"""The shop's pages: each one calls selvedge_django's client API from a view.

- placing an order starts its workflow inside the request's transaction;
- "Approve payment" sends the workflow a signal;
- the order page shows the workflow's live progress (what it stored with
  ``ctx.set_progress()``, read by ``describe()`` without a replay), its recorded
  history and its activity tasks, and its steps as they happen (the workflow's
  ``steps`` stream, as Server-Sent Events);
- "Cancel order" requests cancellation; the workflow cleans up and closes.

Every page needs a login. An order belongs to the user who placed it: only
they and shop staff see it or cancel it (anyone else gets a 404), and only
staff approve a payment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

import selvedge_django as sv
from selvedge_django.streams import event_stream_response

from .models import Order, Product
from .workflows import APPROVAL_CHANNEL, STEPS_STREAM, order_workflow

RECENT_ORDERS = 20


class OrderForm(forms.Form):
    product = forms.ModelChoiceField(queryset=Product.objects.all(), empty_label=None)
    quantity = forms.IntegerField(min_value=1, max_value=20, initial=1)
    customer_email = forms.EmailField(label="Email", initial="customer@example.com")
    card = forms.ChoiceField(
        choices=[
            ("ok", "Card that works"),
            ("flaky", "Card whose first charge times out (retried)"),
            ("declined", "Card that is declined"),
        ],
        initial="flaky",
    )
    on_decline = forms.ChoiceField(
        label="If the charge is refused",
        choices=[
            ("reject", "Reject the order"),
            ("fail", "Hold it: the run fails, an operator fixes the cause and resumes it"),
        ],
        initial="reject",
        required=False,
    )


class CancelForm(forms.Form):
    reason = forms.CharField(max_length=200, required=False)


@dataclass
class Progress:
    """What the order page shows about one order's workflow."""

    status: str = ""
    step: str = ""
    done: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    cancel_requested: bool = False
    error: str = ""

    @property
    def running(self) -> bool:
        return self.status == sv.WorkflowStatus.RUNNING


def workflow_progress(order: Order) -> Progress:
    """The workflow's status and current step: one read of its row (``describe``).

    The workflow stores its progress with ``ctx.set_progress()``; reading it
    replays nothing, so the page can poll it every second for every order.
    """
    if not order.instance_id:
        return Progress(error="no workflow")
    try:
        description = sv.describe(order.instance_id)
    except sv.WorkflowNotFound:
        return Progress(error="workflow not found")
    progress = Progress(status=description.status, cancel_requested=description.cancel_requested)
    answer = description.progress
    if isinstance(answer, dict):
        progress.step = str(answer.get("step", ""))
        progress.done = [str(name) for name in answer.get("done", [])]
        progress.details = {
            key: value for key, value in answer.items() if key not in ("step", "done")
        }
    return progress


def order_history(order: Order) -> list[dict[str, Any]]:
    """The workflow's recorded history, one row per command, values as JSON text."""
    try:
        history = sv.export_history(order.instance_id)
    except sv.WorkflowNotFound:
        return []
    rows = []
    for event in history.events:
        data = event.to_dict()
        value = json.dumps(data["data"]) if "data" in data else ""
        rows.append(
            {
                "seq": event.seq,
                "key": event.key,
                "command": event.command,
                "event_type": event.event_type,
                "value": value if len(value) <= 120 else value[:117] + "...",
            }
        )
    return rows


def visible_orders(request: HttpRequest) -> QuerySet[Order]:
    """The orders this user may see: their own, or every order for shop staff."""
    orders = Order.objects.select_related("product", "customer")
    if request.user.is_staff:
        return orders
    return orders.filter(customer_id=request.user.pk)


def _index(request: HttpRequest, form: OrderForm, status: int = 200) -> HttpResponse:
    orders = list(visible_orders(request)[:RECENT_ORDERS])
    return render(
        request,
        "shop/index.html",
        {
            "form": form,
            "products": Product.objects.all(),
            "rows": [(order, workflow_progress(order)) for order in orders],
        },
        status=status,
    )


@require_GET
@login_required
def index(request: HttpRequest) -> HttpResponse:
    return _index(request, OrderForm(initial={"customer_email": request.user.email or ""}))


@require_POST
@login_required
def place_order(request: HttpRequest) -> HttpResponse:
    form = OrderForm(request.POST)
    if not form.is_valid():
        return _index(request, form, status=400)
    # The order row and the workflow start commit together or not at all; a
    # worker is woken only once this transaction has committed.
    with transaction.atomic():
        order = Order.objects.create(
            product=form.cleaned_data["product"],
            quantity=form.cleaned_data["quantity"],
            customer=request.user,
            customer_email=form.cleaned_data["customer_email"],
        )
        order.instance_id = sv.start_workflow(
            order_workflow,
            {
                "order_id": order.pk,
                "card": form.cleaned_data["card"],
                "on_decline": form.cleaned_data["on_decline"] or "reject",
                "approval_timeout": settings.SHOP_APPROVAL_TIMEOUT,
                "packing_seconds": settings.SHOP_PACKING_SECONDS,
            },
            instance_id=f"order-{order.pk}",
        )
        order.save(update_fields=["instance_id"])
    messages.success(request, f"Order #{order.pk} placed.")
    return HttpResponseRedirect(reverse("shop:order", args=(order.pk,)))


def _order_context(order: Order) -> dict[str, Any]:
    progress = workflow_progress(order)
    return {
        "order": order,
        "progress": progress,
        "awaiting_approval": progress.running and progress.step == "awaiting payment approval",
        "history": order_history(order),
        "tasks": sv.list_activity_tasks(order.instance_id) if order.instance_id else [],
        "cancel_form": CancelForm(),
    }


@require_GET
@login_required
def order_detail(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(visible_orders(request), pk=pk)
    return render(request, "shop/order.html", _order_context(order))


@require_GET
@login_required
def order_progress(request: HttpRequest, pk: int) -> HttpResponse:
    """The live part of the order page, fetched again every few seconds while it runs."""
    order = get_object_or_404(visible_orders(request), pk=pk)
    return render(request, "shop/_progress.html", _order_context(order))


@require_GET
@login_required
def order_steps(request: HttpRequest, pk: int) -> HttpResponse:
    """The order's steps as Server-Sent Events, for the page's ``EventSource``.

    The order lookup is the authorisation: another customer's order is a 404. Each
    response lasts at most ``SHOP_STREAM_SECONDS``; the browser then reconnects from
    the last step it showed (``Last-Event-ID``).
    """
    order = get_object_or_404(visible_orders(request), pk=pk)
    try:
        return event_stream_response(
            request, order.instance_id, STEPS_STREAM, max_seconds=settings.SHOP_STREAM_SECONDS
        )
    except sv.WorkflowNotFound:
        return HttpResponse(status=404)


@require_POST
@login_required
def approve_payment(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(visible_orders(request), pk=pk)
    if not request.user.is_staff:
        return HttpResponseForbidden("Only shop staff approve payments.")
    approved_by = request.user.get_username()
    try:
        sv.signal(order.instance_id, APPROVAL_CHANNEL, {"approved_by": approved_by})
    except (sv.InstanceClosed, sv.WorkflowNotFound):
        messages.warning(request, f"Order #{order.pk} is no longer running.")
    else:
        messages.success(request, f"Payment of order #{order.pk} approved.")
    return HttpResponseRedirect(reverse("shop:order", args=(order.pk,)))


@require_POST
@login_required
def cancel(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(visible_orders(request), pk=pk)
    form = CancelForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        sv.cancel_workflow(order.instance_id, reason or "cancelled from the shop")
    except (sv.InstanceClosed, sv.WorkflowNotFound):
        messages.warning(request, f"Order #{order.pk} has already finished.")
    else:
        messages.success(request, f"Cancellation of order #{order.pk} requested.")
    return HttpResponseRedirect(reverse("shop:order", args=(order.pk,)))
