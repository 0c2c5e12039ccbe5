"""Soak: a mixed workload on real worker processes, killed with SIGKILL at random moments.

    python bench/soak.py --minutes 30 --kill-every 20 --restart-postgres 2 --hold-signals 15
    python bench/soak.py --minutes 30 --kill-every 20              # PostgreSQL
    python bench/soak.py --db sqlite --minutes 5 --kill-every 10
    python bench/soak.py --minutes 2 --workers 3 --in-flight 40 --keep
    python bench/soak.py --minutes 5 --workers 3 --workflow-only 1

Not part of CI. It runs from the repository root with the project's virtualenv
and the test settings (``tests/settings.py``, which register the ``fault.*``
workflows of ``tests/testapp/workflows/``) on a database of its own: a fresh
PostgreSQL database ``selvedge_soak_<pid>`` (dropped at the end unless
``--keep``) or a SQLite file in a temporary directory.

``--workers`` worker processes (``manage.py runselvedge worker``) run
``fault.flow``: an inline activity, a retried one, a timer, two signals (one
with a timeout), a child workflow and a cancelled scope. The driver keeps
``--in-flight`` instances going, sends the second signal of each a little after
its start, and every ``--kill-every`` seconds (give or take half) kills one
worker with SIGKILL at a random moment and starts a replacement. Workers hold
leases and claims for ``--lease`` seconds, so the survivors take over soon.
``--workflow-only N`` makes the last N workers serve no activity queue: the
activities of the workflows they run become background steps (the reservation
releases the lease; another worker claims the task, completes it and wakes the
workflow).

``--restart-postgres N`` restarts the PostgreSQL server N times, evenly spread
over the run (``pg_ctlcluster ... restart`` of the cluster listening on
``SELVEDGE_PG_PORT``; point that at a cluster of its own when others share the
machine). ``--hold-signals S`` adds a client thread that sends some second
signals inside ``transaction.atomic()`` and keeps that transaction open for S
seconds before committing, as a slow web request would: the instance row stays
locked meanwhile, and no other workflow may lose its leases or claims for it.

After ``--minutes`` it stops starting and killing, waits (up to ``--drain``
seconds) for every started workflow to close, stops the workers and audits each
instance (``tests/testapp/audit.py``): *lost* (not completed) or *doubled*
(completed, but with a second close, a second child, a signal consumed twice,
an attempt run twice, a wrong output or a history that no longer replays). It
prints a verdict and exits 0 only when nothing was lost or doubled.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(
        host=os.environ.get("SELVEDGE_PG_HOST", "127.0.0.1"),
        port=os.environ.get("SELVEDGE_PG_PORT", "5432"),
        user=os.environ.get("SELVEDGE_PG_USER", "postgres"),
        password=os.environ.get("SELVEDGE_PG_PASSWORD", ""),
        dbname="postgres",
        autocommit=True,
        connect_timeout=5,
    ) as conn:
        conn.execute(sql)


def pg_cluster_command(action: str) -> list[str]:
    """``pg_ctlcluster`` for the local cluster on ``SELVEDGE_PG_PORT``."""
    port = os.environ.get("SELVEDGE_PG_PORT", "5432")
    if shutil.which("pg_lsclusters") is None:
        raise SystemExit("--restart-postgres needs Debian's pg_lsclusters and pg_ctlcluster")
    listing = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
    ).stdout
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == port:
            return ["pg_ctlcluster", "--skip-systemctl-redirect", fields[0], fields[1], action]
    raise SystemExit(f"no local PostgreSQL cluster listens on port {port}")


def restart_postgres() -> float:
    """Restart the server (fast shutdown: every connection is cut); return the seconds it took."""
    began = time.monotonic()
    subprocess.run(pg_cluster_command("restart"), check=True, capture_output=True)
    return time.monotonic() - began


class WorkerProc:
    """One ``runselvedge worker`` process, its output in a log file."""

    def __init__(self, name: str, log_dir: Path, threads: int, *, serves: bool = True) -> None:
        self.name = name
        self.log = open(log_dir / f"{name}.log", "a")  # noqa: SIM115 - closed in stop()
        command = ["runselvedge", "worker", "--worker-id", name]
        command += ["--max-activities", str(threads), "--max-resumptions", str(threads)]
        if not serves:
            command += ["--queues", ""]  # workflows only: its steps go to the other workers
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", *command],
            cwd=str(ROOT),
            env=os.environ.copy(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self.log.close()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()
        return self.proc.returncode


def configure(args: argparse.Namespace, work_dir: Path) -> str:
    """Point this process and the workers at a fresh database; return its name."""
    run_id = f"soak{os.getpid()}"
    lease = args.lease
    overrides = {
        "LEASE": {
            "TTL": lease,
            "RENEW_INTERVAL": lease / 4,
            "MARGIN": lease / 4,
            "MAX_SKEW": lease / 8,
        },
        "LEADER_LEASE_DURATION": lease,
        "LEADER_HEARTBEAT_INTERVAL": lease / 4,
        # The default queue only: the cancelled scope's task (fault.parked) stays unserved.
        "ACTIVITY_QUEUES": [""],
    }
    os.environ.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT),
        SELVEDGE_TEST_DB=args.db,
        SELVEDGE_TEST_SUBPROCESS="1",
        SELVEDGE_RUN_ID=run_id,
        SELVEDGE_SQLITE_DIR=str(work_dir),
        SELVEDGE_PG_TEST_NAME=f"selvedge_{run_id}",
        SELVEDGE_TEST_OVERRIDES=json.dumps(overrides),
    )
    sys.path.insert(0, str(ROOT))
    name = f"selvedge_{run_id}"
    if args.db == "postgres":
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _pg_admin(f'CREATE DATABASE "{name}"')
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    return name


def drive(args: argparse.Namespace, log_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """Run the workload for ``--minutes``, killing workers; drain; return the ids started."""
    from django.db import DatabaseError, connections, transaction

    import selvedge_django as sv
    from selvedge_django.models import SignalMessage, WorkflowInstance

    rng = random.Random(args.seed)

    def serves(n: int) -> bool:
        return n < args.workers - args.workflow_only

    workers = [
        WorkerProc(f"soak-{n}-0", log_dir, args.threads, serves=serves(n))
        for n in range(args.workers)
    ]
    generation = [0] * args.workers
    started: list[str] = []
    running: set[str] = set()
    unsignalled: dict[str, float] = {}
    uncertain: set[str] = set()  # starts whose commit the driver did not see
    kills = 0
    db_errors = 0
    restarts: list[float] = []
    held: list[float] = []  # seconds each held signal transaction stayed open
    lock = threading.Lock()  # guards ``unsignalled`` between the driver and the holder
    finished = threading.Event()
    began = time.monotonic()
    deadline = began + args.minutes * 60
    next_kill = began + args.kill_every * rng.uniform(0.5, 1.5)
    next_report = began + 60
    restart_at = [
        began + args.minutes * 60 * (n + 1) / (args.restart_postgres + 1)
        for n in range(args.restart_postgres)
    ]

    def settle() -> None:
        """Learn the outcome of uncertain starts and signals, and which workflows closed."""
        nonlocal running
        for iid in list(uncertain):
            if WorkflowInstance.objects.filter(instance_id=iid).exists():
                started.append(iid)
                running.add(iid)
                with lock:
                    unsignalled[iid] = time.monotonic()
            uncertain.discard(iid)
        closed = set(
            WorkflowInstance.objects.filter(instance_id__in=list(running))
            .exclude(status="running")
            .values_list("instance_id", flat=True)
        )
        running -= closed

    def take(ids: list[str]) -> list[str]:
        """Take due second signals off the list, so only one sender sends each."""
        with lock:
            return [iid for iid in ids if unsignalled.pop(iid, None) is not None]

    def send_second(iid: str) -> None:
        # A second signal whose commit was not seen must not be sent twice.
        try:
            if not SignalMessage.objects.filter(instance_id=iid, payload="2").exists():
                sv.signal(iid, "go", 2)
        except BaseException:
            with lock:
                unsignalled[iid] = time.monotonic()  # committed or not: checked next time
            raise

    def hold_signals() -> None:
        """Send second signals in transactions held open for ``--hold-signals`` seconds."""
        nonlocal db_errors
        while not finished.is_set():
            with lock:
                due = [iid for iid, when in unsignalled.items() if when <= time.monotonic()]
                iid = due[0] if due else None
                if iid is not None:
                    del unsignalled[iid]
            if iid is None:
                finished.wait(0.2)
                continue
            opened = time.monotonic()
            try:
                with transaction.atomic():
                    if not SignalMessage.objects.filter(instance_id=iid, payload="2").exists():
                        sv.signal(iid, "go", 2)
                    finished.wait(args.hold_signals)
                held.append(time.monotonic() - opened)
            except DatabaseError as error:
                # Committed or not, the driver finds out: it checks before it sends.
                with lock:
                    db_errors += 1
                    unsignalled[iid] = time.monotonic()
                print(f"  holder: database error, retrying: {error}".rstrip(), flush=True)
                connections.close_all()
                finished.wait(1)
        connections.close_all()

    def round_of_work(now: float) -> None:
        while len(running) < args.in_flight:
            iid = f"soak-{uuid.uuid4().hex[:12]}"
            uncertain.add(iid)
            with transaction.atomic():
                sv.start_workflow(
                    "fault.flow", {"tag": iid, "sleep": rng.uniform(0, 1)}, instance_id=iid
                )
                sv.signal(iid, "go", 1)
            uncertain.discard(iid)
            started.append(iid)
            running.add(iid)
            with lock:
                unsignalled[iid] = now + rng.uniform(0, 1.5)
        with lock:
            due = [iid for iid, when in unsignalled.items() if when <= now]
        # With a holder running, every other due signal goes through it, one at a time,
        # unless more than half the workflows in flight wait for one: then the driver sends.
        if args.hold_signals and len(due) <= args.in_flight // 2:
            due = []
        for iid in take(due):
            send_second(iid)
        settle()

    def tolerant(work: Any, *args_: Any) -> None:
        """The driver is a client too: ride out database errors (a restart, no free slot)."""
        nonlocal db_errors
        try:
            work(*args_)
        except DatabaseError as error:
            with lock:
                db_errors += 1
            print(f"  driver: database error, retrying: {error}".rstrip(), flush=True)
            connections.close_all()
            time.sleep(1)

    holder = threading.Thread(target=hold_signals, name="soak-holder", daemon=True)
    if args.hold_signals:
        holder.start()
    try:
        while time.monotonic() < deadline:
            now = time.monotonic()
            tolerant(round_of_work, now)
            if restart_at and now >= restart_at[0]:
                restart_at.pop(0)
                took = restart_postgres()
                restarts.append(took)
                print(f"  PostgreSQL restarted ({took:.1f} s)", flush=True)
            if now >= next_kill:
                victim = rng.randrange(args.workers)
                workers[victim].kill()
                kills += 1
                generation[victim] += 1
                name = f"soak-{victim}-{generation[victim]}"
                workers[victim] = WorkerProc(name, log_dir, args.threads, serves=serves(victim))
                next_kill = now + args.kill_every * rng.uniform(0.5, 1.5)
            if now >= next_report:
                print(
                    f"  {int((now - began) / 60)} min: {len(started)} started, "
                    f"{len(started) - len(running)} closed, {kills} kills",
                    flush=True,
                )
                next_report += 60
            time.sleep(0.1)
        finished.set()
        if holder.is_alive():
            holder.join(args.hold_signals + 60)
        drain_until = time.monotonic() + args.drain
        while (running or unsignalled or uncertain) and time.monotonic() < drain_until:
            with lock:
                pending = list(unsignalled)
            for iid in take(pending):
                tolerant(send_second, iid)
            tolerant(settle)
            time.sleep(0.5)
    finally:
        finished.set()
        statuses = [w.stop() for w in workers]
    return started, {
        "kills": kills,
        "exit_statuses": statuses,
        "db_errors": db_errors,
        "restarts": restarts,
        "held": held,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds, on average")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--in-flight", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=4, help="execution and activity threads per worker"
    )
    parser.add_argument(
        "--workflow-only",
        type=int,
        default=0,
        metavar="N",
        help="the last N workers serve no activity queue: their workflows' steps run as"
        " background steps on the others",
    )
    parser.add_argument("--lease", type=float, default=4.0, help="lease and claim TTL, seconds")
    parser.add_argument("--drain", type=float, default=180.0, help="seconds to let work finish")
    parser.add_argument(
        "--restart-postgres",
        type=int,
        default=0,
        metavar="N",
        help="restart the PostgreSQL server N times, evenly spread over the run",
    )
    parser.add_argument(
        "--hold-signals",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="a client sends second signals in transactions it holds open this long",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    args = parser.parse_args(argv)
    if min(args.workers, args.in_flight, args.threads) < 1:
        parser.error("--workers, --in-flight and --threads must be at least 1")
    if not 0 <= args.workflow_only < args.workers:
        parser.error("--workflow-only must leave at least one worker serving activities")
    if args.restart_postgres < 0 or args.hold_signals < 0:
        parser.error("--restart-postgres and --hold-signals cannot be negative")
    if args.restart_postgres and args.db != "postgres":
        parser.error("--restart-postgres needs --db postgres")
    if args.restart_postgres:
        pg_cluster_command("status")  # fail now, not half-way, when there is no cluster

    work_dir = Path(tempfile.mkdtemp(prefix="selvedge-soak-"))
    name = configure(args, work_dir)
    print(
        f"soak: {args.db} database {name}, {args.minutes:g} minutes, {args.workers} workers "
        f"({args.threads} + {args.threads} threads), "
        f"{args.in_flight} workflows in flight, one worker killed (SIGKILL) about every "
        f"{args.kill_every:g} s, lease {args.lease:g} s, PostgreSQL restarts: "
        f"{args.restart_postgres}, signal transactions held: {args.hold_signals:g} s; "
        f"logs in {work_dir}",
        flush=True,
    )
    began = time.monotonic()
    try:
        started, stats = drive(args, work_dir)
        from tests.testapp.audit import audit

        result = audit(started)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep and args.db == "postgres":
            _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    elapsed = time.monotonic() - began
    print(
        f"ran {elapsed / 60:.1f} minutes, {stats['kills']} workers killed with SIGKILL, "
        f"{stats['db_errors']} database errors seen by the driver"
    )
    if stats["restarts"]:
        print(
            f"PostgreSQL restarted {len(stats['restarts'])} times ("
            + ", ".join(f"{took:.1f} s" for took in stats["restarts"])
            + ")"
        )
    if stats["held"]:
        print(
            f"{len(stats['held'])} signal transactions held open, "
            f"{min(stats['held']):.1f}-{max(stats['held']):.1f} s each"
        )
    print(
        "activity attempts: "
        + ", ".join(f"{name} {count}" for name, count in sorted(result.attempts.items()))
    )
    print(result.summary())
    for iid, why in list(result.lost.items())[:20]:
        print(f"  lost {iid}: {why}")
    for iid, problems in list(result.doubled.items())[:20]:
        print(f"  doubled {iid}: {'; '.join(problems)}")
    print(f"verdict: {'PASS' if result.ok else 'FAIL'}")
    if not args.keep and result.ok:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
