"""Settings for ``bench/bench_bulk.py``: ``bench.settings`` and SelvedgeBackend as the
default ``TASKS`` backend (nothing runs the tasks: the benchmark times enqueues)."""

from __future__ import annotations

from bench.settings import *  # noqa: F403

TASKS = {"default": {"BACKEND": "selvedge_django.tasks.SelvedgeBackend"}}
