"""Settings for the example (demo) shop, read from the environment with django-environ.

``DEBUG`` is off unless the environment turns it on (``DEBUG=1``, as
``scripts/demo`` does for a local demo), and ``SECRET_KEY`` must come from the
environment unless ``DEBUG`` is on: a copy of this project never runs in
production on a development key. ``DATABASE_URL`` defaults to a SQLite file
next to ``manage.py``; point it at PostgreSQL
(``postgres://user:password@host:5432/name``) to run several worker processes
against one database.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1"]),
)
if (BASE_DIR / ".env").is_file():
    environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env("DEBUG")
# Only a local demo (DEBUG on) may run on this published, insecure key.
SECRET_KEY = env("SECRET_KEY", default="django-insecure-demo-only-never-deploy" if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "Set SECRET_KEY in the environment (or DEBUG=1 for a local demo on a development key)."
    )
ALLOWED_HOSTS: list[str] = env("ALLOWED_HOSTS")

# The shop's pages need a login (orders belong to users); Django's own login views.
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "shop:index"
LOGOUT_REDIRECT_URL = "login"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "selvedge_django",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# A content security policy (Django 6's SECURE_CSP; Django 5.2 has none to turn on): no
# inline style or script anywhere, the shop's pages or the admin's. CSP=0 turns it off.
if env.bool("CSP", default=True) and importlib.util.find_spec("django.middleware.csp"):
    from django.utils.csp import CSP

    MIDDLEWARE.insert(1, "django.middleware.csp.ContentSecurityPolicyMiddleware")
    SECURE_CSP = {
        "default-src": [CSP.SELF],
        "style-src": [CSP.SELF],
        "script-src": [CSP.SELF],
    }

ROOT_URLCONF = "config.urls"

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
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Take SQLite's write lock when a transaction begins, so concurrent writers
    # wait for each other (busy timeout) instead of failing with "database is
    # locked". selvedge_django turns on WAL by itself.
    DATABASES["default"].setdefault("OPTIONS", {})["transaction_mode"] = "IMMEDIATE"
    # The shop's transactional activities are a few quick ORM writes, so holding
    # SQLite's write lock for their bodies is fine here (selvedge.W003 explains why a
    # long one is not).
    SILENCED_SYSTEM_CHECKS = ["selvedge.W003"]

# Every key is optional. Short poll intervals keep the demo snappy: on SQLite a
# worker in another process learns about new work by polling.
SELVEDGE = {
    "WORKFLOW_RESUMPTION_INTERVAL": env.float("SELVEDGE_RESUMPTION_INTERVAL", default=0.2),
    "ACTIVITY_POLL_INTERVAL": env.float("SELVEDGE_ACTIVITY_POLL_INTERVAL", default=0.2),
    "TIMER_CHECK_INTERVAL": 0.5,
    "WAIT_POLL_INTERVAL": 0.2,
    "MAX_POLL_INTERVAL": 2,
}

# The shop's order workflow: how long an order waits for "Approve payment" before
# it is rejected, and how long the shipping child workflow's packing timer runs.
SHOP_APPROVAL_TIMEOUT = env.float("SHOP_APPROVAL_TIMEOUT", default=24 * 3600)
SHOP_PACKING_SECONDS = env.float("SHOP_PACKING_SECONDS", default=2)
# How long one response of an order's live steps lasts before the browser reconnects
# (a runserver or WSGI thread is held meanwhile).
SHOP_STREAM_SECONDS = env.float("SHOP_STREAM_SECONDS", default=60)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "selvedge_django": {"handlers": ["console"], "level": "INFO"},
        "shop": {"handlers": ["console"], "level": "INFO"},
    },
}
