"""Settings of the worker processes that ``bench/bench_scale.py`` starts.

The benchmark's own settings (``bench/settings.py``, the same database through
the same variables) plus the benchmark workflows. ``SELVEDGE_BENCH_POLL``
(seconds) shortens the polling intervals: processes sharing a SQLite file have
no notifications and find work only by polling.
"""

from __future__ import annotations

import os

from bench.settings import *  # noqa: F403 - the same database and logging
from bench.settings import SELVEDGE as _BASE

SELVEDGE: dict[str, object] = {**_BASE, "MODULES": ["bench.workloads"]}

if os.environ.get("SELVEDGE_BENCH_POLL"):
    _poll = float(os.environ["SELVEDGE_BENCH_POLL"])
    SELVEDGE.update(
        WORKFLOW_RESUMPTION_INTERVAL=_poll,
        ACTIVITY_POLL_INTERVAL=_poll,
        TIMER_CHECK_INTERVAL=_poll,
        WAIT_POLL_INTERVAL=_poll,
        MAX_POLL_INTERVAL=max(_poll, 0.5),
    )
