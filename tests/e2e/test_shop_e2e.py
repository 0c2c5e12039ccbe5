"""End to end: the example shop and the admin in a real headless Chromium.

The example project runs as it would for a developer: ``manage.py runserver`` and
a ``manage.py runselvedge worker`` process on a fresh SQLite database in a
temporary folder. Playwright drives Chromium through the shop's pages (place an
order, approve its payment, watch it complete; place another and cancel it) and
through the admin's workflow actions (send a signal, cancel, export history),
from an instance's page and from the changelist; then an order whose declined
card fails its run is found with the error type filter, its cause is fixed in
the shop's admin, and it is resumed from the changelist and completes; last, the
dashboard's counts and an instance's timeline (SVG bars), each with a screenshot.

On Django 6 the example project runs under a content security policy (``SECURE_CSP``:
default-src, style-src and script-src 'self'); any violation the browser reports on
its console, on a shop page or an admin page, fails the test.

Needs the ``playwright`` package (``pip install --group e2e``; its bundled
browsers are not used) and a Chromium binary: ``/usr/bin/chromium`` (Debian's
``chromium`` package) unless ``SELVEDGE_CHROMIUM`` names another; skipped with
the reason when either is missing, failed instead when ``SELVEDGE_E2E_REQUIRED=1``
(as ``.ci/run`` sets it). Screenshots go to a temporary folder, or to
``SELVEDGE_E2E_ARTIFACTS`` when set.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "example_project" / "manage.py"
CHROMIUM = os.environ.get("SELVEDGE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
ADMIN_USER = "admin"
ADMIN_PASSWORD = "e2e-admin-password"
# The changelist's button that runs the chosen action: "Go", "Run" since Django 6.1.
RUN_ACTION = re.compile(r"^(Go|Run)$")
# Generous: a worker on SQLite in another process finds new work by polling.
SLOW = 60_000


def _skip_reason() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install --group e2e)"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set SELVEDGE_CHROMIUM)"
    if os.environ.get("SELVEDGE_TEST_DB", "sqlite") != "sqlite":
        return "runs its own SQLite database: the SQLite run covers it"
    return ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ExampleProject:
    """The example project's dev server and worker process on a temporary database."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.db = workdir / "shop.sqlite3"
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": f"sqlite:///{self.db}",
            "DEBUG": "True",
            "SECRET_KEY": "selvedge-e2e-only",
            "SHOP_PACKING_SECONDS": "1",
            "SHOP_APPROVAL_TIMEOUT": "600",
            # Short stream responses: the browser reconnects (Last-Event-ID) while it waits.
            "SHOP_STREAM_SECONDS": "2",
            "DJANGO_SUPERUSER_PASSWORD": ADMIN_PASSWORD,
            "PYTHONUNBUFFERED": "1",
            # This checkout's package, not another copy installed in the environment.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def manage(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, str(MANAGE), *args],
            env=self.env,
            cwd=self.workdir,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def spawn(self, name: str, *args: str) -> None:
        log = self.workdir / f"{name}.log"
        self.logs[name] = log
        with log.open("wb") as out:
            self.processes[name] = subprocess.Popen(
                [sys.executable, str(MANAGE), *args],
                env=self.env,
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def wait_for(self, name: str, ready: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.processes[name].poll() is not None:
                raise AssertionError(f"{name} exited early:\n{self.log(name)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} within {timeout} s:\n{self.log(name)}")
            time.sleep(0.1)

    def serving(self) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.base_url + "/", timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self) -> None:
        self.manage("migrate", "--noinput")
        self.manage("createsuperuser", "--noinput", "--username", ADMIN_USER, "--email", "a@x.io")
        self.spawn(
            "worker", "runselvedge", "-v", "2", "worker", "--worker-id", "e2e-worker", "--no-reload"
        )
        self.wait_for("worker", lambda: "started" in self.log("worker"), "no worker start")
        self.spawn("server", "runserver", "--noreload", f"127.0.0.1:{self.port}")
        self.wait_for("server", self.serving, "the server did not answer")

    def stop(self, name: str, timeout: float = 30) -> int | None:
        process = self.processes.get(name)
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        return process.returncode

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        # closing(): a connection's own context manager commits but never closes it.
        with closing(sqlite3.connect(self.db, timeout=30)) as conn:
            return list(conn.execute(sql))


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    chosen = os.environ.get("SELVEDGE_E2E_ARTIFACTS")
    folder = Path(chosen) if chosen else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Iterator[ExampleProject]:
    reason = _skip_reason()
    if reason and os.environ.get("SELVEDGE_E2E_REQUIRED") == "1":
        pytest.fail(f"SELVEDGE_E2E_REQUIRED is set, but {reason}")
    if reason:
        pytest.skip(reason)
    project = ExampleProject(tmp_path)
    try:
        project.start()
        yield project
    finally:
        project.stop("server")
        project.stop("worker")
        # Shown by pytest when the test fails.
        for name in project.logs:
            print(f"----- {name} log -----\n{project.log(name)[-20_000:]}")


def place_order(
    page: Page, base_url: str, sku: str, quantity: int, card: str, on_decline: str = "reject"
) -> int:
    page.goto(base_url + "/")
    value = page.locator("#id_product option", has_text=f"({sku})").get_attribute("value")
    assert value is not None
    page.locator("#id_product").select_option(value)
    page.fill("#id_quantity", str(quantity))
    page.fill("#id_customer_email", f"{sku}-buyer@example.com")
    page.locator("#id_card").select_option(card)
    page.locator("#id_on_decline").select_option(on_decline)
    page.get_by_role("button", name="Place order").click()
    page.wait_for_url(re.compile(r"/orders/\d+/$"))
    match = re.search(r"/orders/(\d+)/$", page.url)
    assert match is not None
    return int(match.group(1))


def open_order(page: Page, base_url: str, order_id: int) -> None:
    page.goto(f"{base_url}/orders/{order_id}/")


def test_shop_and_admin_in_chromium(project: ExampleProject, artifacts: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    started = time.monotonic()
    base = project.base_url
    print(f"screenshots: {artifacts}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(20_000)
        violations: list[str] = []

        def on_console(message: Any) -> None:
            if "Content Security Policy" in message.text:
                violations.append(f"{page.url}: {message.text}")

        page.on("console", on_console)
        try:
            _check_csp_header(page, base)
            _drive(page, expect, project, base, artifacts)
        except BaseException:
            page.screenshot(path=str(artifacts / "failure.png"), full_page=True)
            raise
        finally:
            context.close()
            browser.close()
        assert not violations, "\n".join(violations)

    assert project.stop("server") is not None
    assert project.stop("worker") == 0, project.log("worker")
    print(f"e2e run took {time.monotonic() - started:.1f} s")


def _check_csp_header(page: Page, base: str) -> None:
    """On Django 6 every response carries the policy (Django 5.2 has no SECURE_CSP)."""
    import django

    response = page.request.get(base + "/accounts/login/")
    policy = response.headers.get("content-security-policy")
    if django.VERSION < (6, 0):
        assert policy is None, policy
        return
    assert policy is not None, "no Content-Security-Policy header on Django 6"
    for directive in ("default-src 'self'", "style-src 'self'", "script-src 'self'"):
        assert directive in policy, policy
    assert "unsafe-inline" not in policy, policy


def _drive(page: Page, expect: Any, project: ExampleProject, base: str, shots: Path) -> None:
    # -- every shop page needs a login: the first visit lands on the login page ------------
    page.goto(base + "/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
    expect(page.locator("#demo-banner")).to_contain_text("Demo")
    page.fill("#id_username", ADMIN_USER)
    page.fill("#id_password", ADMIN_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(base + "/")

    # -- the shop: place an order, approve its payment (as staff), watch it complete -------
    expect(page.locator("#products tr[data-sku=mug] .stock")).to_have_text("50")
    page.screenshot(path=str(shots / "01-shop.png"), full_page=True)

    # Every request of the steps stream (their headers are read once sent).
    stream_requests: list[Any] = []
    page.on("request", lambda r: stream_requests.append(r) if "/steps/" in r.url else None)

    def last_event_ids() -> list[str | None]:
        return [r.all_headers().get("last-event-id") for r in list(stream_requests)]

    first = place_order(page, base, "mug", 2, "flaky")
    expect(page.locator(".messages")).to_contain_text(f"Order #{first} placed.")
    # The page refreshes its progress by itself; no reload needed.
    expect(page.locator("#current-step")).to_have_text("awaiting payment approval", timeout=SLOW)
    # The workflow's steps arrive through the EventSource as it writes them.
    steps = page.locator("#stream li")
    expect(steps.nth(0)).to_have_text("reserving stock", timeout=SLOW)
    expect(steps.nth(1)).to_have_text("awaiting payment approval", timeout=SLOW)
    expect(page.locator("#stream-state")).to_have_text(re.compile("live|reconnecting"))
    # Each response lasts SHOP_STREAM_SECONDS: the browser reconnects after the last entry
    # it showed, and the server resumes there.
    deadline = time.monotonic() + 20
    while "2" not in last_event_ids():
        assert time.monotonic() < deadline, f"no reconnect from entry 2: {last_event_ids()}"
        page.wait_for_timeout(100)
    assert last_event_ids()[0] is None  # the first request starts from the beginning
    expect(page.locator("#workflow-status")).to_have_text("running")
    expect(page.locator("#order-status")).to_have_text("Stock reserved")
    page.screenshot(path=str(shots / "02-awaiting-approval.png"), full_page=True)

    page.get_by_role("button", name="Approve payment").click()
    expect(page.locator(".messages")).to_contain_text(f"Payment of order #{first} approved.")
    expect(page.locator("#workflow-status")).to_have_text("completed", timeout=SLOW)
    expect(page.locator("#order-status")).to_have_text("Confirmed")
    expect(page.locator("#current-step")).to_have_text("completed")
    expect(page.locator("#status")).to_contain_text(f"Payment approved by {ADMIN_USER}.")
    expect(page.locator("#tracking")).to_have_text(re.compile(rf"^SV{first:06d}-\d{{4}}$"))
    expect(page.locator("#history")).to_contain_text("#5:receive:approve-payment")
    expect(page.locator("#history")).to_contain_text("child:shop.shipping")
    expect(page.locator("#history")).to_contain_text("WorkflowCompleted")
    # The flaky card's first charge failed and was retried.
    charge = page.locator("#tasks tr", has_text="shop.charge_payment")
    expect(charge.locator("td").nth(2)).to_have_text("2")
    expect(page.locator("#cancel")).to_have_count(0)
    # The stream ended with the run; nothing was shown twice across the reconnects.
    expect(steps.last).to_have_text("completed", timeout=SLOW)
    expect(page.locator("#stream-state")).to_have_text("finished")
    seqs = steps.evaluate_all("items => items.map(item => Number(item.dataset.seq))")
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    # The charge's notes carry their attempt: the failed first one is marked, not dropped.
    expect(page.locator("#stream li.retried")).to_have_count(1)
    expect(page.locator("#stream li.retried")).to_contain_text("(attempt 1)")
    expect(page.locator("#stream li[data-attempt='2']")).to_contain_text("charging")
    page.screenshot(path=str(shots / "03-completed.png"), full_page=True)

    # -- another order, cancelled while it waits for approval -----------------------------
    second = place_order(page, base, "mug", 3, "ok")
    expect(page.locator("#current-step")).to_have_text("awaiting payment approval", timeout=SLOW)
    page.fill("#id_reason", "changed my mind <b>twice</b>")
    page.get_by_role("button", name="Cancel order").click()
    expect(page.locator(".messages")).to_contain_text(f"Cancellation of order #{second} requested.")
    expect(page.locator("#workflow-status")).to_have_text("cancelled", timeout=SLOW)
    expect(page.locator("#order-status")).to_have_text("Cancelled")
    # Escaped, not interpreted.
    expect(page.locator("#status")).to_contain_text("Cancelled: changed my mind <b>twice</b>")
    expect(page.locator("#status b")).to_have_count(0)
    expect(page.locator("#approve")).to_have_count(0)
    page.screenshot(path=str(shots / "04-cancelled.png"), full_page=True)

    page.goto(base + "/")
    # 50 - 2 for the first order; the cancelled one put its 3 back.
    expect(page.locator("#products tr[data-sku=mug] .stock")).to_have_text("48")
    orders = page.locator("#orders")
    expect(orders.locator("tr", has_text=f"#{first}")).to_contain_text("Confirmed")
    expect(orders.locator("tr", has_text=f"#{second}")).to_contain_text("Cancelled")

    # -- four more orders for the admin's actions -----------------------------------------
    pending = [place_order(page, base, "tote", 1, "ok") for _ in range(4)]
    for order_id in pending:
        open_order(page, base, order_id)
        expect(page.locator("#current-step")).to_have_text(
            "awaiting payment approval", timeout=SLOW
        )
    by_button_signal, by_button_cancel, by_action_signal, by_action_cancel = pending

    page.goto(base + "/admin/")  # the same login: the shop's staff user is the admin's
    expect(page.locator("#content")).to_contain_text("Site administration")

    changelist = base + "/admin/selvedge_django/workflowinstance/"

    def instance_page(order_id: int) -> None:
        page.goto(f"{changelist}order-{order_id}/change/")
        expect(page.locator("#content h2").first).to_be_visible()

    # Send a signal from an instance's page.
    instance_page(by_button_signal)
    page.screenshot(path=str(shots / "05-admin-instance.png"), full_page=True)
    page.locator(".object-tools a", has_text="Send signal").click()
    page.fill("#id_channel", "approve-payment")
    page.fill("#id_payload", '{"approved_by": "the admin"}')
    page.screenshot(path=str(shots / "06-admin-signal-form.png"), full_page=True)
    page.locator("input[type=submit][value='Send signal']").click()
    expect(page.locator(".messagelist")).to_contain_text(f"Signal sent to order-{by_button_signal}")

    # Cancel from an instance's page.
    instance_page(by_button_cancel)
    page.locator(".object-tools a", has_text="Cancel").click()
    page.fill("#id_reason", "cancelled in the admin")
    page.locator("input[type=submit][value='Request cancellation']").click()
    expect(page.locator(".messagelist")).to_contain_text(
        f"Cancellation requested for order-{by_button_cancel}"
    )

    # The same two actions from the changelist, on a selection.
    def choose_action(order_ids: list[int], action: str) -> None:
        page.goto(changelist)
        for order_id in order_ids:
            page.locator(f"input.action-select[value='order-{order_id}']").check()
        page.locator("select[name=action]").select_option(action)

    def changelist_action(order_ids: list[int], action: str) -> None:
        choose_action(order_ids, action)
        page.get_by_role("button", name=RUN_ACTION).click()

    changelist_action([by_action_signal], "signal_instances")
    page.fill("#id_channel", "approve-payment")
    page.fill("#id_payload", '{"approved_by": "the admin, in bulk"}')
    page.locator("input[type=submit][value='Send signal']").click()
    expect(page.locator(".messagelist")).to_contain_text("Signal sent to 1 instance")

    changelist_action([by_action_cancel], "cancel_instances")
    page.fill("#id_reason", "cancelled in bulk")
    page.locator("input[type=submit][value='Request cancellation']").click()
    expect(page.locator(".messagelist")).to_contain_text("Cancellation requested for 1 instance")
    expect(
        page.locator("#result_list .selvedge-badge-running", has_text="Running").first
    ).to_be_visible()
    page.screenshot(path=str(shots / "07-admin-changelist.png"), full_page=True)

    # The workflows react: two complete, two are cancelled with their reasons.
    for order_id, status, text in (
        (by_button_signal, "completed", "Payment approved by the admin."),
        (by_action_signal, "completed", "Payment approved by the admin, in bulk."),
        (by_button_cancel, "cancelled", "Cancelled: cancelled in the admin"),
        (by_action_cancel, "cancelled", "Cancelled: cancelled in bulk"),
    ):
        open_order(page, base, order_id)
        expect(page.locator("#workflow-status")).to_have_text(status, timeout=SLOW)
        expect(page.locator("#status")).to_contain_text(text)

    # Export a history from an instance's page: a selvedge.history/v1 download.
    instance_page(first)
    with page.expect_download() as download_info:
        page.get_by_role("button", name="Export history").click()
    download = download_info.value
    assert download.suggested_filename.endswith(".json")
    exported = json.loads(Path(download.path()).read_text())
    assert exported["format"] == "selvedge.history/v1"
    assert exported["instance"]["instance_id"] == f"order-{first}"
    assert exported["instance"]["status"] == "completed"
    assert any(event["key"] == "#5:receive:approve-payment" for event in exported["events"])

    # And several from the changelist: a zip with one document each.
    choose_action([first, second], "export_instances")
    with page.expect_download() as download_info:
        page.get_by_role("button", name=RUN_ACTION).click()
    archive = download_info.value
    with zipfile.ZipFile(archive.path()) as bundle:
        documents = [json.loads(bundle.read(name)) for name in bundle.namelist()]
    assert sorted(doc["instance"]["instance_id"] for doc in documents) == sorted(
        [f"order-{first}", f"order-{second}"]
    )

    # -- a failed order, resumed from the admin once its cause is fixed -------------------
    held = place_order(page, base, "mug", 1, "declined", on_decline="fail")
    expect(page.locator("#current-step")).to_have_text("awaiting payment approval", timeout=SLOW)
    page.get_by_role("button", name="Approve payment").click()
    # The declined charge fails the run (the order was asked to be held, not rejected).
    expect(page.locator("#workflow-status")).to_have_text("failed", timeout=SLOW)
    expect(page.locator("#order-status")).to_have_text("Stock reserved")
    expect(page.locator("#current-step")).to_have_text("charging payment")
    page.screenshot(path=str(shots / "08-failed-order.png"), full_page=True)

    # Its admin page: a failed badge, the error as text with its traceback.
    instance_page(held)
    expect(page.locator(".field-status_column .selvedge-badge-failed")).to_have_text("Failed")
    expect(page.locator(".field-error_value .selvedge-error-summary")).to_contain_text(
        "CardDeclined"
    )
    page.screenshot(path=str(shots / "08b-admin-failed-instance.png"), full_page=True)
    page.locator(".field-error_value").screenshot(path=str(shots / "08c-admin-error.png"))

    # The changelist's error type filter finds it.
    page.goto(changelist)
    page.locator("#changelist-filter a", has_text="shop.workflows.CardDeclined").click()
    expect(page.locator("#result_list")).to_contain_text(f"order-{held}")

    # Fix the cause: the shop's (simulated) payment provider accepts the card now.
    page.goto(base + "/admin/shop/acceptedcard/add/")
    page.fill("#id_card", "declined")
    page.fill("#id_note", "the issuer lifted its block")
    page.locator("input[type=submit][name=_save]").click()
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")

    # Resume it from the changelist: select it, the resume action, confirm with a reason.
    changelist_action([held], "resume_instances")
    expect(page.locator("#content")).to_contain_text(f"order-{held}")
    page.fill("#id_reason", "card accepted by the provider now")
    page.screenshot(path=str(shots / "09-admin-resume-confirm.png"), full_page=True)
    page.locator("input[type=submit][value='Resume']").click()
    expect(page.locator(".messagelist")).to_contain_text("Resumed 1 instance")

    # The shop page: the resumed run charges the card again, ships and confirms.
    open_order(page, base, held)
    expect(page.locator("#workflow-status")).to_have_text("completed", timeout=SLOW)
    expect(page.locator("#order-status")).to_have_text("Confirmed")
    expect(page.locator("#current-step")).to_have_text("completed")
    expect(page.locator("#tracking")).to_have_text(re.compile(rf"^SV{held:06d}-\d{{4}}$"))
    page.screenshot(path=str(shots / "10-resumed-order-completed.png"), full_page=True)
    # The admin shows the archived generation beside the new history.
    instance_page(held)
    expect(page.locator("#selvedge-archived")).to_contain_text("ActivityFailed")

    # -- the dashboard, then an instance's timeline -----------------------------------------
    page.goto(changelist)
    page.locator(".object-tools a", has_text="Dashboard").click()
    expect(page.locator("#content h1")).to_have_text("Workflow dashboard")
    by_status = page.locator("#selvedge-by-status")
    # The three cancelled orders; the failed one was resumed and completed.
    expect(by_status.locator("tr[data-status=cancelled] .count")).to_have_text("3")
    expect(by_status.locator("tr[data-status=failed] .count")).to_have_text("0")
    expect(by_status.locator("tr[data-status=completed] .count")).not_to_have_text("0")
    expect(page.locator("#selvedge-by-workflow")).to_contain_text("shop.order")
    expect(page.locator("#selvedge-by-workflow")).to_contain_text("shop.shipping")
    expect(page.locator("#selvedge-slowest")).to_contain_text("shop.charge_payment")
    expect(page.locator("#selvedge-workers")).to_contain_text("e2e-worker (leader)")
    expect(page.locator("#selvedge-queues")).to_be_visible()
    # Styled from the static file: the status meters are drawn, the grid lays out columns.
    meter = by_status.locator("tr[data-status=completed] .selvedge-meter-fill")
    assert meter.evaluate("e => getComputedStyle(e).fill") == "rgb(46, 139, 87)"
    assert page.locator(".selvedge-dash").evaluate("e => getComputedStyle(e).display") == "grid"
    page.screenshot(path=str(shots / "11-dashboard.png"), full_page=True)

    # The first order's timeline: the flaky card's charge took two attempts, the shipping
    # child is a bar that links to the child's page.
    instance_page(first)
    timeline = page.locator("#selvedge-timeline svg")
    expect(timeline).to_be_visible()
    # Styled from the static file: a last attempt is drawn solid blue.
    drawn = timeline.locator("rect.sv-attempt").first
    assert drawn.evaluate("e => getComputedStyle(e).fill") == "rgb(47, 111, 173)"
    charge = timeline.locator("g.sv-step", has_text="shop.charge_payment")
    expect(charge.locator("text.sv-label")).to_contain_text("\u00d72")
    expect(charge.locator("rect.sv-earlier")).to_have_count(1)
    expect(charge.locator("rect.sv-attempt")).to_have_count(1)
    attempt = charge.locator("rect.sv-attempt").bounding_box()
    assert attempt is not None and attempt["width"] > 0 and attempt["height"] > 0
    expect(timeline.locator("g.sv-signal", has_text="approve-payment")).to_have_count(1)
    expect(timeline.locator("g.sv-instant", has_text="$close")).to_have_count(1)
    page.locator("#selvedge-timeline").screenshot(path=str(shots / "12-timeline.png"))
    timeline.locator("g.sv-child a").click()
    expect(page.locator("#content")).to_contain_text("shop.shipping")
    expect(page.locator("#selvedge-timeline svg g.sv-step").first).to_be_visible()

    # What the shop's own tables and the admin log say.
    statuses = dict(project.rows("SELECT id, status FROM shop_order"))
    assert statuses == {
        first: "confirmed",
        second: "cancelled",
        by_button_signal: "confirmed",
        by_button_cancel: "cancelled",
        by_action_signal: "confirmed",
        by_action_cancel: "cancelled",
        held: "confirmed",
    }
    logged = [message for (message,) in project.rows("SELECT change_message FROM django_admin_log")]
    assert sum("Sent a signal" in message for message in logged) == 2, logged
    assert sum("Requested cancellation" in message for message in logged) == 2, logged
    assert sum("Exported the history" in message for message in logged) == 3, logged
    assert sum("Resumed as generation 2" in message for message in logged) == 1, logged
    print("screenshots:", ", ".join(sorted(path.name for path in shots.iterdir())))
