"""A throwaway PostgreSQL cluster for tests and benchmarks.

``Cluster`` runs ``initdb`` and ``pg_ctl`` from the server binaries on this
machine (``PATH`` first, then Debian's ``/usr/lib/postgresql/<N>/bin``) in a
temporary directory, listening on a free port on 127.0.0.1 only, with
password (scram-sha-256) authentication so the tests can get it wrong.  The
server refuses to run as root: when we are root, the commands run as the
``postgres`` OS user through ``runuser``.

``find_binaries()`` returns None when no server can be found at all; the
tests skip with that reason then, and only then.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PASSWORD", "USER", "Cluster", "find_binaries", "free_port"]

USER = "postgres"
PASSWORD = "s3cret-for-tests"
SERVER_USER = "postgres"  # the OS user the server runs as when we are root


def find_binaries() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    initdb = shutil.which("initdb")
    if initdb is not None and shutil.which("pg_ctl") is not None:
        return Path(os.path.realpath(initdb)).parent
    candidates = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    candidates.sort(key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    for initdb in reversed(candidates):
        bindir = Path(initdb).parent
        if (bindir / "pg_ctl").exists() and (bindir / "postgres").exists():
            return bindir
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A private PostgreSQL cluster: ``start()``, ``stop()``, ``dsn()``, ``destroy()``.

    Args:
        bindir: where the server binaries are (``find_binaries()``).
        fsync: keep the server's fsync on (benchmarks compare durable
            writes); tests turn it off, which changes nothing they check
            (a killed process, not a power cut).
        parent: the directory to make the cluster's directory in (the
            system's temp directory by default); the ``postgres`` user must
            be able to reach it.
    """

    def __init__(self, bindir: Path, *, fsync: bool = True, parent: str | None = None) -> None:
        self.bindir = bindir
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="checkpointer-pg-", dir=parent))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.running = False
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.root, SERVER_USER)
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_root:
            shutil.chown(pwfile, SERVER_USER)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        )
        pwfile.unlink()

    def _run(self, tool: str, *args: str, timeout: float = 60) -> str:
        cmd = [str(self.bindir / tool), *args]
        if self._as_root:
            cmd = ["runuser", "-u", SERVER_USER, "--", *cmd]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.root
        )
        if proc.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}\n{log}")
        return proc.stdout

    def start(self) -> None:
        """Start the server (on the same port every time) and wait until it accepts."""
        options = " ".join(
            [
                f"-p {self.port}",
                f"-k {self.root}",
                "-c listen_addresses=127.0.0.1",
                "-c max_connections=60",
                f"-c fsync={'on' if self.fsync else 'off'}",
                f"-c synchronous_commit={'on' if self.fsync else 'off'}",
                "-c full_page_writes=off" if not self.fsync else "",
            ]
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` disconnects clients; ``immediate`` is a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
        self.running = False

    def dsn(self, *, dbname: str = "postgres", user: str = USER, password: str = PASSWORD) -> str:
        """A libpq connection string for this cluster."""
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user} password={password}"

    def destroy(self) -> None:
        """Stop the server if it runs and remove every file of the cluster."""
        with contextlib.suppress(Exception):
            if self.running:
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
