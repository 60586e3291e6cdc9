"""A daemon thread that runs once in each process, started by its first user.

An object made before gunicorn forks its workers is copied into each of them, but
its thread is not (a fork copies only the forking thread), and neither are its
locks' states: so the thread is started again in a process that finds it was
started in another, after `after_fork` has given the object fresh locks.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

_START_LOCK = threading.Lock()


class ProcessThread:
    def __init__(self, name: str, target: Callable[[], None], after_fork: Callable[[], None]):
        self.name = name
        self._target = target
        self._after_fork = after_fork
        self._pid: int | None = None
        self.thread: threading.Thread | None = None

    def ensure_started(self) -> None:
        """Start the thread in this process, unless it was already."""
        pid = os.getpid()
        if self._pid == pid:
            return
        with _START_LOCK:
            if self._pid == pid:
                return
            if self._pid is not None:  # inherited through a fork: the parent's thread and locks are not ours
                self._after_fork()
            self.thread = threading.Thread(target=self._target, name=self.name, daemon=True)
            self.thread.start()
            self._pid = pid

    def join(self, timeout: float) -> None:
        """Wait for the thread to end, if it runs in this process (a forked copy's never ends)."""
        if self.thread is not None and self.thread.is_alive() and self._pid == os.getpid():
            self.thread.join(timeout)
