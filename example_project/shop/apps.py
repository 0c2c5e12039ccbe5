from django.apps import AppConfig


class ShopConfig(AppConfig):
    """A tiny shop whose orders are selvedge workflows."""

    name = "shop"
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"
