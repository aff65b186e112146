"""A real, throw-away PostgreSQL server for tests: Debian's binaries, own cluster.

::

    with TemporaryCluster.start() as cluster:
        url = cluster.create_database()   # a fresh, empty database per test
        store = PostgresStore.open(url)

The cluster lives in a temporary directory, listens only on a unix socket
there (no TCP port to collide with), and trusts local connections. PostgreSQL
refuses to run as root, so as root the cluster belongs to ``nobody``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

PG_ROOT = Path("/usr/lib/postgresql")


def pg_bin_dir() -> Path:
    """The newest installed server's ``bin`` (Debian: ``/usr/lib/postgresql/N/bin``)."""
    found = sorted(
        (p for p in PG_ROOT.glob("*/bin") if (p / "pg_ctl").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not found:
        raise RuntimeError("PostgreSQL server not installed (Debian package postgresql)")
    return found[-1]


class TemporaryCluster:
    def __init__(self, root: Path, user: str | None) -> None:
        self.root = root
        self.data = root / "data"
        self.socket_dir = root
        self.user = user
        self.bin = pg_bin_dir()

    def _run(self, *argv: str) -> None:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120, cwd=self.root)

    @classmethod
    def start(cls) -> TemporaryCluster:
        root = Path(tempfile.mkdtemp(prefix="podbay-pg-"))
        user = None
        if os.geteuid() == 0:
            user = "nobody"
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        cluster = cls(root, user)
        try:
            cluster._run(
                "initdb",
                "-D",
                str(cluster.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            )
            # Sockets only, in our directory; fsync off: a test cluster needs no durability.
            options = (
                f"-c listen_addresses='' -c unix_socket_directories='{root}'"
                " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
                " -c max_connections=200"
            )
            cluster._run(
                "pg_ctl",
                "-D",
                str(cluster.data),
                "-l",
                str(root / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            )
        except BaseException:
            cluster._remove()
            raise
        return cluster

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={quote(str(self.socket_dir), safe='')}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        return self.url(name)

    def restart(self) -> None:
        """Stop (every connection cut; ``fast`` keeps what was committed, which
        ``immediate`` would not with this cluster's settings) and start again."""
        # -l: the new server's output goes to the log, not to our pipes (which
        # would keep subprocess.run waiting for their end).
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-m",
            "fast",
            "-w",
            "-t",
            "60",
            "restart",
        )

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            self._remove()

    def _remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> TemporaryCluster:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
