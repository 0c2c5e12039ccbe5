"""``db_worker --batch`` for SelvedgeBackend: run the worker's loops until nothing is
left to do, then exit 0 (``python -m tests.conformance.batch --worker-id ID``).

django-tasks-db's process tests start ``db_worker --batch`` and wait for it to exit;
``runselvedge worker`` has no batch mode, so this runs the same worker loops in the
process's own thread (``selvedge_django.testing.run_until_idle``), as a batch does.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-id", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.conformance.settings")
    import django

    django.setup()
    from selvedge_django.testing import run_until_idle
    from selvedge_django.worker import Worker

    overrides = {"worker_id": args.worker_id} if args.worker_id else {}
    run_until_idle(Worker(**overrides))
    print("No more tasks to run - exiting gracefully.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
