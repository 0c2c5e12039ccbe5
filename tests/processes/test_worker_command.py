"""``runselvedge worker`` as a real process: its banner, and ``--reload`` restarting it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import pytest
from django.db import connection

from tests.conftest import ROOT


def test_the_worker_prints_what_it_serves(worker_process: Any) -> None:
    proc = worker_process("--queues", "a,b")
    banner = [proc.proc.stdout.readline().rstrip("\n") for _ in range(4)]
    assert banner[0].startswith("  database: default (")
    assert banner[1].startswith("  workflows: ") and "act.run" in banner[1].split(", ")
    assert banner[2].startswith("  activities: ") and "act.step" in banner[2].split(", ")
    assert banner[3] == "  queues: a, b"
    assert proc.terminate() == 0


@pytest.mark.slow
def test_worker_reload_restarts_on_a_code_change_and_stops_gracefully(
    tdb: None, tmp_path: Path
) -> None:
    probe = tmp_path / "reload_probe.py"
    probe.write_text('"""A module the worker imports, so the reloader watches it."""\n')
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "SELVEDGE_TEST_OVERRIDES": json.dumps({"MODULES": ["reload_probe"]}),
    }
    if connection.vendor == "postgresql":
        env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "runselvedge", "worker", "--reload"],
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the reloader's parent and child, signalled together
    )
    assert proc.stdout is not None
    lines: list[str] = []
    queue: Queue[str] = Queue()
    reader = threading.Thread(
        target=lambda: [queue.put(line) for line in proc.stdout],  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()

    def read_until(fragment: str, timeout: float = 30, meanwhile: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = queue.get(timeout=0.5)
            except Empty:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no {fragment!r} line; output:\n{''.join(lines)}")
                if meanwhile is not None:
                    meanwhile()
                continue
            lines.append(line)
            if fragment in line:
                return

    def save_probe() -> None:
        # What saving the file in an editor does. Again and again: the reloader only
        # compares with the times it saw on its first look, which may come later.
        later = probe.stat().st_mtime + 1
        os.utime(probe, (later, later))

    try:
        read_until(" started")
        first = lines[-1].split()[2]
        read_until("  queues: ")
        read_until(f"selvedge worker {first} stopped", meanwhile=save_probe)
        read_until(" started")
        second = lines[-1].split()[2]
        assert second != first  # a new process, with an id of its own
        # SIGTERM to the reloading child (the reloader's parent would kill it at once,
        # as it does runserver's): the worker stops gracefully and the parent exits too.
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        os.kill(int(children[0]), signal.SIGTERM)
        read_until(f"selvedge worker {second} stopped")
        assert proc.wait(30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        reader.join(10)
        proc.stdout.close()
    text = "".join(lines)
    assert text.count(" started") == 2, text
    assert text.index(f"{first} stopping") < text.index(f"{first} stopped"), text
