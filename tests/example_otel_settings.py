"""The example shop's settings with OpenTelemetry spans exported to a file.

For the worker process of ``tests/integration/test_example_observability.py``:
``SPANS_FILE`` names the file, one JSON span per line (the SDK's console exporter
writing to it), so the test reads what another process exported.
"""

from __future__ import annotations

import os

from config.settings import *  # noqa: F403
from config.settings import SELVEDGE as _SHOP_SELVEDGE
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from selvedge_django.contrib.otel import OpenTelemetryHooks


def _one_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(
            out=open(os.environ["SPANS_FILE"], "a", encoding="utf-8"),  # noqa: SIM115
            formatter=_one_line,
        )
    )
)

SELVEDGE = {**_SHOP_SELVEDGE, "HOOKS": OpenTelemetryHooks(tracer_provider=_provider)}
