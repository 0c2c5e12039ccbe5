"""Payload encryption with real processes: a worker process without the key beside one
with it, and ``runselvedge rotate-keys`` killed half-way and run again.

The subprocesses get their keys from ``SELVEDGE_TEST_PAYLOAD_KEYS`` (tests/settings.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.codecs import FernetCodec, fernet_key_id
from selvedge_django.models import HistoryEvent, WorkflowInstance
from selvedge_django.operations import status_report
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests import codec_workflows
from tests.conftest import ROOT, WorkerProcess, wait_until

SECRET = "px-PROCESS-SECRET-3318"
KEY_A = FernetCodec.generate_key()
KEY_B = FernetCodec.generate_key()


def keys_env(*keys: str) -> dict[str, str]:
    # A short leader lease: heartbeats (and the undecodable list) every half second.
    return {"SELVEDGE_TEST_PAYLOAD_KEYS": ",".join(keys), "SELVEDGE_TEST_LEADER_LEASE": "3"}


def with_keys(*keys: str) -> Any:
    return override_settings(
        SELVEDGE={
            **settings.SELVEDGE,
            "PAYLOAD_CODEC": "selvedge_django.codecs.FernetCodec",
            "PAYLOAD_KEYS": list(keys),
        }
    )


@pytest.fixture
def encrypted(tdb: None) -> Iterator[None]:
    with with_keys(KEY_A):
        yield


def test_a_worker_process_without_the_key_leaves_the_run_for_one_with_it(
    encrypted: None, worker_process: Callable[..., WorkerProcess]
) -> None:
    sv.start_workflow(codec_workflows.wait, {"secret": SECRET}, instance_id="proc-key-1")
    sv.signal("proc-key-1", "go", SECRET)
    keyless = worker_process("--worker-id", "keyless", env=keys_env(KEY_B))
    wait_until(
        lambda: any(
            w["worker_id"] == "keyless"
            and {"instance_id": "proc-key-1", "key_id": fernet_key_id(KEY_A)} in w["undecodable"]
            for w in status_report()["workers"]
        )
    )
    instance = WorkflowInstance.objects.get(instance_id="proc-key-1")
    assert instance.status == "running" and instance.lease_epoch == 1
    assert not HistoryEvent.objects.filter(instance_id="proc-key-1").exists()
    worker_process("--worker-id", "keyed", env=keys_env(KEY_A))
    result = sv.wait_workflow("proc-key-1", timeout=30)
    assert result.output == {"input": {"secret": SECRET}, "payload": SECRET}
    assert keyless.proc.poll() is None  # it never failed either
    assert WorkflowInstance.objects.get(instance_id="proc-key-1").lease_epoch == 2


def rotate_process(*keys: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": str(ROOT),
        **keys_env(*keys),
    }
    if connection.vendor == "postgresql":
        env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runselvedge", "rotate-keys", "--batch", "1", "-v", "2"],
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def under(key: str) -> int:
    marker = f'"key":"{fernet_key_id(key)}"'
    return HistoryEvent.objects.filter(data__contains=marker).count()


def test_rotate_keys_killed_half_way_leaves_every_value_readable_and_resumes(
    tdb: None,
) -> None:
    ids = [f"rot-proc-{n}" for n in range(30)]
    with with_keys(KEY_A):
        for iid in ids:
            sv.start_workflow(codec_workflows.wait, {"secret": SECRET}, instance_id=iid)
            sv.signal(iid, "go", SECRET)
        run_until_idle(Worker())
    before = under(KEY_A)
    assert before >= 30
    proc = rotate_process(KEY_B, KEY_A)
    assert proc.stdout is not None
    seen = ""
    while "so far" not in seen or under(KEY_B) == 0:
        seen = proc.stdout.readline()
        assert seen, "rotate-keys ended before it was killed"
    proc.kill()
    proc.wait(10)
    proc.stdout.close()
    assert under(KEY_B) > 0 and under(KEY_A) > 0  # killed half-way
    with with_keys(KEY_B, KEY_A):
        for iid in ids:  # every value readable, old key or new
            assert sv.get_workflow_result(iid).output == {
                "input": {"secret": SECRET},
                "payload": SECRET,
            }
    again = rotate_process(KEY_B, KEY_A)
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    assert out.strip().splitlines()[-1].startswith("re-encrypted ")
    assert under(KEY_A) == 0 and under(KEY_B) == before
    with with_keys(KEY_B):
        for iid in ids:
            sv.replay_instance(iid)
