"""A throw-away PostgreSQL cluster for the suite: initdb in a temp dir, a free port, its unix socket
in the same dir (no TCP listener, so no other user of the machine can reach it), stopped and removed
at the end of the session.

Tests that need it run; they are skipped only when HERMES_SUP_PG_TESTS=skip says so, and fail with
the reason when the server cannot start (a missing server is a broken machine, not a skipped test).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SKIP_ENV = "HERMES_SUP_PG_TESTS"
# initdb refuses to run as root; the Debian package creates this user for its own clusters.
SERVER_USER = "postgres"
START_TIMEOUT = 60


class PgServerError(RuntimeError):
    """The test server could not be found or started; the message says what to do."""


def find_bin_dir() -> Path | None:
    """Where initdb, pg_ctl and postgres live: PATH first, then the newest Debian install."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(candidates[-1]).parent if candidates else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PgServer:
    bin_dir: Path
    base: Path
    port: int
    user: str | None  # the system user the server runs as, when it is not us (we are root)
    max_connections: int = 200  # bench/scale_bench.py's 256 agents hold about two each

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def dsn(self) -> str:
        # The socket directory is the host; trust authentication, as the socket is reachable by us alone.
        return f"host={self.base} port={self.port} dbname=postgres user={self.db_user}"

    @property
    def db_user(self) -> str:
        return self.user or pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, *args: str, timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess[str]:
        kwargs: dict = {}
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        return subprocess.run([str(self.bin_dir / args[0]), *args[1:]], capture_output=True, text=True,
                              timeout=timeout, cwd=self.base, stdin=subprocess.DEVNULL, check=False, **kwargs)

    def _check(self, result: subprocess.CompletedProcess[str], what: str) -> None:
        if result.returncode != 0:
            raise PgServerError(f"{what} failed (exit {result.returncode}): {(result.stderr or result.stdout)[-2000:]}")

    def start(self) -> None:
        self._check(self._run("initdb", "-D", str(self.data), "--auth=trust", "--encoding=UTF8", "--no-locale",
                              "--no-sync", f"--username={self.db_user}"), "initdb")
        self._start()

    def _start(self) -> None:
        options = (f"-c listen_addresses='' -c port={self.port} -c unix_socket_directories='{self.base}' "
                   f"-c unix_socket_permissions=0700 -c max_connections={self.max_connections} -c fsync=on")
        self._check(self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "server.log"), "-w",
                              "-t", str(START_TIMEOUT), "-o", options, "start"), "pg_ctl start")

    def crash_and_start(self) -> None:
        """Stop as a crash does (immediate: no checkpoint, WAL not yet flushed is lost) and start
        again, through crash recovery."""
        self._check(self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop"),
                    "pg_ctl stop -m immediate")
        self._start()

    def restart(self) -> None:
        # -l: the server's output goes to its log, not to a pipe this process would wait on.
        self._check(self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "server.log"), "-m", "fast",
                              "-w", "-t", str(START_TIMEOUT), "restart"), "pg_ctl restart")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            result = self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop")
            if result.returncode != 0:
                _kill_postmaster(self.data)
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, size: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return (self.base / "server.log").read_text(errors="replace")[-size:]
        return ""


def _kill_postmaster(data: Path) -> None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 9)


def start_server(max_connections: int = 200) -> PgServer:
    """Start a fresh cluster, or raise PgServerError saying why it cannot be had."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise PgServerError("no PostgreSQL server found (initdb is neither on PATH nor in /usr/lib/postgresql/*/bin); "
                            "`make test` installs the Debian `postgresql` package, or install it by hand, "
                            f"or set {SKIP_ENV}=skip to skip the PostgreSQL tests")
    user: str | None = None
    base = Path(tempfile.mkdtemp(prefix="hermes-pg-"))
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam(SERVER_USER)
        except KeyError:
            shutil.rmtree(base, ignore_errors=True)
            raise PgServerError(f"running as root, and there is no '{SERVER_USER}' user to run the server as "
                                "(initdb refuses root); install the `postgresql` package, which creates it") from None
        user = SERVER_USER
        os.chown(base, entry.pw_uid, entry.pw_gid)
    server = PgServer(bin_dir, base, free_port(), user, max_connections)
    reap(base)
    try:
        server.start()
    except (PgServerError, OSError, subprocess.TimeoutExpired) as exc:
        tail = server.log_tail()
        server.stop()
        raise PgServerError(f"the PostgreSQL test server did not start: {exc}\n{tail}") from None
    return server


_REAPER_PIPES: list[int] = []  # write ends, held open (never written) for as long as this process lives


def reap(base: Path) -> None:
    """Start tests/pgreaper.py for the server in `base`: it stops the server and removes `base` once
    this process is gone, killed or not (its pipe's write end, held here alone, closes with it)."""
    read, write = os.pipe()  # not inheritable: no process this one starts holds the pipe open
    subprocess.Popen([sys.executable, str(Path(__file__).with_name("pgreaper.py")), str(base)], stdin=read,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(read)
    _REAPER_PIPES.append(write)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    if os.environ.get(SKIP_ENV, "").lower() == "skip":
        pytest.skip(f"{SKIP_ENV}=skip: PostgreSQL tests not run")
    try:
        server = start_server()
    except PgServerError as exc:
        pytest.fail(f"{exc}\n(set {SKIP_ENV}=skip to skip the PostgreSQL tests on purpose)", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def fresh_database(server: PgServer, prefix: str, password: str | None = None) -> Iterator[str]:
    """A database of its own on the suite's server, dropped afterwards; yields its DSN. The server
    trusts its socket, so `password` is never checked: it is there to be looked for, and never
    found, in every output and file of the test."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"{prefix}_{os.urandom(6).hex()}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(server.dsn, dbname=name, **({"password": password} if password else {}))
    finally:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@contextlib.contextmanager
def stores_on_one_schema(server: PgServer, schema: str) -> Iterator[Any]:
    """A maker of PgStores on `schema`, each as if on a host of its own (`host`, `boot_id`); every
    store closed and the schema dropped afterwards."""
    import psycopg
    from hermes_sup.kanban.pg.store import PgStore

    opened: list[PgStore] = []

    def make(host: str = "host-a", **kwargs: Any) -> PgStore:
        kwargs.setdefault("boot_id", f"boot-{host}")
        store = PgStore(server.dsn, schema=schema, host=host, **kwargs)
        opened.append(store)
        return store

    try:
        yield make
    finally:
        for store in opened:
            store.close()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # a test may open no store
