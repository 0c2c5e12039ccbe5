"""A real pgbouncer in transaction mode in front of a PostgreSQL server, for one run.

``tests/processes/test_pgbouncer.py`` puts one in front of the test database; the scale-out
benchmark (``bench/scale_out.py``) puts one in front of its own. ``Bouncer`` runs Debian's
``pgbouncer`` (``SELVEDGE_PGBOUNCER`` names another binary) on a free loopback port with a
generated configuration that sends every database name to the given server, in
transaction pooling mode with ``pool_size`` server connections per database and user. As
root it runs pgbouncer as the ``postgres`` account (pgbouncer refuses to run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["PGBOUNCER", "Bouncer"]

PGBOUNCER = os.environ.get("SELVEDGE_PGBOUNCER") or shutil.which("pgbouncer")
if PGBOUNCER is None and os.path.exists("/usr/sbin/pgbouncer"):
    PGBOUNCER = "/usr/sbin/pgbouncer"


class Bouncer:
    """A pgbouncer process in transaction mode in front of ``host:port``."""

    def __init__(
        self,
        *,
        host: str,
        port: int | str,
        user: str,
        password: str = "",
        dbname: str,
        pool_size: int = 8,
        max_client_conn: int = 1000,
    ) -> None:
        if PGBOUNCER is None:
            raise RuntimeError("no pgbouncer (Debian's pgbouncer package; SELVEDGE_PGBOUNCER)")
        self.dbname = dbname
        self.user = user
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        # pgbouncer refuses to run as root: as root it is told to switch to the
        # server's own account, which must be able to read and write this folder.
        self.dir = Path(tempfile.mkdtemp(prefix="selvedge-pgbouncer-"))
        self.dir.chmod(0o777)
        target = f"host={host or '127.0.0.1'} port={port or 5432} user={user}"
        if password:
            target += f" password={password}"
        self.ini = self.dir / "pgbouncer.ini"
        self.ini.write_text(
            "[databases]\n"
            f"* = {target}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            f"admin_users = {user}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            f"max_client_conn = {max_client_conn}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
        )
        self.ini.chmod(0o644)
        command = [str(PGBOUNCER)]
        if os.geteuid() == 0:
            account = "postgres"
            try:
                pwd.getpwnam(account)
            except KeyError:
                account = "nobody"
            command += ["-u", account]
        self.proc = subprocess.Popen(
            [*command, str(self.ini)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 20
        while not self._answers():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("pgbouncer did not answer within 20 s")
            time.sleep(0.1)

    def connect(self, dbname: str) -> Any:
        """A psycopg connection through the pool (``pgbouncer``: the admin console)."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            dbname=dbname,
            user=self.user,
            autocommit=True,
            connect_timeout=5,
        )

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            log = (self.dir / "pgbouncer.log").read_text(errors="replace")
            raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}):\n{log}")
        try:
            with self.connect(self.dbname) as conn:
                conn.execute("SELECT 1")
            return True
        except Exception:
            return False

    def show(self, what: str) -> list[dict[str, Any]]:
        """Rows of an admin console ``SHOW`` (STATS, POOLS, CLIENTS, SERVERS) as dicts."""
        with self.connect("pgbouncer") as conn:
            cursor = conn.execute(f"SHOW {what}")
            columns = [c.name for c in cursor.description]
            return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]

    def transactions(self) -> int:
        """Transactions pgbouncer passed to the database so far (``SHOW STATS``)."""
        for stats in self.show("STATS"):
            if stats["database"] == self.dbname:
                return int(stats["total_xact_count"])
        return 0

    def stop(self) -> None:
        """Stop pgbouncer and delete its folder."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
