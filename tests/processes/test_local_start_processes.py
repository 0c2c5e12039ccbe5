"""A start handed over in a process that dies at its commit is taken over by another worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import selvedge_django as sv
from selvedge_django.models import WorkflowInstance
from tests.integration.test_local_starts import leased_rows
from tests.testapp.models import Ledger

CRASHING_STARTER = """
import django, sys
django.setup()
import selvedge_django as sv
from selvedge_django.testing import Fault, FaultInjector
from selvedge_django.worker import Worker

worker = Worker(worker_id="doomed-starter").start()
injector = FaultInjector()
injector.add(Fault("exit_after_commit", operation="create_instance", pattern="^INSERT"))
injector.install()
sv.start_workflow("test.ledger", ["local:orphan"], instance_id=sys.argv[1])
print("still alive")
"""


def test_a_start_handed_over_in_a_process_that_dies_at_commit_is_taken_over(
    make_worker: Callable[..., Any], tdb: None
) -> None:
    import json
    import os
    import subprocess
    import sys

    from django.db import connection

    from selvedge_django.testing import FAULT_EXIT_STATUS
    from tests.conftest import ROOT

    lease = {"TTL": 1.0, "RENEW_INTERVAL": 0.25, "MARGIN": 0.25, "MAX_SKEW": 0.1}
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": str(ROOT),
        "SELVEDGE_TEST_OVERRIDES": json.dumps({"LEASE": lease}),
    }
    if connection.vendor == "postgresql":
        env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_STARTER, "local-orphan"],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == FAULT_EXIT_STATUS, done.stdout + done.stderr
    assert "still alive" not in done.stdout
    # Committed, leased to the dead process's worker, which never ran it.
    assert leased_rows()["local-orphan"] == ("doomed-starter", 1, False)
    assert not Ledger.objects.filter(entry="local:orphan").exists()
    make_worker()
    result = sv.wait_workflow("local-orphan", timeout=30)
    assert result.status == "completed" and result.output == ["local:orphan"]
    assert WorkflowInstance.objects.get(instance_id="local-orphan").lease_epoch == 2
    assert list(Ledger.objects.filter(entry="local:orphan").values_list("entry", flat=True)) == [
        "local:orphan"
    ]
