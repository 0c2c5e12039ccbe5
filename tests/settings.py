"""Settings for the test suite: SELVEDGE_TEST_DB=sqlite (default) or postgres."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "selvedge-tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "selvedge_django",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DB = os.environ.get("SELVEDGE_TEST_DB", "sqlite")
# One test database per test run, so concurrent runs never share one; worker
# subprocesses inherit the variable and open the same database.
RUN_ID = os.environ.setdefault("SELVEDGE_RUN_ID", str(os.getpid()))
# Worker subprocesses started by the tests connect straight to the test database.
SUBPROCESS = os.environ.get("SELVEDGE_TEST_SUBPROCESS") == "1"

DATABASES: dict[str, dict[str, Any]]
if DB == "postgres":
    _test_name = os.environ.get("SELVEDGE_PG_TEST_NAME", f"test_selvedge_{RUN_ID}")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _test_name if SUBPROCESS else os.environ.get("SELVEDGE_PG_NAME", "selvedge"),
            "USER": os.environ.get("SELVEDGE_PG_USER", "postgres"),
            "PASSWORD": os.environ.get("SELVEDGE_PG_PASSWORD", ""),
            "HOST": os.environ.get("SELVEDGE_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("SELVEDGE_PG_PORT", "5432"),
            "TEST": {"NAME": _test_name},
        }
    }
else:
    _dir = Path(os.environ.get("SELVEDGE_SQLITE_DIR", tempfile.gettempdir()))
    _test_file = str(_dir / f"selvedge-test-{RUN_ID}.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _test_file if SUBPROCESS else str(_dir / "selvedge-dev.sqlite3"),
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
            "TEST": {"NAME": _test_file},
        }
    }

SELVEDGE = {
    "LEASE": {"TTL": 4, "RENEW_INTERVAL": 1, "MARGIN": 1, "MAX_SKEW": 0.5},
    "WORKFLOW_RESUMPTION_INTERVAL": 0.05,
    "ACTIVITY_POLL_INTERVAL": 0.05,
    "MAX_POLL_INTERVAL": 0.5,
    "WAIT_POLL_INTERVAL": 0.05,
    "TIMER_CHECK_INTERVAL": 0.05,
    "SHUTDOWN_TIMEOUT": 10,
}
# django.tasks (Django 6) or the django-tasks backport (Django 5.2) read this; on 5.2 without
# the backport it is inert. tests/testapp/tasks.py defines the tasks that use it.
TASKS = {
    "default": {
        "BACKEND": "selvedge_django.tasks.SelvedgeBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "retry_policy": {
                "max_attempts": 3,
                "initial_interval": 0.05,
                "max_interval": 0.1,
                "non_retryable_errors": ["tests.testapp.tasks.Refused"],
            }
        },
    }
}
# Worker subprocesses of tests/processes/test_scale.py: a short leader lease (takeover tests)
# and slow polling (so that only a notification can explain a prompt wake-up).
if os.environ.get("SELVEDGE_TEST_LEADER_LEASE"):
    _lease = float(os.environ["SELVEDGE_TEST_LEADER_LEASE"])
    SELVEDGE["LEADER_LEASE_DURATION"] = _lease
    SELVEDGE["LEADER_HEARTBEAT_INTERVAL"] = _lease / 6
if os.environ.get("SELVEDGE_TEST_POLL_INTERVAL"):
    _poll = float(os.environ["SELVEDGE_TEST_POLL_INTERVAL"])
    for _key in ("WORKFLOW_RESUMPTION_INTERVAL", "ACTIVITY_POLL_INTERVAL", "TIMER_CHECK_INTERVAL"):
        SELVEDGE[_key] = _poll
    SELVEDGE["MAX_POLL_INTERVAL"] = _poll
# Worker and command subprocesses of tests/processes/test_payload_codec_processes.py:
# SELVEDGE_TEST_PAYLOAD_KEYS=key1,key2 encrypts with FernetCodec under those keys, and
# registers the workflows of those tests.
if os.environ.get("SELVEDGE_TEST_PAYLOAD_KEYS"):
    SELVEDGE["PAYLOAD_CODEC"] = "selvedge_django.codecs.FernetCodec"
    SELVEDGE["PAYLOAD_KEYS"] = os.environ["SELVEDGE_TEST_PAYLOAD_KEYS"].split(",")
    SELVEDGE["MODULES"] = ["tests.codec_workflows"]
# The suite both ways: SELVEDGE_TEST_WORKFLOW_CACHE=N gives every worker (threads and
# processes) a workflow cache of N entries (0: none); the default runs with the default
# cache, as a project does.
if os.environ.get("SELVEDGE_TEST_WORKFLOW_CACHE"):
    SELVEDGE["WORKFLOW_CACHE"] = {"MAX_ENTRIES": int(os.environ["SELVEDGE_TEST_WORKFLOW_CACHE"])}

# SELVEDGE_TEST_PG_PREPARE=1: PostgreSQL connections bind parameters on the server and
# prepare each statement from its fifth run on (the set-up docs/deployment.md recommends
# for direct connections); CI runs one PostgreSQL pass this way.
if DB == "postgres" and os.environ.get("SELVEDGE_TEST_PG_PREPARE") == "1":
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}

# Worker subprocesses of tests/processes/test_pgbouncer.py: the engine's alias goes through a
# pgbouncer in transaction mode on this port, and the listener (unless
# SELVEDGE_TEST_PGBOUNCER_LISTEN=pooled: the set-up that cannot work) and the renewer (unless
# SELVEDGE_TEST_PGBOUNCER_RENEWAL=pooled: leases lapse behind a full pool) have a direct one.
if DB == "postgres" and os.environ.get("SELVEDGE_TEST_PGBOUNCER_PORT"):
    DATABASES["direct"] = dict(DATABASES["default"])
    DATABASES["default"]["PORT"] = os.environ["SELVEDGE_TEST_PGBOUNCER_PORT"]
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    # pgbouncer's transaction mode (before 1.21) keeps no prepared statement, so the
    # engine prepares none (unless SELVEDGE_TEST_PGBOUNCER_PREPARE=1: the project's OPTIONS
    # prepare every statement, or =engine: the engine's default; the set-ups that fail).
    DATABASES["default"].pop("OPTIONS", None)
    _prepare = os.environ.get("SELVEDGE_TEST_PGBOUNCER_PREPARE")
    if _prepare == "1":
        DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 0}
    elif _prepare != "engine":
        SELVEDGE["PREPARED_STATEMENTS"] = False
    if os.environ.get("SELVEDGE_TEST_PGBOUNCER_LISTEN") != "pooled":
        SELVEDGE["LISTEN_DATABASE"] = "direct"
    if os.environ.get("SELVEDGE_TEST_PGBOUNCER_RENEWAL") != "pooled":
        SELVEDGE["RENEWAL_DATABASE"] = "direct"

# Fault tests (tests/processes/test_crash_matrix.py, tests/processes/test_faults.py,
# bench/soak.py) arm faults in worker subprocesses (SELVEDGE_FAULTS) and give them extra
# SELVEDGE keys, such as short leases (SELVEDGE_TEST_OVERRIDES, a JSON object).
if os.environ.get("SELVEDGE_FAULTS"):
    INSTALLED_APPS.append("tests.faultapp.FaultInjectionConfig")
SELVEDGE.update(json.loads(os.environ.get("SELVEDGE_TEST_OVERRIDES") or "{}"))

# The suite runs transactional activities on SQLite on purpose, and with short leases
# (tests/integration/test_settings.py checks the warnings themselves).
SILENCED_SYSTEM_CHECKS = ["selvedge.W003", "selvedge.W007"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"selvedge_django": {"handlers": ["console"], "level": "WARNING"}},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
