"""A Prometheus endpoint for the metrics, once per process that serves.

Needs ``opentelemetry-sdk`` and ``opentelemetry-exporter-prometheus`` (which brings
``prometheus-client``) besides the ``[otel]`` extra. In ``settings.py``::

    import os

    from selvedge_django.contrib.prometheus import serve_metrics

    if os.environ.get("METRICS_PORT"):
        serve_metrics(int(os.environ["METRICS_PORT"]))

    SELVEDGE = {"METRICS": True}

:func:`serve_metrics` sets the global meter provider with a Prometheus reader and
starts ``prometheus_client``'s HTTP server on the port, at most once per process
(settings may be imported more than once), and only in a process that serves:

- ``runselvedge``: when ``runselvedge worker`` starts its worker. Under the
  autoreloader (``--reload``, the default with ``DEBUG``) that is the reloaded
  child: the parent process only watches files and restarts the child, and would
  otherwise hold the port the child then fails to bind ("Address already in
  use"). Other subcommands (``status``, ``start`` ...) open no port.
- ``runserver``: in the reloaded child (``RUN_MAIN``), or at once with
  ``--noreload``.
- anywhere else (gunicorn, uvicorn, a script): at once. One port per process: a
  server with several worker processes needs a port each.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["serve_metrics", "start_deferred"]

# Django's autoreloader sets this to "true" in the child process it restarts.
_RELOADED_CHILD = "RUN_MAIN"

_lock = threading.Lock()
_handled_pid: int | None = None  # the process serve_metrics() ran in
_deferred: Callable[[], None] | None = None  # the server start left to the worker


def serve_metrics(
    port: int, addr: str = "0.0.0.0", *, resource: Any = None, argv: Sequence[str] | None = None
) -> bool:
    """Expose the metrics on ``http://addr:port/metrics`` from this process.

    Sets a ``MeterProvider`` (with ``resource``, an OpenTelemetry ``Resource``, when
    given) whose reader is a ``PrometheusMetricReader`` as the global meter provider,
    and starts the HTTP server now or when this process starts to serve (see the
    module's docstring; ``argv`` defaults to ``sys.argv``). A second call in the same
    process does nothing. Returns whether the server started in this call.
    """
    global _deferred, _handled_pid
    with _lock:
        if _handled_pid == os.getpid():
            return False
        _set_meter_provider(resource)
        _handled_pid = os.getpid()
        _deferred = None
        when = _when_to_serve(list(sys.argv if argv is None else argv))
        if when == "never":
            return False
        if when == "worker":
            _deferred = lambda: _start_http_server(port, addr)  # noqa: E731
            return False
    _start_http_server(port, addr)
    return True


def start_deferred() -> bool:
    """Start the server :func:`serve_metrics` left for this worker, if any (once).

    ``runselvedge worker`` calls it as its worker starts, in the process that runs
    the worker. Returns whether a server started.
    """
    global _deferred
    with _lock:
        start, _deferred = _deferred, None
    if start is None or _handled_pid != os.getpid():
        return False
    start()
    return True


def _when_to_serve(argv: list[str]) -> str:
    """``now``, ``worker`` (when ``runselvedge worker`` starts) or ``never`` (the
    autoreloader's parent of ``runserver``)."""
    command = argv[1] if len(argv) > 1 else ""
    if command == "runselvedge":
        return "worker"
    if command == "runserver":
        reloaded_child = os.environ.get(_RELOADED_CHILD) == "true"
        return "now" if reloaded_child or "--noreload" in argv else "never"
    return "now"


def _set_meter_provider(resource: Any) -> None:
    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider

    options: dict[str, Any] = {"metric_readers": [PrometheusMetricReader()]}
    if resource is not None:
        options["resource"] = resource
    metrics.set_meter_provider(MeterProvider(**options))


def _start_http_server(port: int, addr: str) -> None:
    from prometheus_client import start_http_server

    start_http_server(port, addr=addr)
