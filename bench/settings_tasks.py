"""Settings for ``bench/bench_tasks.py``: both task backends on one database.

``bench.settings`` (the database from the SELVEDGE_BENCH_* variables), plus
``django_tasks_db`` and two ``TASKS`` backends: ``selvedge`` (SelvedgeBackend, with
durable retries: up to 5 attempts) and ``db`` (django-tasks-db's DatabaseBackend).
"""

from __future__ import annotations

from bench.settings import *  # noqa: F403
from bench.settings import INSTALLED_APPS, SELVEDGE

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
# The benchmark's task module is no app's tasks.py: the workers import it (task_modules).
TASKS = {
    "default": {
        "BACKEND": "selvedge_django.tasks.SelvedgeBackend",
        "OPTIONS": {"task_modules": ["bench.tasks_bench"]},
    },
    "selvedge": {
        "BACKEND": "selvedge_django.tasks.SelvedgeBackend",
        "OPTIONS": {"retry_policy": {"max_attempts": 5}, "task_modules": ["bench.tasks_bench"]},
    },
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
# Both workers poll an idle database every 50 ms (db_worker --interval 0.05), so that
# idle latency compares the engines, not their default poll intervals.
SELVEDGE = {
    **SELVEDGE,
    "ACTIVITY_POLL_INTERVAL": 0.05,
    "WORKFLOW_RESUMPTION_INTERVAL": 0.05,
    "TIMER_CHECK_INTERVAL": 0.05,
    "MAX_POLL_INTERVAL": 0.05,
}
