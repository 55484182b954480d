"""A throw-away PostgreSQL cluster for the tests and the review bench: initdb in a temp
dir, started on a free loopback port (unix sockets in the temp dir too), one database per
test, stopped at the end.

The server binaries come from ``$PG_BINDIR``, else ``pg_ctl`` on ``PATH``, else the
newest ``/usr/lib/postgresql/*/bin`` (Debian's layout; ``make sysdeps`` installs it).
initdb refuses to run as root: as root the cluster runs as the ``postgres`` system user.
A missing PostgreSQL is an error, never a skip.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from hil.loopback import free_port

HOST = "127.0.0.1"
SUPERUSER = "postgres"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30
INITDB_TIMEOUT_S = 120

# A test cluster trades durability for speed; the benchmark passes durable=True.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def pg_bindir() -> Path:
    """The directory holding initdb and pg_ctl."""
    env = os.environ.get("PG_BINDIR")
    if env:
        return Path(env)
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if not found:
        raise RuntimeError("PostgreSQL is not installed (no initdb): run `make sysdeps`")
    return found[-1].parent


@dataclass
class PgCluster:
    """A running PostgreSQL cluster on ``HOST:port``; trust authentication, loopback only."""

    workdir: Path
    port: int = 0
    durable: bool = False
    bindir: Path = field(default_factory=pg_bindir)
    _names: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def datadir(self) -> Path:
        return self.workdir / "data"

    def _run(self, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", SUPERUSER, "--", *cmd]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, check=False, cwd="/"
        )

    def init(self) -> None:
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SUPERUSER)
            os.chown(self.workdir, owner.pw_uid, owner.pw_gid)
        done = self._run(
            "initdb", "-D", str(self.datadir), "-U", SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync", timeout_s=INITDB_TIMEOUT_S,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr[-2000:]}")

    def start(self, attempts: int = 3) -> None:
        settings = {} if self.durable else FAST_SETTINGS
        last = ""
        for _ in range(attempts):  # another process may take the free port first
            self.port = free_port(HOST)
            opts = [
                f"-p {self.port}",
                f"-k {self.workdir}",
                f"-c listen_addresses={HOST}",
                *(f"-c {k}={v}" for k, v in settings.items()),
            ]
            done = self._run(
                "pg_ctl", "-D", str(self.datadir), "-l", str(self.workdir / "server.log"),
                "-o", " ".join(opts), "-w", "-t", str(START_TIMEOUT_S), "start",
                timeout_s=START_TIMEOUT_S + 10,
            )  # fmt: skip
            if done.returncode == 0:
                return
            last = done.stderr + self.log_tail()
        raise RuntimeError(f"PostgreSQL did not start: {last[-2000:]}")

    def stop(self) -> None:
        if not (self.datadir / "postmaster.pid").exists():
            return
        done = self._run(
            "pg_ctl", "-D", str(self.datadir), "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S),
            "stop", timeout_s=STOP_TIMEOUT_S + 10,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not stop: {done.stderr[-2000:]}")

    def log_tail(self) -> str:
        log = self.workdir / "server.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def admin_dsn(self, dbname: str = "postgres") -> str:
        return f"host={HOST} port={self.port} user={SUPERUSER} dbname={dbname} connect_timeout=10"

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@{HOST}:{self.port}/{dbname}"

    def create_database(self, prefix: str = "test", template: str = "template0") -> str:
        """A new database, empty or a copy of the database ``template`` (which no session
        may be connected to); returns its SQLAlchemy URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_cluster(durable: bool = False) -> PgCluster:
    """initdb + start in a fresh temp dir (under the system temp dir, which the
    ``postgres`` user can reach when we are root)."""
    workdir = Path(tempfile.mkdtemp(prefix="edgefleet-pg-"))
    cluster = PgCluster(workdir, durable=durable)
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return cluster


def stop_cluster(cluster: PgCluster) -> None:
    """Stop the cluster and remove its directory."""
    try:
        cluster.stop()
    finally:
        shutil.rmtree(cluster.workdir, ignore_errors=True)
