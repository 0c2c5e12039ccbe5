"""Django settings for ``bench_admin.py``: the benchmark settings plus the admin.

Everything in ``bench/settings.py`` (databases, SELVEDGE defaults) holds; this
adds the apps, middleware and templates the admin needs and mounts it at
``/admin/`` (``bench/urls_admin.py``).
"""

from __future__ import annotations

from bench.settings import *  # noqa: F403 - the benchmark settings, extended below
from bench.settings import INSTALLED_APPS

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    *INSTALLED_APPS,
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
ROOT_URLCONF = "bench.urls_admin"
ALLOWED_HOSTS = ["testserver"]
