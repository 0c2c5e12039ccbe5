"""URLs of the app: ``path("selvedge/", include("selvedge_django.urls"))``.

- ``health/`` (name ``selvedge:health``): the health view, see
  :mod:`selvedge_django.views`.
"""

from __future__ import annotations

from django.urls import URLPattern, path

from . import views

app_name = "selvedge"

urlpatterns: list[URLPattern] = [path("health/", views.health, name="health")]
