from django.contrib import admin

from .models import AcceptedCard, EmailOutbox, Order, Payment, Product


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("sku", "name", "price", "stock")
    search_fields = ("sku", "name")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "product", "quantity", "customer_email", "status", "instance_id")
    list_filter = ("status",)
    search_fields = ("customer_email", "instance_id")


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ("reference", "order", "amount", "status", "created_at")


@admin.register(EmailOutbox)
class EmailOutboxAdmin(admin.ModelAdmin):
    list_display = ("subject", "to", "created_at", "sent_at")


@admin.register(AcceptedCard)
class AcceptedCardAdmin(admin.ModelAdmin):
    list_display = ("card", "note", "created_at")
