"""``contrib.prometheus.serve_metrics``: one metrics endpoint per serving process.

The README's first metrics snippet called ``prometheus_client.start_http_server`` in
settings: under the autoreloader (``runselvedge worker`` with ``DEBUG``) the parent
process bound the port while importing settings, and the reloaded child, which runs the
worker, failed with "Address already in use". The process test runs that setup with
stand-ins for ``prometheus_client`` and the OpenTelemetry Prometheus reader (neither is
a test dependency) whose server binds the port for real.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from selvedge_django.contrib import prometheus
from tests.conftest import ROOT


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Stand-ins for the reader, the meter provider's setter and the HTTP server."""
    from opentelemetry import metrics

    calls: dict[str, list[Any]] = {"servers": [], "providers": []}
    reader = ModuleType("opentelemetry.exporter.prometheus")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader.PrometheusMetricReader = InMemoryMetricReader  # type: ignore[attr-defined]
    client = ModuleType("prometheus_client")
    client.start_http_server = (  # type: ignore[attr-defined]
        lambda port, addr="0.0.0.0": calls["servers"].append((addr, port))
    )
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.prometheus", reader)
    monkeypatch.setitem(sys.modules, "prometheus_client", client)
    monkeypatch.setattr(metrics, "set_meter_provider", calls["providers"].append)
    monkeypatch.setattr(prometheus, "_handled_pid", None)
    monkeypatch.setattr(prometheus, "_deferred", None)
    monkeypatch.delenv("RUN_MAIN", raising=False)
    return calls


def test_the_server_starts_at_once_outside_management_commands(fakes: Any) -> None:
    assert prometheus.serve_metrics(9464, argv=["gunicorn", "mysite.wsgi"])
    assert fakes["servers"] == [("0.0.0.0", 9464)]
    assert len(fakes["providers"]) == 1
    # Settings imported again in the same process: nothing more.
    assert not prometheus.serve_metrics(9464, argv=["gunicorn", "mysite.wsgi"])
    assert fakes["servers"] == [("0.0.0.0", 9464)]
    assert len(fakes["providers"]) == 1
    assert not prometheus.start_deferred()


def test_runselvedge_serves_when_its_worker_starts(fakes: Any) -> None:
    argv = ["manage.py", "runselvedge", "worker"]
    assert not prometheus.serve_metrics(9464, addr="127.0.0.1", argv=argv)
    assert fakes["servers"] == []  # the autoreloader's parent stops here
    assert len(fakes["providers"]) == 1
    assert prometheus.start_deferred()  # the worker's process
    assert fakes["servers"] == [("127.0.0.1", 9464)]
    assert not prometheus.start_deferred()
    assert fakes["servers"] == [("127.0.0.1", 9464)]


def test_runserver_serves_in_the_reloaded_child_only(
    fakes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not prometheus.serve_metrics(9464, argv=["manage.py", "runserver"])
    assert fakes["servers"] == []
    monkeypatch.setattr(prometheus, "_handled_pid", None)
    assert prometheus.serve_metrics(9464, argv=["manage.py", "runserver", "--noreload"])
    monkeypatch.setattr(prometheus, "_handled_pid", None)
    monkeypatch.setenv("RUN_MAIN", "true")
    assert prometheus.serve_metrics(9464, argv=["manage.py", "runserver"])
    assert fakes["servers"] == [("0.0.0.0", 9464)] * 2


# -- a real autoreloading worker ------------------------------------------------------------

FAKE_CLIENT = """
import os
import socket

_held = []


def start_http_server(port, addr="0.0.0.0"):
    _held.append(socket.create_server((addr, port)))  # "Address already in use" if taken
    with open(os.environ["METRICS_PIDS"], "a") as pids:
        pids.write(f"{os.getpid()}\\n")
"""

SETTINGS = """
import os

from selvedge_django.contrib.prometheus import serve_metrics

SECRET_KEY = "metrics"
DEBUG = True  # runselvedge worker reloads
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "selvedge_django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["METRICS_DB"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
}
SELVEDGE = {"METRICS": True}

if os.environ.get("METRICS_PORT"):
    serve_metrics(int(os.environ["METRICS_PORT"]), addr="127.0.0.1")
"""


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def _project(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "prometheus_client.py").write_text(FAKE_CLIENT, encoding="utf-8")
    reader = tmp_path / "opentelemetry" / "exporter" / "prometheus"
    reader.mkdir(parents=True)
    (reader / "__init__.py").write_text(
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader as"
        " PrometheusMetricReader\n",
        encoding="utf-8",
    )
    (tmp_path / "metrics_settings.py").write_text(SETTINGS, encoding="utf-8")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("RUN_MAIN", "PYTEST_CURRENT_TEST", "SELVEDGE_TEST_SUBPROCESS")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="metrics_settings",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]),
        METRICS_DB=str(tmp_path / "db.sqlite3"),
        METRICS_PIDS=str(tmp_path / "pids.txt"),
    )
    return env


@pytest.mark.slow
def test_an_autoreloading_worker_serves_its_metrics_from_the_reloaded_child(
    tmp_path: Path,
) -> None:
    env = _project(tmp_path)
    migrate = [sys.executable, "-m", "django", "migrate", "-v", "0"]
    done = subprocess.run(migrate, cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    port = _free_port()
    env["METRICS_PORT"] = str(port)
    out = tmp_path / "worker.out"
    with out.open("wb") as sink:
        worker = subprocess.Popen(
            [sys.executable, "-m", "django", "runselvedge", "worker"],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while b"started" not in out.read_bytes():
            assert worker.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        time.sleep(0.5)  # a child that failed to bind would have ended by now
        assert worker.poll() is None, out.read_text()
        assert b"Watching for file changes" in out.read_bytes()  # it did reload
        pids = (tmp_path / "pids.txt").read_text().split()
        assert len(pids) == 1, out.read_text()
        assert int(pids[0]) != worker.pid  # the child, not the reloader's parent
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        os.killpg(worker.pid, 15)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, 9)
            worker.wait()
