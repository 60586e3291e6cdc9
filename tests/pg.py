"""A throwaway PostgreSQL server for the tests: a fresh cluster in a temporary
directory, serving on a free loopback port, with one database per test.

Debian's `postgresql` package keeps initdb and pg_ctl in a folder of the
version's own (/usr/lib/postgresql/<version>/bin), not on PATH. initdb and
pg_ctl refuse to run as root, so a root test run starts the server as the
`postgres` user the package creates; any other user runs it as itself.
Authentication is `trust`: the server listens on 127.0.0.1 only and lives as
long as the test session.
"""
import contextlib
import glob
import itertools
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field

import psycopg

from helpers import free_port, process_gone, wait_for

PACKAGE = "the apt package postgresql (.ci/run installs it)"
SUPERUSER = "postgres"  # the role initdb creates; the URLs connect as it
SERVER_USER = "postgres"  # the system user a root test run starts the server as
START_TIMEOUT = 60  # seconds; a start takes about 2 s
STOP_TIMEOUT = 30
PORT_ATTEMPTS = 5  # the port is chosen before the server binds it: another process may take it first


class StartError(Exception):
    """PostgreSQL is installed but the server did not start (the message holds its log)."""


def find_bindir() -> str | None:
    """The folder with initdb, pg_ctl and postgres: PATH's first (where a link may point
    into a version's folder), else Debian's newest version folder. `pg_config --bindir`
    is not asked: it comes with libpq-dev, not with the server."""
    on_path = shutil.which("initdb")
    candidates = [os.path.dirname(os.path.realpath(on_path))] if on_path else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    for bindir in candidates:
        if all(os.access(os.path.join(bindir, name), os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def _version_key(bindir: str) -> tuple[int, ...]:
    version = os.path.basename(os.path.dirname(bindir))
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def missing() -> str | None:
    """Why no server can be started here (a skip reason naming the package), or None."""
    if find_bindir() is None:
        return f"needs PostgreSQL's initdb and pg_ctl: install {PACKAGE}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"needs the system user {SERVER_USER!r} to run PostgreSQL as root: install {PACKAGE}"
    return None


@dataclass
class PgServer:
    """One running server; `stop()` ends it and removes its directory."""

    bindir: str
    base_dir: str  # holds the data dir, the log and the Unix socket
    port: int = 0
    pid: int | None = None  # the postmaster's, from its pid file
    _names: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def data_dir(self) -> str:
        return os.path.join(self.base_dir, "data")

    @property
    def log_path(self) -> str:
        return os.path.join(self.base_dir, "server.log")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.data_dir, "postmaster.pid")

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database (corral_1, corral_2, ...); returns its name."""
        name = f"corral_{next(self._names)}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        # FORCE ends the connections a test left open, which would otherwise block the drop.
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        # CREATE and DROP DATABASE cannot run inside a transaction: autocommit.
        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def _run(self, *argv: str, timeout: float) -> subprocess.CompletedProcess:
        """One of PostgreSQL's programs, as the server's owner."""
        command = [os.path.join(self.bindir, argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        # cwd: the server's owner may not enter the test's working directory.
        return subprocess.run(command, cwd=self.base_dir, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)

    def _read_pid(self) -> int | None:
        try:
            with open(self.pid_file) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """A fast shutdown through pg_ctl; should that fail, SIGKILL to the postmaster's
        process group (pg_ctl starts it in a session of its own, with its backends).
        Then the directory goes."""
        try:
            self.pid = self._read_pid() or self.pid
            if self.pid is not None and not process_gone(self.pid):
                try:
                    self._run("pg_ctl", "-D", self.data_dir, "-m", "fast", "-w", "-t", str(STOP_TIMEOUT), "stop",
                              timeout=STOP_TIMEOUT + 10)
                except subprocess.TimeoutExpired:
                    pass
                if not process_gone(self.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.pid, signal.SIGKILL)
                wait_for(lambda: process_gone(self.pid), timeout=STOP_TIMEOUT, message=f"postgres {self.pid} to end")
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # ---- an outage: the same server stopped, then started again ------------------------------

    def shut_down(self) -> None:
        """Stop the server as an operator's fast shutdown does (`pg_ctl stop -m fast`: every
        session is ended, nothing is lost) and keep its data dir, port and settings, so that
        start_again() brings the same server back."""
        done = self._run("pg_ctl", "-D", self.data_dir, "-m", "fast", "-w", "-t", str(STOP_TIMEOUT), "stop",
                         timeout=STOP_TIMEOUT + 10)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl stop failed: {done.stderr.strip()}\n{self.log_tail()}")
        wait_for(lambda: process_gone(self.pid), timeout=STOP_TIMEOUT, message=f"postgres {self.pid} to end")

    def start_again(self) -> None:
        """Start the server shut_down() stopped, on the same port and data dir with the same
        settings: those of its last start, which PostgreSQL keeps in postmaster.opts (as
        `pg_ctl restart` reads them). Raises StartError when it does not start (another
        process took the port meanwhile, say)."""
        with open(os.path.join(self.data_dir, "postmaster.opts")) as f:
            argv = shlex.split(f.read())  # the postgres binary, then "-D" DATA_DIR, then the options
        options = " ".join(shlex.quote(arg) for arg in argv[3:])
        done = self._run("pg_ctl", "-D", self.data_dir, "-l", self.log_path, "-w", "-t", str(START_TIMEOUT),
                         "-o", options, "start", timeout=START_TIMEOUT + 10)
        if done.returncode != 0:
            raise StartError(f"pg_ctl start failed: {done.stderr.strip()}\n{self.log_tail()}")
        self.pid = self._read_pid()


def start(fsync: bool = False, synchronous_commit: bool = True) -> PgServer:
    """A new server on a free loopback port. Tests keep `fsync` off (nothing here must
    survive a power cut); a benchmark turns it on to measure what production pays.
    Raises StartError (its directory removed, nothing left running) when it does not start."""
    bindir = find_bindir()
    if bindir is None:
        raise StartError(f"initdb not found: install {PACKAGE}")
    server = PgServer(bindir=bindir, base_dir=tempfile.mkdtemp(prefix="corral-pg-"))
    try:
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SERVER_USER)
            os.chown(server.base_dir, owner.pw_uid, owner.pw_gid)
        # --no-locale: C collation, so text sorts by bytes as in SQLite, on any machine.
        # --no-sync: the files of a throwaway cluster need not reach the disk.
        done = server._run("initdb", "-D", server.data_dir, "-A", "trust", "-U", SUPERUSER, "-E", "UTF8",
                           "--no-locale", "--no-sync", timeout=START_TIMEOUT)
        if done.returncode != 0:
            raise StartError(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": server.base_dir,
            "fsync": "on" if fsync else "off",
            "synchronous_commit": "on" if synchronous_commit else "off",
        }
        for _ in range(PORT_ATTEMPTS):
            server.port = free_port()
            with contextlib.suppress(FileNotFoundError):
                os.remove(server.log_path)  # so that the log read below is this attempt's
            options = " ".join(f"-c {name}={shlex.quote(value)}" for name, value in settings.items())
            done = server._run("pg_ctl", "-D", server.data_dir, "-l", server.log_path, "-w", "-t", str(START_TIMEOUT),
                               "-o", f"-p {server.port} {options}", "start", timeout=START_TIMEOUT + 10)
            if done.returncode == 0:
                server.pid = server._read_pid()
                return server
            if "Address already in use" not in server.log_tail():
                break
        raise StartError(f"pg_ctl start failed: {done.stderr.strip()}\n{server.log_tail()}")
    except subprocess.TimeoutExpired as exc:
        log = server.log_tail()
        server.stop()
        raise StartError(f"{exc}\n{log}") from exc
    except BaseException:
        server.stop()
        raise
