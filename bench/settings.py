"""Django settings for the benchmarks (``bench/harness.py`` sets the variables below).

SELVEDGE_BENCH_DB      sqlite (default) or postgres
SELVEDGE_BENCH_SQLITE  the SQLite file (a fresh one in a temporary directory)
SELVEDGE_BENCH_PG_NAME the PostgreSQL database created and dropped by the run
                       (default selvedge_bench_<pid>); the server is found through the
                       SELVEDGE_PG_HOST / _PORT / _USER / _PASSWORD variables the
                       test settings use (default 127.0.0.1:5432, user postgres)
SELVEDGE_BENCH_PREPARE 1: PostgreSQL connections bind parameters on the server and
                       prepare statements (OPTIONS server_side_binding and
                       prepare_threshold, as docs/deployment.md recommends); off by
                       default (Django's client-side binding)
SELVEDGE_BENCH_PREPARED 0: the engine's own statements are not prepared either
                       (SELVEDGE["PREPARED_STATEMENTS"] = False; on by default)
"""

from __future__ import annotations

import os

SECRET_KEY = "selvedge-bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["selvedge_django"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DB = os.environ.get("SELVEDGE_BENCH_DB", "sqlite")

if DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("SELVEDGE_BENCH_PG_NAME", "selvedge_bench"),
            "USER": os.environ.get("SELVEDGE_PG_USER", "postgres"),
            "PASSWORD": os.environ.get("SELVEDGE_PG_PASSWORD", ""),
            "HOST": os.environ.get("SELVEDGE_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("SELVEDGE_PG_PORT", "5432"),
        }
    }
    if os.environ.get("SELVEDGE_BENCH_PREPARE") == "1":
        DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}
elif DB == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SELVEDGE_BENCH_SQLITE", "selvedge-bench.sqlite3"),
            # As in the test settings: write transactions take the lock up front.
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
        }
    }
else:
    raise ValueError(f"SELVEDGE_BENCH_DB must be sqlite or postgres, not {DB!r}")

# Project defaults throughout, so the figures describe an untuned install.
SELVEDGE: dict[str, object] = {}
# SELVEDGE_BENCH_CACHE=N gives the workflow cache N entries (0: off; on by default).
if os.environ.get("SELVEDGE_BENCH_CACHE"):
    SELVEDGE["WORKFLOW_CACHE"] = {"MAX_ENTRIES": int(os.environ["SELVEDGE_BENCH_CACHE"])}
# SELVEDGE_BENCH_PREPARED=0 turns off the engine's prepared statements (on by default).
if os.environ.get("SELVEDGE_BENCH_PREPARED") == "0":
    SELVEDGE["PREPARED_STATEMENTS"] = False

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"selvedge_django": {"handlers": ["console"], "level": "WARNING"}},
}
