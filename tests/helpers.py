"""Test helpers: wait on conditions with a deadline instead of sleeping, free ports,
servers on threads."""
import functools
import os
import random
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def wait_for(predicate, timeout=10.0, interval=0.05, message="condition"):
    """Poll `predicate` until it returns something truthy and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # a server that is not up yet, for instance
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {message}{detail}")
        time.sleep(interval)


def process_gone(pid: int) -> bool:
    """True once `pid` no longer runs. A zombie counts as gone: orphans are
    re-parented to a PID 1 that may never reap them (as in some containers)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    # The state letter follows the parenthesised command name, which may hold spaces.
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


_HANDED_OUT: set[int] = set()


@functools.cache
def _ports_of_this_worker() -> range:
    """The ports this test process may hand out: below the kernel's ephemeral range
    (which every outgoing connection draws its local port from, so a port the kernel
    picked for bind(0) can be taken by some client socket before the server binds it),
    split between the pytest-xdist workers so that two workers never pick the same one."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low, high = 10000, max(ephemeral_low, 12000)
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), 1)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0) % workers
    share = (high - low) // workers
    return range(low + worker * share, low + (worker + 1) * share)


def free_port() -> int:
    """A port nothing uses on any address, that this test run has not handed out before
    and no other xdist worker hands out; the caller binds it soon after (a server given
    `--host 0.0.0.0` included)."""
    ports = _ports_of_this_worker()
    start = random.randrange(len(ports))
    for offset in range(len(ports)):
        port = ports[(start + offset) % len(ports)]
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))  # no SO_REUSEADDR: refused if anything holds it
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port in {ports}")


def start_serving(server, name: str = "test-http") -> threading.Thread:
    """Serve a socketserver server (werkzeug's or http.server's) on a daemon thread.
    It looks for a stop every 50 ms: shutdown() waits for that look, half a second
    with serve_forever's default."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True)
    thread.start()
    return thread


def serve_in_thread(handler_class):
    """A ThreadingHTTPServer on 127.0.0.1 (a free port) serving `handler_class` on a
    daemon thread; the caller calls shutdown() and server_close()."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    start_serving(server)
    return server


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler for the tests' proxies: keep-alive HTTP/1.1, no log lines."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass


class HoldingProxy:
    """A proxy a test puts in front of a server, whose handler may hold requests until
    `release` is set: serves the handler in a thread at `url`; stop() lets held
    requests go, then ends it."""

    def __init__(self, handler_class, release: threading.Event):
        self.release = release
        self.server = serve_in_thread(handler_class)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def stop_held_jobs(agents) -> None:
    """End every job the given Agent objects hold (services included), so that no job
    process outlives a test that drove agents in-process."""
    for agent in agents:
        for key in agent.jobs.keys():
            local = agent.jobs.get(key)
            local.prepared.wait(10)
            if local.monitor is not None:
                local.monitor.stop(remove=False)
            if local.process is not None:
                local.process.kill(0)
        unmount_under(agent.settings.agent_dir)  # its jobs' work dir filesystems (agent/diskfs.py)


def unmount_under(path: str) -> None:
    """Unmount every filesystem at or under `path`, deepest first (a loop device goes with its own)."""
    prefix = os.path.join(os.path.realpath(path), "")
    with open("/proc/self/mountinfo") as f:
        targets = [line.split()[4] for line in f]
    for target in sorted((t for t in targets if t.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", target], capture_output=True, timeout=30)
