"""The example shop's catalogue, so that a freshly migrated database has something to sell."""

from decimal import Decimal

from django.db import migrations

CATALOGUE = [
    ("mug", "Selvedge mug", Decimal("12.50"), 50),
    ("tote", "Canvas tote bag", Decimal("18.00"), 20),
    ("jeans", "Selvedge denim jeans", Decimal("129.00"), 5),
]


def add_products(apps, schema_editor):
    Product = apps.get_model("shop", "Product")
    for sku, name, price, stock in CATALOGUE:
        Product.objects.using(schema_editor.connection.alias).get_or_create(
            sku=sku, defaults={"name": name, "price": price, "stock": stock}
        )


class Migration(migrations.Migration):
    dependencies = [
        ("shop", "0002_order_shipping"),
    ]

    operations = [
        migrations.RunPython(add_products, migrations.RunPython.noop),
    ]
