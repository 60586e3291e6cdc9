"""The console scripts `corral-registry` and `corral-scheduler` run gunicorn.

Settings come from the environment; flags override host, port and the worker
shape. Settings are checked and the database schema is created in the master,
before any worker forks, so a bad setting is one clear line and exit code 2,
not a worker that fails to boot over and over.
"""
import argparse
import logging
import os
import sys
from collections.abc import Callable

from gunicorn.app.base import Application

from . import auth, metrics
from .errors import CorralError

# gthread: one thread per in-flight request. Long-running requests (long-poll
# claims) then hold a thread, not a worker, and the master's heartbeat keeps
# gunicorn's `timeout` from killing them.
#
# Threads: every agent keeps one long-poll claim waiting on the scheduler, and a
# waiting claim holds one thread. A worker lets `threads - 8` claims wait at once
# (LONG_POLL_MAX_WAITERS) and keeps 8 threads for submits, reads and reports, so
# 2 workers x 128 threads serve 240 long-polling agents. Beyond that, add workers
# or threads (docs/dispatch.md); agents over the limit fall back to asking every
# POLL_INTERVAL_SECS. gthread starts its threads lazily and a waiting one costs
# little memory and no CPU, so the default is sized for a few hundred nodes.
DEFAULTS = {
    "worker_class": "gthread",
    "workers": 2,
    "threads": 128,
    "timeout": 60,
    "graceful_timeout": 30,
    "keepalive": 5,
    "control_socket_disable": True,
    "accesslog": None,
}


# The request threads of this process's gunicorn workers (set when the config is
# loaded, before the fork; None outside gunicorn).
_worker_threads: int | None = None


def worker_threads() -> int:
    """Requests one worker of this server serves at once: --threads for gthread
    workers, 1 for any other worker class; DEFAULTS['threads'] outside gunicorn."""
    return DEFAULTS["threads"] if _worker_threads is None else _worker_threads


class _Gunicorn(Application):
    def __init__(self, loader: Callable, defaults: dict, overrides: dict, config_file: str | None):
        self._loader = loader
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
        global _worker_threads
        kind = self.cfg.worker_class_str
        threaded = kind in ("gthread", "ThreadWorker") or str(kind).endswith(".ThreadWorker")
        _worker_threads = self.cfg.threads if threaded else 1

    def load(self):
        return self._loader()


def setup_logging() -> None:
    level = os.environ.get("CORRAL_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")


def run_service(prog: str, default_port: int, prepare: Callable[[], None],
                loader: Callable, argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=f"Run the Corral {prog.split('-')[-1]} under gunicorn.")
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
    args = parser.parse_args(argv)
    setup_logging()
    if args.port is not None and not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")
    if bool(args.certfile) != bool(args.keyfile):
        parser.error("--certfile and --keyfile go together")
    for path in (args.certfile, args.keyfile):
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            parser.error(f"cannot read {path}")
    try:
        prepare()
        metrics.prepare_multiprocess_dir(prog)  # before any worker forks (shared/metrics.py)
        # Without any token, only loopback is safe to serve (shared/auth.py).
        open_to_all = not auth.server_tokens(os.environ).any
        insecure = args.insecure or auth.insecure_allowed(os.environ)
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
    application = _Gunicorn(loader, defaults, overrides, args.gunicorn_config)
    # Checked on the binds gunicorn will really use (flags, config file and defaults merged).
    refusal = auth.bind_refusal(application.cfg.bind) if open_to_all and not insecure else None
    if refusal:
        print(f"{prog}: error: {refusal}", file=sys.stderr)
        sys.exit(2)
    application.run()
