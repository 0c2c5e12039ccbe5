"""The example shop's patch, proved by golden histories.

``shop.order`` gained a fraud screen behind ``ctx.patched("fraud-screen")``.
``shop_order_before_fraud_screen.json`` was recorded by the code before that
change, ``shop_order_fraud_screen.json`` by the patched code; today's code must
replay both, the first on the old path and the second on the new one. When the
patch is deprecated, the first file is deleted (no order on the old path may be
left running then) and the second must still replay; when the patch is removed
altogether, so is the second file's marker check.

It later gained its ``steps`` stream behind ``ctx.patched("steps-stream")``:
``shop_order_steps_stream.json`` was recorded by that code, and both earlier files
replay on the stream patch's old path.

``SELVEDGE_WRITE_GOLDEN=1`` records ``shop_order_steps_stream.json`` again with
today's code (never the earlier files: the code that recorded them is gone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(
    os.environ.get("SELVEDGE_TEST_DB", "sqlite") != "sqlite",
    reason="the example project runs on its own SQLite file: the SQLite run covers it",
)

HISTORIES = ROOT / "tests" / "histories"
BEFORE = "shop_order_before_fraud_screen.json"
PATCHED = "shop_order_fraud_screen.json"
STREAMED = "shop_order_steps_stream.json"

SCRIPT = """
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
import selvedge_django as sv
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from shop.models import Order, Product
from shop.workflows import APPROVAL_CHANNEL

mode, target = sys.argv[1], sys.argv[2]
if mode == "record":
    mug = Product.objects.get(sku="mug")
    order = Order.objects.create(product=mug, quantity=1, customer_email="a@example.com")
    request = {"order_id": order.pk, "card": "ok", "packing_seconds": 0}
    sv.start_workflow("shop.order", request, instance_id="golden-order")
    worker = Worker()
    run_until_idle(worker)
    sv.signal("golden-order", APPROVAL_CHANNEL, {"approved_by": "clerk"})
    run_until_idle(worker)
    assert sv.describe("golden-order").status == "completed"
    text = sv.export_history("golden-order").to_json(indent=2)
    open(target, "w", encoding="utf-8").write(text + "\\n")
else:
    result = sv.replay_history(sv.parse_history(open(target, "rb").read()))
    print(json.dumps(result.patches))
"""


def run_script(tmp_path: Path, *args: str) -> str:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DEBUG="1",
        # The checkout's package first: not whichever one the virtualenv installed.
        PYTHONPATH=os.pathsep.join([str(ROOT / "example_project"), str(ROOT)]),
        DATABASE_URL=f"sqlite:///{tmp_path / 'shop.sqlite3'}",
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), *args],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(os.environ.get("SELVEDGE_WRITE_GOLDEN") != "1", reason="records goldens")
def test_record_the_patched_golden(tmp_path: Path) -> None:
    run_script(tmp_path, "record", str(HISTORIES / STREAMED))


@pytest.mark.parametrize(
    ("name", "fraud", "stream"),
    [(BEFORE, "old", "old"), (PATCHED, "new", "old"), (STREAMED, "new", "new")],
)
def test_todays_shop_replays_both_sides_of_its_patches(
    tmp_path: Path, name: str, fraud: str, stream: str
) -> None:
    out = run_script(tmp_path, "replay", str(HISTORIES / name))
    patches = json.loads(out.strip().splitlines()[-1])
    assert patches == {"fraud-screen": fraud, "steps-stream": stream}
