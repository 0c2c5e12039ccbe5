"""The shop's own data. Workflow state lives in selvedge_django's tables; an
order only keeps the id of the workflow instance that runs it."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models


class Product(models.Model):
    """Something to sell, with the stock on hand."""

    sku = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    stock = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ("sku",)

    def __str__(self) -> str:
        return f"{self.name} ({self.sku})"


class Order(models.Model):
    """One customer order; the workflow in ``instance_id`` moves it along."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RESERVED = "reserved", "Stock reserved"
        PAID = "paid", "Paid"
        SHIPPED = "shipped", "Shipped"
        CONFIRMED = "confirmed", "Confirmed"
        REJECTED = "rejected", "Rejected"
        CANCELLED = "cancelled", "Cancelled"

    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    # Who placed it: only they (and shop staff) see or cancel it.
    customer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="orders",
    )
    quantity = models.PositiveIntegerField(default=1)
    customer_email = models.EmailField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    status_detail = models.CharField(max_length=255, blank=True, default="")
    tracking_number = models.CharField(max_length=64, blank=True, default="")
    instance_id = models.CharField(
        max_length=255, blank=True, default="", db_index=True, help_text="workflow instance id"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"order #{self.pk}"

    @property
    def total(self) -> Decimal:
        return self.product.price * self.quantity


class Payment(models.Model):
    """A charge at the (simulated) payment provider.

    ``reference`` is the idempotency key sent to the provider: the activity that
    charges may run more than once, the charge must not.
    """

    class Status(models.TextChoices):
        CHARGED = "charged", "Charged"
        REFUNDED = "refunded", "Refunded"

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="payments")
    reference = models.CharField(max_length=255, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CHARGED)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("created_at",)

    def __str__(self) -> str:
        return self.reference


class EmailOutbox(models.Model):
    """An email waiting to be sent by a separate mailer (the transactional outbox)."""

    order = models.ForeignKey(
        Order, on_delete=models.CASCADE, related_name="emails", null=True, blank=True
    )
    to = models.EmailField()
    subject = models.CharField(max_length=255)
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("created_at",)
        verbose_name = "outgoing email"

    def __str__(self) -> str:
        return f"{self.subject} -> {self.to}"


class AcceptedCard(models.Model):
    """A card the (simulated) payment provider accepts although it would decline it.

    The fix an operator applies for a declined card (the issuer lifted its block):
    a row in the database, so the worker process charging the card sees it. An
    order held on the decline is then resumed and its charge runs again.
    """

    card = models.CharField(max_length=64, unique=True)
    note = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("card",)

    def __str__(self) -> str:
        return self.card
