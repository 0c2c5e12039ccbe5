"""A test-only app: arms the faults described by SELVEDGE_FAULTS in worker subprocesses.

tests/settings.py installs it only when that variable is set (see
``selvedge_django.testing.FaultInjector.to_env``).
"""

from __future__ import annotations

from django.apps import AppConfig


class FaultInjectionConfig(AppConfig):
    name = "tests.faultapp"
    label = "selvedge_test_faults"
    verbose_name = "fault injection (tests)"

    def ready(self) -> None:
        from selvedge_django.testing import install_faults_from_env

        install_faults_from_env()
