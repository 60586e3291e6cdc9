# gunicorn settings for corral-registry and corral-scheduler.
#
# Installed as /etc/corral/gunicorn.conf.py and passed by the systemd units as
# `--gunicorn-config /etc/corral/gunicorn.conf.py`. It is plain Python, read by
# gunicorn at start and again on `systemctl reload` (SIGHUP).
#
# Precedence: Corral's built-in defaults (control-plane/server/serve.py, the same values as
# below), then this file, then the command-line flags (--host/--port/--bind,
# --workers, --threads, --access-log). Any gunicorn setting may be added here; see
# https://docs.gunicorn.org/en/stable/settings.html. Names gunicorn does not know
# are silently ignored, so check the spelling (tests/infra/test_infra.py does for this copy).
#
# Both servers read this one file, so it sets no listen address: each server has its
# own port (9000, 9001). Use --host/--port or --bind, for instance
# CORRAL_SERVER_FLAGS=--host 0.0.0.0 in /etc/corral/<name>.env.

# Corral's worker: gunicorn's threaded worker (gthread) that first reads each request
# whole in its event loop, so a client sending slowly, or nothing, holds no thread
# (CORRAL_REQUEST_READ_TIMEOUT_SECS bounds it; README "Security"). A long-running
# request (such as a long-poll for work) holds a thread, not a whole worker, and the
# worker keeps heartbeating to the master meanwhile, so `timeout` does not kill it.
worker_class = "corral.server.worker.BufferingWorker"

# Worker processes per server. All state is in the database, so every worker serves
# the same data and the scheduler's background loops still run once (behind a lease).
# With SQLite, writes are serialised anyway: more than a few workers buys little.
workers = 2

# Threads per worker: concurrent requests per server = workers x threads. Every
# agent keeps one long-poll claim waiting on the scheduler, which holds a thread; a
# worker lets threads - 8 claims wait (LONG_POLL_MAX_WAITERS) and keeps the rest for
# submits, reads and reports. 2 workers x 128 threads: 240 long-polling agents. For
# more nodes raise workers or threads so that workers x (threads - 8) >= nodes;
# agents beyond it ask every POLL_INTERVAL_SECS instead (docs/dispatch.md). Threads
# are started on demand; a waiting one costs little memory and no CPU.
threads = 128

# Connections one worker holds open at once (requests arriving, being served, idle
# kept-alive ones). The server raises its open-files limit to the hard limit at start;
# keep workers x worker_connections below it (the units' LimitNOFILE).
worker_connections = 4096

# Seconds a worker may go silent before the master kills and replaces it (with
# gthread this is a hung worker, not a slow request).
timeout = 60

# On SIGTERM (systemctl stop) or SIGHUP (reload): seconds workers get to finish the
# requests in flight before they are killed. The units' TimeoutStopSec (45) must stay
# above this.
graceful_timeout = 30

# Seconds an idle keep-alive connection stays open. Agents reuse theirs and speak
# every 5 s (heartbeats, lease renewals): a server that closed at the same 5 s
# would now and then close one just as the agent sent its next request on it
# (RemoteDisconnected, retried by the agent but logged), so it waits three times longer.
keepalive = 15

# Access log: None means off; "-" sends it to stdout, which is the journal under
# systemd. Agents poll every few seconds, so it is chatty. --access-log overrides it.
accesslog = None

# Error and server log: stderr, which is the journal under systemd.
errorlog = "-"

# TLS (README "Security"): serve https:// with this certificate and key, readable by
# the `corral` user. Both servers read this file; --certfile/--keyfile in
# CORRAL_SERVER_FLAGS set them per server instead.
# certfile = "/etc/corral/tls/server.pem"
# keyfile = "/etc/corral/tls/server.key"

# gunicorn's control socket (for `gunicornc`, gunicorn >= 25.1) is not used by Corral.
# Its default path is in the home directory, which the units make read-only.
control_socket_disable = True
