"""The pytest plugin and ``selvedge_django.testing`` as a project's test suite meets them.

The plugin is loaded by every pytest run of a virtualenv where the package is
installed, so it must stay out of the way of runs that have nothing to do with
Django; ``selvedge_django.testing`` must serve ``manage.py test`` users who have
no pytest at all. Each case runs in a fresh interpreter, as a user's would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import TestCase

from selvedge_django.testing import SelvedgeTestMixin
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in (
            "DJANGO_SETTINGS_MODULE",
            "SELVEDGE_TEST_SUBPROCESS",
            "PYTEST_ADDOPTS",
            "PYTEST_CURRENT_TEST",
            "PYTHONPATH",
        )
    }
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=str(cwd),
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )


def test_an_unrelated_pytest_run_is_not_disturbed_by_the_plugin(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        "def test_arithmetic():\n"
        "    assert 1 + 1 == 2\n"
        "\n"
        "def test_the_plugin_is_loaded(request):\n"
        "    assert request.config.pluginmanager.has_plugin('selvedge_django')\n",
        encoding="utf-8",
    )
    done = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider"], tmp_path, _clean_env())
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert re.search(r"\b2 passed\b", output), output
    assert "error" not in output.lower(), output
    # Importing the plugin imports no Django models.
    code = (
        "import sys, selvedge_django.testing.pytest_plugin\n"
        "print('selvedge_django.models' in sys.modules)"
    )
    done = _run(["-c", code], tmp_path, _clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_testing_module_imports_without_pytest(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['pytest'] = None\n"  # any `import pytest` now fails
        "import selvedge_django.testing as t\n"
        "print(sorted(n for n in ('ControllableClock', 'SelvedgeTestMixin', 'run_until_idle',"
        " 'FaultInjector') if hasattr(t, n)))\n"
    )
    done = _run(["-c", code], tmp_path, _clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        ["ControllableClock", "FaultInjector", "SelvedgeTestMixin", "run_until_idle"]
    )


def _docs_unittest_example() -> str:
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    section = text.split("## With Django's test runner", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "docs/testing.md has no example for Django's test runner"
    return match.group(1)


def test_the_testing_pages_mixin_example_runs_under_manage_py_test(
    tdb: None, tmp_path: Path
) -> None:
    (tmp_path / "docs_mixin_example.py").write_text(_docs_unittest_example(), encoding="utf-8")
    run_id = f"{os.getpid()}_mixin"
    env = _clean_env(
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]),
        SELVEDGE_RUN_ID=run_id,  # its own test database, created and dropped by the runner
        SELVEDGE_PG_TEST_NAME=f"test_selvedge_{run_id}",
        SELVEDGE_TEST_DB=connection.vendor.replace("postgresql", "postgres"),
    )
    done = _run(
        ["-m", "django", "test", "docs_mixin_example", "--noinput", "-v", "2"], tmp_path, env
    )
    output: Any = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert re.search(r"Ran 2 tests in .*\n\s*\nOK", output), output


def _docs_pytest_example() -> str:
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    section = text.split("## With pytest", 1)[1].split("## With Django's test runner", 1)[0]
    example = section.split("A complete test\nmodule:", 1)[1]
    match = re.search(r"```python\n(.*?)```", example, re.DOTALL)
    assert match is not None, "docs/testing.md has no complete pytest example"
    return match.group(1)


def _run_docs_pytest_example(tmp_path: Path, test_name: str | None) -> tuple[int, str]:
    """The pytest example of docs/testing.md, verbatim, in a project of its own on SQLite
    with pytest-django's defaults (and ``TEST["NAME"]`` when given)."""
    test = "" if test_name is None else f', "TEST": {{"NAME": {test_name!r}}}'
    (tmp_path / "example_settings.py").write_text(
        'SECRET_KEY = "example"\n'
        "USE_TZ = True\n"
        'INSTALLED_APPS = ["django.contrib.contenttypes", "selvedge_django"]\n'
        "DATABASES = {\n"
        '    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"'
        f"{test}}}\n"
        "}\n",
        encoding="utf-8",
    )
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nDJANGO_SETTINGS_MODULE = example_settings\n", encoding="utf-8"
    )
    (tmp_path / "test_docs_example.py").write_text(_docs_pytest_example(), encoding="utf-8")
    env = _clean_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    done = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rE"], tmp_path, env)
    return done.returncode, done.stdout + done.stderr


def test_the_testing_pages_pytest_example_passes_on_a_sqlite_test_file(tmp_path: Path) -> None:
    returncode, output = _run_docs_pytest_example(tmp_path, "test_db.sqlite3")
    assert returncode == 0, output
    assert re.search(r"\b3 passed\b", output), output


def test_a_started_worker_on_an_in_memory_test_database_says_what_to_set(
    tmp_path: Path,
) -> None:
    """pytest-django's default SQLite test database is in memory: worker threads share it
    through SQLite's shared cache and fail with "database table is locked". The started
    worker refuses it at once, naming the setting; the tests in the test's thread pass."""
    returncode, output = _run_docs_pytest_example(tmp_path, None)
    assert returncode != 0, output
    assert re.search(r"\b2 passed, 1 error\b", output), output
    assert "ImproperlyConfigured" in output, output
    assert "DATABASES['default']['TEST']['NAME']" in output, output
    assert "table is locked" not in output.replace("'database table is locked'", ""), output


def test_the_mixin_refuses_a_test_case_that_wraps_each_test_in_a_transaction() -> None:
    class Wrapped(SelvedgeTestMixin, TestCase):
        def test_nothing(self) -> None:
            pass

    case = Wrapped("test_nothing")
    with pytest.raises(TypeError, match="TransactionTestCase"):
        case.setUp()
