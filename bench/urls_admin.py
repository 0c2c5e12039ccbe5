"""URLs for ``bench_admin.py``: the admin site at ``/admin/``, the app's at ``/selvedge/``."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("selvedge/", include("selvedge_django.urls")),
]
