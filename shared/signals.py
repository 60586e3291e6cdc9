"""Acting on a signal outside its handler.

A Python signal handler runs in the main thread between two bytecodes, possibly
while that thread holds a lock: one inside `Event.wait` (the agent's main thread
waits on its stop event), or one taken by an earlier run of the same handler (a
second SIGTERM: a process-group kill reaches a gunicorn worker from its master and
from the sender). A handler that takes a lock itself (`Event.set` does) can then
wait on its own thread forever, and the process never stops. So the handler here
takes none: it writes the signal's number to a pipe, and a thread of its own reads
it and runs the callback, where locks are safe.
"""
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


class SignalWatch:
    """Call `callback(signum)` in the thread "signals" for each of `signums` received.

    With `chain`, the handler each signal had before still runs (in the handler, as it
    did: gunicorn's own are written for that), and a default action still happens.
    Install from the main thread; `close()` puts the previous handlers back."""

    def __init__(self, signums: Iterable[int], callback: Callable[[int], None], chain: bool = False):
        self.callback = callback
        self.chain = chain
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous = {signum: signal.getsignal(signum) for signum in signums}
        for signum in self._previous:
            signal.signal(signum, self._handle)
            signal.siginterrupt(signum, False)  # as gunicorn sets it: blocking calls are not disturbed
        self._thread = threading.Thread(target=self._run, name="signals", daemon=True)
        self._thread.start()

    def _handle(self, signum, frame) -> None:
        try:
            os.write(self._write_fd, bytes([signum]))
        except OSError:  # the pipe is full (the thread is behind) or closed
            pass
        if not self.chain:
            return
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _run(self) -> None:
        while True:
            try:
                received = os.read(self._read_fd, 64)
            except OSError:
                return
            if not received:  # closed
                os.close(self._read_fd)
                return
            for signum in received:
                try:
                    self.callback(signum)
                except Exception:
                    log.exception("acting on %s failed", signal.Signals(signum).name)

    def close(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        os.close(self._write_fd)  # the thread reads the end and returns
