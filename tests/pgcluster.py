"""A throwaway PostgreSQL cluster of a test's own, for tests that stop or restart the server.

The machine's cluster is shared with whatever else runs beside the suite (another test
pass, a developer's psql): a test that restarts, stops or reconfigures PostgreSQL does it
to a cluster it made itself. ``PrivateCluster`` runs ``initdb`` into a temporary folder
and ``pg_ctl`` on a free loopback port, with the server binaries of the installed
PostgreSQL; as root (CI) it runs them as the ``postgres`` user, since the server refuses
to run as root. ``private_database`` points Django's default connection at a migrated
database on such a cluster for the length of one test, so the test's own queries and the
worker processes it starts (through ``SELVEDGE_PG_HOST``/``SELVEDGE_PG_PORT``) use it.
``streaming_replica`` makes a hot standby of such a cluster (``pg_basebackup -R``: a copy
of its data folder with ``standby.signal`` and the primary's address), which replays the
primary's WAL as it streams in, and whose replay a test may pause to make it lag.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def server_bin_dir() -> Path | None:
    """The newest installed PostgreSQL server's ``bin`` folder, or None when none is."""
    found = shutil.which("initdb")
    if found:
        # Through a symlink on PATH (/usr/local/bin/initdb), to the folder of the rest.
        return Path(found).resolve().parent
    base = Path("/usr/lib/postgresql")
    if not base.is_dir():
        return None
    versions = sorted(
        (p for p in base.iterdir() if (p / "bin" / "initdb").exists()),
        key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()],
    )
    return versions[-1] / "bin" if versions else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The server settings of a test's cluster: durability off (a throwaway cluster), few
# connections. A benchmark's cluster (bench/scale_out.py) overrides them.
TEST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "60",
}


class PrivateCluster:
    """One PostgreSQL server of the test's own: ``start``, ``restart``, ``stop``, ``remove``.

    ``settings`` (server settings, ``-c name=value``) are added to, or override,
    :data:`TEST_SETTINGS`.
    """

    def __init__(self, bin_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        self.bin_dir = bin_dir
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self.port = _free_port()
        self.host = "127.0.0.1"
        self.root = Path(tempfile.mkdtemp(prefix="selvedge-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        # As root the server binaries run as postgres, which must own the folder.
        self._as: list[str] = []
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [*self._as, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n{log}"
            )

    def init_standby_of(self, primary: PrivateCluster) -> None:
        """Fill the data folder with a base backup of ``primary`` that starts as its
        streaming standby (``standby.signal``, ``primary_conninfo``)."""
        self._run(
            str(self.bin_dir / "pg_basebackup"),
            "-h",
            primary.host,
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(self.data),
            "--write-recovery-conf",
            "--wal-method=stream",
            "--checkpoint=fast",
            "--no-sync",
        )

    def init(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def _pg_ctl(self, action: str) -> None:
        options = f"-p {self.port} -c listen_addresses={self.host} -k {self.root}"
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "-m",
            "fast",
            action,
        )

    def start(self) -> None:
        self._pg_ctl("start")

    def restart(self) -> None:
        self._pg_ctl("restart")

    def stop(self) -> None:
        self._pg_ctl("stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        """Stop the server (if it runs) and delete its folder."""
        try:
            if self.running():
                self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def connect_params(self, dbname: str = "postgres") -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": "postgres", "dbname": dbname}


@contextmanager
def private_cluster(settings: Mapping[str, str] | None = None) -> Iterator[PrivateCluster]:
    """A started cluster (``settings`` as :class:`PrivateCluster` takes them), stopped and
    deleted afterwards."""
    bin_dir = server_bin_dir()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl) installed")
    cluster = PrivateCluster(bin_dir, settings)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@contextmanager
def streaming_replica(primary: PrivateCluster) -> Iterator[PrivateCluster]:
    """A started hot standby of ``primary`` (a cluster of its own on another port), in
    recovery and answering reads; stopped and deleted afterwards.

    The primary's defaults allow it: ``wal_level = replica``, WAL senders, and the
    ``replication`` line ``initdb`` writes into ``pg_hba.conf`` for the loopback address.
    ``pg_ctl start -w`` returns once the standby accepts connections.
    """
    standby = PrivateCluster(primary.bin_dir)
    try:
        standby.init_standby_of(primary)
        standby.start()
        yield standby
    finally:
        standby.remove()


@contextmanager
def private_database(cluster: PrivateCluster) -> Iterator[None]:
    """Point Django's default connection (and worker processes) at a migrated database there.

    The database takes the name of the test database, so worker processes that open
    ``SELVEDGE_PG_TEST_NAME`` find it; they reach the cluster through the
    ``SELVEDGE_PG_HOST``/``SELVEDGE_PG_PORT`` variables, set here for the block.
    """
    import psycopg
    from django.core.management import call_command
    from django.db import connections

    conn = connections["default"]
    name = str(conn.settings_dict["NAME"])
    with psycopg.connect(autocommit=True, **cluster.connect_params()) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    saved = {key: conn.settings_dict[key] for key in ("HOST", "PORT")}
    saved_env = {key: os.environ.get(key) for key in ("SELVEDGE_PG_HOST", "SELVEDGE_PG_PORT")}
    connections.close_all()
    conn.settings_dict.update(HOST=cluster.host, PORT=str(cluster.port))
    os.environ["SELVEDGE_PG_HOST"] = cluster.host
    os.environ["SELVEDGE_PG_PORT"] = str(cluster.port)
    try:
        call_command("migrate", run_syncdb=True, verbosity=0, interactive=False)
        yield
    finally:
        connections.close_all()
        conn.settings_dict.update(saved)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
