"""Signals are acted on outside their handler (shared/signals.py), in every process
that handles them: the servers' workers (control-plane/server/serve.py) and the agent."""
import subprocess
import sys

import pytest

HANDLER_UNDER_A_HELD_LOCK = """
import os, signal, threading
from corral.shared.signals import SignalWatch
stop = threading.Event()
watch = SignalWatch([signal.SIGTERM], lambda signum: stop.set())
with stop._cond:  # the main thread holds the event's lock, as inside stop.wait()
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(100_000))  # the handler runs in this thread meanwhile
print(stop.wait(10))
"""

SERVER_STOP_CALLBACKS = """
import os, signal, threading
from corral.server import serve as server
seen = []
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append("previous handler"))
done = threading.Event()
server.on_stop_signal(lambda: seen.append(threading.current_thread().name))
server.on_stop_signal(done.set)
for _ in range(50):
    os.kill(os.getpid(), signal.SIGTERM)
assert done.wait(10), "the callbacks did not run"
print(sorted(set(seen)), seen.count("signals"))
"""


def run(script: str) -> str:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_signal_received_while_the_main_thread_holds_a_lock_the_callback_needs_is_acted_on():
    """A handler calling stop.set() itself would wait on its own thread for ever here."""
    assert run(HANDLER_UNDER_A_HELD_LOCK) == "True"


@pytest.mark.slow
def test_a_workers_stop_callbacks_run_once_in_their_own_thread_and_gunicorns_handler_still_runs():
    assert run(SERVER_STOP_CALLBACKS) == "['previous handler', 'signals'] 1"
