"""A real PgBouncer (Debian's ``pgbouncer`` package) in front of this machine's PostgreSQL,
in transaction pooling mode, for the herd benchmark and the tests.

:class:`PgBouncer` writes a configuration into a new directory, starts ``pgbouncer`` on a free
loopback port (as the ``postgres`` user when run as root: PgBouncer refuses to run as root) and
stops it on :meth:`stop`. Every database name is passed through to the server (``* =``), so a
URL ``postgresql+psycopg://postgres@127.0.0.1:<port>/<db>`` reaches database ``<db>`` of the
server behind it. :meth:`stop` then :meth:`start` restart it on the same port (what a client sees
of a server restart: ``connection refused``, then service again).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

#: Where Debian installs it.
CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def binary() -> str | None:
    """The ``pgbouncer`` executable, or ``None`` where it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One PgBouncer process: ``pool_size`` server connections per database and user,
    ``max_client_conn`` clients, transaction pooling, trust authentication for ``user``.

    Raises ``RuntimeError`` when ``pgbouncer`` is missing or does not start."""

    def __init__(self, *, server_host: str = "127.0.0.1", server_port: int = 5432, user: str = "postgres",
                 pool_size: int = 10, max_client_conn: int = 2000) -> None:
        exe = binary()
        if exe is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.exe = exe
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="cachedb-pgbouncer-"))
        self.dir.chmod(0o755)  # PgBouncer runs as postgres when we are root
        (self.dir / "users.txt").write_text(f'"{user}" ""\n')
        self.ini = self.dir / "pgbouncer.ini"
        self.ini.write_text(
            "[databases]\n"
            f"* = host={server_host} port={server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            f"max_client_conn = {max_client_conn}\n"
            "query_wait_timeout = 10\n"
            "server_login_retry = 1\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        for f in self.dir.iterdir():
            f.chmod(0o644)
        self.pool_size = pool_size
        self.user = user
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 10.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        cmd = [self.exe, str(self.ini)]
        if os.geteuid() == 0:
            cmd[1:1] = ["-u", "postgres"]
        self._log = open(self.dir / "pgbouncer.log", "ab")
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start: {(self.dir / 'pgbouncer.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on port {self.port} within {timeout_s:.0f} s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()  # SIGTERM: immediate shutdown
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
