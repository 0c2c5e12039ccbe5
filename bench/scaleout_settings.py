"""Settings of the worker processes that ``bench/scale_out.py`` starts.

``bench/settings_admin.py`` (the benchmark database, the project's defaults, the
admin, whose changelist the benchmark loads) plus the probe app
(``bench/scaleout_probe.py``), the scale workflows and SelvedgeBackend as the
``django.tasks`` backend. The benchmark process itself uses them too.

``SELVEDGE_BENCH_PGBOUNCER_PORT`` sends the engine's connections through a pgbouncer
in transaction mode on that port, as docs/deployment.md describes: no server-side
cursors, no prepared statements (pgbouncer before 1.21 keeps none), and a direct
connection (alias ``direct``) for LISTEN and for lease and claim renewals.
"""

from __future__ import annotations

import os
from typing import Any

from bench.settings import DATABASES
from bench.settings import SELVEDGE as _BASE
from bench.settings_admin import *  # noqa: F403 - the same database, logging and admin
from bench.settings_admin import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.scaleout_probe.ProbeConfig"]
SELVEDGE = {**_BASE, "MODULES": ["bench.workloads", "bench.scaleout_workloads"]}
TASKS = {
    "default": {
        "BACKEND": "selvedge_django.tasks.SelvedgeBackend",
        "OPTIONS": {"task_modules": ["bench.tasks_bulk"]},
    }
}

if os.environ.get("SELVEDGE_BENCH_PGBOUNCER_PORT"):
    _pooled: dict[str, Any] = DATABASES["default"]
    DATABASES["direct"] = dict(_pooled)
    _pooled["PORT"] = os.environ["SELVEDGE_BENCH_PGBOUNCER_PORT"]
    _pooled["DISABLE_SERVER_SIDE_CURSORS"] = True
    _pooled.pop("OPTIONS", None)
    SELVEDGE.update(PREPARED_STATEMENTS=False, LISTEN_DATABASE="direct", RENEWAL_DATABASE="direct")
