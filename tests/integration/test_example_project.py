"""The example project is safe to copy: settings from the environment, orders behind a login.

Each test runs a short script under the example project's own settings
(``example_project/config/settings.py``) in a subprocess, on a fresh SQLite file,
with Django's test client; no worker is needed (starting a workflow and
signalling it only write rows).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(
    os.environ.get("SELVEDGE_TEST_DB", "sqlite") != "sqlite",
    reason="the example project runs on its own SQLite file: the SQLite run covers it",
)


def run_example(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    }
    full_env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        # The checkout's package first: not whichever one the virtualenv installed.
        PYTHONPATH=os.pathsep.join([str(ROOT / "example_project"), str(ROOT)]),
        DATABASE_URL=f"sqlite:///{tmp_path / 'shop.sqlite3'}",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=str(tmp_path),
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


SHOP_SCRIPT = """
import json
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth.models import User
from django.test import Client
from shop.models import Order, Product

alice = User.objects.create_user("alice", password="pw-alice-1")
bob = User.objects.create_user("bob", password="pw-bob-1")
clerk = User.objects.create_user("clerk", password="pw-clerk-1", is_staff=True)

def client(user=None):
    c = Client()
    if user is not None:
        c.force_login(user)
    return c

mug = Product.objects.get(sku="mug")
out = {}
anonymous = client()
out["anonymous_index"] = anonymous.get("/").status_code
out["anonymous_place"] = anonymous.post(
    "/orders/", {"product": mug.pk, "quantity": 1, "customer_email": "a@example.com", "card": "ok"}
).status_code
out["orders_after_anonymous"] = Order.objects.count()

placed = client(alice).post(
    "/orders/", {"product": mug.pk, "quantity": 1, "customer_email": "a@example.com", "card": "ok"}
)
order = Order.objects.get()
out["alice_place"] = placed.status_code
out["owner"] = order.customer.username
out["alice_reads"] = client(alice).get(f"/orders/{order.pk}/").status_code
out["bob_reads"] = client(bob).get(f"/orders/{order.pk}/").status_code
out["bob_progress"] = client(bob).get(f"/orders/{order.pk}/progress/").status_code
out["bob_index_lists_it"] = f"/orders/{order.pk}/" in client(bob).get("/").content.decode()
out["alice_index_lists_it"] = f"/orders/{order.pk}/" in client(alice).get("/").content.decode()
out["bob_cancels"] = client(bob).post(f"/orders/{order.pk}/cancel/").status_code
out["bob_approves"] = client(bob).post(f"/orders/{order.pk}/approve/").status_code
out["alice_approves"] = client(alice).post(f"/orders/{order.pk}/approve/").status_code
from selvedge_django.models import SignalMessage
out["signals_before_staff"] = SignalMessage.objects.count()
out["clerk_approves"] = client(clerk).post(f"/orders/{order.pk}/approve/").status_code
out["signals_after_staff"] = SignalMessage.objects.count()
out["clerk_reads"] = client(clerk).get(f"/orders/{order.pk}/").status_code
from selvedge_django.models import WorkflowInstance
out["cancel_requested"] = WorkflowInstance.objects.get().cancel_requested
out["demo_banner"] = "demo" in client(alice).get("/").content.decode().lower()
print(json.dumps(out))
"""


def test_the_shop_needs_a_login_and_keeps_each_order_to_its_owner(tmp_path: Path) -> None:
    done = run_example(tmp_path, SHOP_SCRIPT, DEBUG="1", ALLOWED_HOSTS="testserver")
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["anonymous_index"] == 302  # to the login page
    assert (out["anonymous_place"], out["orders_after_anonymous"]) == (302, 0)
    assert (out["alice_place"], out["owner"], out["alice_reads"]) == (302, "alice", 200)
    # Another customer can neither see, nor cancel, nor approve it.
    assert (out["bob_reads"], out["bob_progress"], out["bob_cancels"]) == (404, 404, 404)
    assert (out["bob_index_lists_it"], out["alice_index_lists_it"]) == (False, True)
    assert out["bob_approves"] == 404
    # Approving a payment is the shop staff's job, not the customer's.
    assert out["alice_approves"] == 403
    assert out["signals_before_staff"] == 0
    assert (out["clerk_approves"], out["signals_after_staff"], out["clerk_reads"]) == (302, 1, 200)
    assert out["cancel_requested"] is False
    assert out["demo_banner"] is True


SETTINGS_SCRIPT = """
import json
from django.conf import settings
print(json.dumps({"debug": settings.DEBUG, "secret_key": settings.SECRET_KEY}))
"""


def test_the_example_settings_refuse_to_run_without_a_secret_key_unless_debug(
    tmp_path: Path,
) -> None:
    refused = run_example(tmp_path, SETTINGS_SCRIPT)
    assert refused.returncode != 0
    assert "SECRET_KEY" in refused.stderr
    production = run_example(tmp_path, SETTINGS_SCRIPT, SECRET_KEY="from-the-environment")
    assert production.returncode == 0, production.stderr
    assert json.loads(production.stdout) == {"debug": False, "secret_key": "from-the-environment"}
    demo = run_example(tmp_path, SETTINGS_SCRIPT, DEBUG="1")
    assert demo.returncode == 0, demo.stderr
    values = json.loads(demo.stdout)
    assert values["debug"] is True and "demo" in values["secret_key"]


PROGRESS_SCRIPT = """
import json
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth.models import User
from django.test import Client
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from shop.models import Order, Product

alice = User.objects.create_user("alice", password="pw-alice-1")
c = Client()
c.force_login(alice)
mug = Product.objects.get(sku="mug")
form = {"product": mug.pk, "quantity": 1, "customer_email": "a@example.com", "card": "ok"}
c.post("/orders/", form)
order = Order.objects.get()
run_until_idle(Worker())  # reserves the stock, then waits for the approval signal
import selvedge_django as sv
from selvedge_django import operations

def no_replay(*args, **kwargs):
    raise AssertionError("the page replayed the workflow")

sv.query = operations.query = no_replay
page = c.get(f"/orders/{order.pk}/progress/").content.decode()
print(json.dumps({
    "current": 'id="current-step">awaiting payment approval<' in page,
    "done": '<li class="done">reserving stock</li>' in page,
    "stored": sv.describe(order.instance_id).progress["step"],
}))
"""


def test_the_order_page_reads_the_stored_progress_without_a_replay(tmp_path: Path) -> None:
    done = run_example(tmp_path, PROGRESS_SCRIPT, DEBUG="1", ALLOWED_HOSTS="testserver")
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # The step the workflow stored with ctx.set_progress(), shown without a query.
    assert out == {"current": True, "done": True, "stored": "awaiting payment approval"}


SAGA_SCRIPT = """
import json
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
import selvedge_django as sv
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from shop.models import Order, Payment, Product
from shop.workflows import APPROVAL_CHANNEL

worker = Worker()
out = {}
mug = Product.objects.get(sku="mug")
stock = mug.stock

def place(instance_id, **request):
    order = Order.objects.create(product=mug, quantity=2, customer_email="a@example.com")
    sv.start_workflow("shop.order", {"order_id": order.pk, **request}, instance_id=instance_id)
    run_until_idle(worker)
    return order

# Cancelled while it waits for approval: its stock comes back.
waiting = place("order-waiting", card="ok")
out["waiting_reserved"] = Order.objects.get(pk=waiting.pk).status
sv.cancel_workflow("order-waiting", reason="changed my mind")
run_until_idle(worker)
waiting.refresh_from_db()
out["waiting"] = [sv.describe("order-waiting").status, waiting.status, waiting.status_detail]

# Cancelled once charged, while its parcel is packed: refunded, then its stock comes back.
packing = place("order-packing", card="ok", packing_seconds=3600)
sv.signal("order-packing", APPROVAL_CHANNEL, {"approved_by": "clerk"})
run_until_idle(worker)
out["packing_paid"] = Order.objects.get(pk=packing.pk).status
sv.cancel_workflow("order-packing", reason="too slow")
run_until_idle(worker)
packing.refresh_from_db()
out["packing"] = [sv.describe("order-packing").status, packing.status, packing.status_detail]
out["payments"] = list(Payment.objects.values_list("status", flat=True))
undoing = ("shop.refund_payment", "shop.release_order")
out["compensations"] = [
    t.name for t in sv.list_activity_tasks("order-packing") if t.name in undoing
]

# A declined card held for an operator: nothing is undone, the stock stays reserved.
held = place("order-held", card="declined", on_decline="fail")
sv.signal("order-held", APPROVAL_CHANNEL, {"approved_by": "clerk"})
run_until_idle(worker)
held.refresh_from_db()
out["held"] = [sv.describe("order-held").status, held.status]

mug.refresh_from_db()
out["stock_taken"] = stock - mug.stock
print(json.dumps(out))
"""


def test_the_order_saga_refunds_and_restocks_a_cancelled_order(tmp_path: Path) -> None:
    done = run_example(tmp_path, SAGA_SCRIPT, DEBUG="1")
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["waiting_reserved"] == "reserved"
    assert out["waiting"] == ["cancelled", "cancelled", "changed my mind"]
    assert out["packing_paid"] == "paid"
    assert out["packing"] == ["cancelled", "cancelled", "too slow"]
    assert out["payments"] == ["refunded"]
    # Last added, first run: the refund, then the release of the stock.
    assert out["compensations"] == ["shop.refund_payment", "shop.release_order"]
    assert out["held"] == ["failed", "reserved"]
    assert out["stock_taken"] == 2  # only the held order's items are still out of stock
