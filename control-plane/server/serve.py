"""The console scripts `corral-registry` and `corral-scheduler` run gunicorn.

Settings come from the environment; flags override host, port and the worker
shape. Settings are checked and the database's pending schema migrations are
applied in the master (control-plane/server/migrations.py), before any worker forks, so a bad
setting is one clear line and exit code 2, not a worker that fails to boot over
and over.
"""
import argparse
import ipaddress
import logging
import os
import resource
import signal
import socket
import sys
import threading
from collections.abc import Callable

from gunicorn.app.base import Application
from gunicorn.workers.gthread import ThreadWorker

from corral.shared import signals, tracing

from corral.server import auth, metrics, worker
from corral.server import db as dbmod
from corral.shared.credentials import MAX_GENERATION, server_credentials
from corral.shared.errors import CorralError
from corral.shared.settings import LOG_LEVEL
from corral.shared.validate import NAME_RE

log = logging.getLogger(__name__)

# The worker (control-plane/server/worker.py) is gunicorn's gthread that reads each request in
# its event loop first: one thread per request being served, none per request
# still arriving, so slow or idle clients hold no thread. Long-running requests
# (long-poll claims) hold a thread, not a worker, and the master's heartbeat
# keeps gunicorn's `timeout` from killing them.
#
# Threads: every agent keeps one long-poll claim waiting on the scheduler, and a
# waiting claim holds one thread. A worker lets `threads - 8` claims wait at once
# (LONG_POLL_MAX_WAITERS) and keeps 8 threads for submits, reads and reports, so
# 2 workers x 128 threads serve 240 long-polling agents. Beyond that, add workers
# or threads (docs/dispatch.md); agents over the limit fall back to asking every
# POLL_INTERVAL_SECS. gthread starts its threads lazily and a waiting one costs
# little memory and no CPU, so the default is sized for a few hundred nodes.
#
# worker_connections: connections one worker holds open at once (waiting, idle
# kept alive, or being served); each costs a file descriptor and a few KB. The
# open-files limit is raised to its hard limit at start to fit them.
DEFAULTS = {
    "worker_class": "corral.server.worker.BufferingWorker",
    "workers": 2,
    "threads": 128,
    "worker_connections": 4096,
    "timeout": 60,
    "graceful_timeout": 30,
    "keepalive": 15,  # > the agents' 5 s between requests (infra/gunicorn.conf.py)
    "control_socket_disable": True,
    "accesslog": None,
}


# The request threads of this process's gunicorn workers (set when the config is
# loaded, before the fork; None outside gunicorn).
_worker_threads: int | None = None
# Whether every TCP address this server listens on is loopback (set by run_service
# before the fork; False outside it). Such a server checks the Host header
# (control-plane/server/guards.py).
_loopback_only = False


def loopback_only() -> bool:
    return _loopback_only


def binds_loopback_only(binds: list[str]) -> bool:
    """True when the binds hold at least one TCP address and all of them are loopback
    (an fd:// socket is looked up; unix sockets are not reached by browsers)."""
    hosts = []
    for bind in binds:
        if bind.startswith("unix:"):
            continue
        if bind.startswith("fd://"):
            try:
                sock = socket.socket(fileno=int(bind[len("fd://"):]))
            except (OSError, ValueError):
                return False
            try:
                if sock.family == socket.AF_UNIX:
                    continue
                hosts.append(sock.getsockname()[0])
            finally:
                sock.detach()  # the socket belongs to gunicorn
            continue
        hosts.append(auth.bind_host(bind))
    if not hosts:
        return False
    for host in hosts:
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            if not auth.resolves_to_loopback(host):
                return False
    return True


def worker_threads() -> int:
    """Requests one worker of this server serves at once: --threads for gthread
    workers, 1 for any other worker class; DEFAULTS['threads'] outside gunicorn."""
    return DEFAULTS["threads"] if _worker_threads is None else _worker_threads


class _Gunicorn(Application):
    def __init__(self, loader: Callable, defaults: dict, overrides: dict, config_file: str | None, prog: str):
        self._loader = loader
        self._prog = prog
        self._defaults = defaults
        self._overrides = overrides
        self._config_file = config_file
        super().__init__()

    def init(self, parser, opts, args):  # no gunicorn command line of its own
        return None

    def load_config(self):
        for key, value in self._defaults.items():
            self.cfg.set(key, value)
        if self._config_file:
            self.load_config_from_file(self._config_file)
        for key, value in self._overrides.items():
            self.cfg.set(key, value)
        metrics.install_gunicorn_hooks(self.cfg)
        _export_spans_until_exit(self.cfg)
        global _worker_threads
        threaded = issubclass(self.cfg.worker_class, ThreadWorker)  # gthread or ours
        _worker_threads = self.cfg.threads if threaded else 1

    def load(self):  # in the worker, after the fork
        dbmod.serve_in_a_worker()
        tracing.setup(self._prog)  # here: the span exporter's thread does not survive a fork
        return self._loader()


def _export_spans_until_exit(cfg) -> None:
    """Add to gunicorn's `worker_exit` (in the worker, before any hook a config file set,
    which still runs): the worker's queued spans are exported, within a time limit."""
    theirs = cfg.worker_exit

    def worker_exit(server, worker):
        tracing.shutdown()
        theirs(server, worker)

    cfg.set("worker_exit", worker_exit)


class _StopCallbacks:
    """What a worker runs, once, when gunicorn tells it to stop (SIGTERM): off the
    signal handler (shared/signals.py), after gunicorn's own handler."""

    def __init__(self):
        self.callbacks: list[Callable[[], None]] = []
        self.ran = False
        self.watch = signals.SignalWatch([signal.SIGTERM], self._run, chain=True)

    def _run(self, _signum: int) -> None:
        if self.ran:
            return
        self.ran = True
        for callback in list(self.callbacks):
            try:
                callback()
            except Exception:
                log.exception("acting on SIGTERM failed")


_stop_callbacks: _StopCallbacks | None = None


def on_stop_signal(callback: Callable[[], None]) -> None:
    """Call `callback` (soon, in a thread of its own) when gunicorn tells this worker
    to stop. Installed from the main thread only: elsewhere (tests) nothing is."""
    global _stop_callbacks
    if threading.current_thread() is not threading.main_thread():
        return
    if _stop_callbacks is None:
        try:
            _stop_callbacks = _StopCallbacks()
        except ValueError:  # not the main thread of the main interpreter
            return
    _stop_callbacks.callbacks.append(callback)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")


def node_token_command(prog: str, argv: list[str]) -> int:
    """`PROG node-token NODE`: print NODE's credential (CORRAL_NODE_TOKEN for its agent),
    derived from CORRAL_AGENT_TOKEN in this environment. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog=f"{prog} node-token",
        description="Print a node's credential (give it to that node's agent as CORRAL_NODE_TOKEN), "
                    "derived from the cluster's agent secret CORRAL_AGENT_TOKEN.")
    parser.add_argument("node_id", help="the node's NODE_ID")
    parser.add_argument("--generation", type=int, default=1, metavar="N",
                        help="the credential's generation (default 1): after `corral node revoke-credential "
                             "NODE`, the one it names")
    args = parser.parse_args(argv)
    if not NAME_RE.match(args.node_id):
        print(f"{prog}: error: a node id is 1-128 letters, digits, '.', '_' or '-', starting with a "
              f"letter or digit", file=sys.stderr)
        return 2
    if not 1 <= args.generation <= MAX_GENERATION:
        print(f"{prog}: error: --generation is 1 to {MAX_GENERATION}", file=sys.stderr)
        return 2
    try:
        credentials = server_credentials(os.environ)
        print(credentials.node_token(args.node_id, args.generation))
    except CorralError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        return 2
    return 0


INIT_HELP = ("start on a new, empty database where this service's database existed and is now missing "
             "(otherwise refused); CORRAL_DB_INIT=1")


def init_on_purpose() -> None:
    """--init: the setting CORRAL_DB_INIT, for this start, read with the other database
    settings by the service's migration (control-plane/server/db_marker.py). Its workers inherit it
    and never migrate."""
    os.environ["CORRAL_DB_INIT"] = "1"


def migrate_command(prog: str, argv: list[str], migrate: Callable[[bool], list[str]]) -> int:
    """`PROG migrate [--check]`: apply the database's pending schema migrations and
    print them; with --check, print them without applying (exit 1 when there are
    any). `migrate(check)` gives the steps applied, or pending with check=True.
    Returns the exit status (2 for a setting or database this version refuses)."""
    parser = argparse.ArgumentParser(
        prog=f"{prog} migrate",
        description="Apply the pending schema migrations of this service's database (DATABASE_URL), "
                    "under a lock, as the server does at start. With --check, only list them.")
    parser.add_argument("--check", action="store_true",
                        help="print the pending steps and exit 1 when there are any (0 when up to date)")
    parser.add_argument("--init", action="store_true", help=INIT_HELP)
    args = parser.parse_args(argv)
    if args.init:
        init_on_purpose()
    os.umask(0o077)  # a database (and lock file) made here is the server's own, as in run_service
    try:
        setup_logging(LOG_LEVEL.read(os.environ))
        steps = migrate(args.check)
    except CorralError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        return 2
    for step in steps:
        print(f"{'pending' if args.check else 'applied'}: {step}")
    if not steps:
        print("up to date")
    return 1 if args.check and steps else 0


def run_service(prog: str, default_port: int, prepare: Callable[[], object],
                loader: Callable, argv: list[str] | None = None,
                migrate: Callable[[bool], list[str]] | None = None) -> None:
    """Run the server (gunicorn), or one of its subcommands: `node-token NODE`, and
    `migrate [--check]` when the service has a `migrate(check)`."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["node-token"]:
        sys.exit(node_token_command(prog, argv[1:]))
    if argv[:1] == ["migrate"] and migrate is not None:
        sys.exit(migrate_command(prog, argv[1:], migrate))
    parser = argparse.ArgumentParser(prog=prog, description=f"Run the Corral {prog.split('-')[-1]} under gunicorn. "
                                     f"`{prog} node-token NODE` prints a node's credential; "
                                     f"`{prog} migrate [--check]` applies (or lists) the database's "
                                     f"pending schema migrations.")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help=f"port to listen on (default {default_port})")
    parser.add_argument("--bind", help="gunicorn bind string, overrides --host/--port (e.g. unix:/run/x.sock, fd://3)")
    parser.add_argument("--workers", type=int, help="gunicorn worker processes (default 2)")
    parser.add_argument("--threads", type=int, help=f"threads per worker (default {DEFAULTS['threads']})")
    parser.add_argument("--gunicorn-config", help="a gunicorn config file, applied over the defaults")
    parser.add_argument("--access-log", help="where to write the access log ('-' for stdout)")
    parser.add_argument("--certfile", help="TLS certificate (PEM; with --keyfile): serve https://")
    parser.add_argument("--keyfile", help="TLS private key (PEM) of --certfile")
    parser.add_argument("--insecure", action="store_true",
                        help="allow non-loopback addresses without CORRAL_API_TOKEN/CORRAL_AGENT_TOKEN "
                             "(CORRAL_INSECURE=1)")
    parser.add_argument("--init", action="store_true", help=INIT_HELP)
    args = parser.parse_args(argv)
    if args.init:
        init_on_purpose()
    try:
        setup_logging(LOG_LEVEL.read(os.environ))
    except CorralError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        sys.exit(2)
    if args.port is not None and not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")
    if bool(args.certfile) != bool(args.keyfile):
        parser.error("--certfile and --keyfile go together")
    for path in (args.certfile, args.keyfile):
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            parser.error(f"cannot read {path}")
    # Everything this server creates (its database and journal, the writers' lock, the
    # doorbell sockets, metrics files) is for its own user only: jobs may run on this
    # host (a local cluster, a small install) and must not read the database.
    os.umask(0o077)
    try:
        prepare()
        metrics.prepare_multiprocess_dir(prog)  # before any worker forks (control-plane/server/metrics.py)
        # Without any token, only loopback is safe to serve (control-plane/server/auth.py).
        open_to_all = not server_credentials(os.environ).enabled
        insecure = args.insecure or auth.insecure_allowed(os.environ)
        worker.read_timeout_secs(os.environ)  # checked here; each worker reads it again
    except CorralError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        sys.exit(2)
    defaults = dict(DEFAULTS, bind=[f"127.0.0.1:{default_port}"])
    overrides = {}
    if args.bind:
        overrides["bind"] = [args.bind]
    elif args.host or args.port:
        overrides["bind"] = [f"{args.host or '127.0.0.1'}:{args.port or default_port}"]
    if args.workers:
        overrides["workers"] = args.workers
    if args.threads:
        overrides["threads"] = args.threads
    if args.access_log:
        overrides["accesslog"] = args.access_log
    if args.certfile:
        overrides.update(certfile=args.certfile, keyfile=args.keyfile)
    application = _Gunicorn(loader, defaults, overrides, args.gunicorn_config, prog)
    # Checked on the binds gunicorn will really use (flags, config file and defaults merged).
    refusal = auth.bind_refusal(application.cfg.bind) if open_to_all and not insecure else None
    if refusal:
        print(f"{prog}: error: {refusal}", file=sys.stderr)
        sys.exit(2)
    global _loopback_only
    _loopback_only = binds_loopback_only(list(application.cfg.bind))
    raise_open_files_limit(application.cfg.workers * application.cfg.worker_connections)
    tracing.log_plan(os.environ, prog)  # each worker sets up its own exporter (_Gunicorn.load)
    application.run()


# Descriptors a server process needs besides its clients' (database, logs, wake-up sockets...).
SPARE_FILES = 256


def raise_open_files_limit(connections: int) -> None:
    """Raise the open-files soft limit to the hard limit (the workers inherit it), so
    that `worker_connections` fit; say so when even the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, exc)
    if soft != resource.RLIM_INFINITY and soft < connections + SPARE_FILES:
        log.warning("the open-files limit (%d) is below workers x worker_connections (%d): past it the "
                    "server accepts no more connections for a while; raise LimitNOFILE or lower "
                    "worker_connections", soft, connections)
