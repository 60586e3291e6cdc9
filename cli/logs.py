"""`corral job logs --full` and `-f`: a job's complete output as its node shipped it
(GET /jobs/{id}/logs), written as the bytes it is.

`-f` follows the job's event stream, each `log` event reading on from the last byte
printed (nothing twice, nothing skipped); a new attempt follows the rest of the old
one; an ended job is read until its node's last chunk is in (SETTLE_SECS at most).
Where no stream is to be had, it asks every POLL_SECS instead.
"""
from __future__ import annotations

import json
import sys
from typing import BinaryIO

from corral.shared import sse, states
from corral.shared.clients import Rejected
from corral.shared.wire import LOG_ATTEMPT_HEADER, LOG_COMPLETE_HEADER, LOG_SIZE_HEADER

from . import format as fmt
from .common import Env, note
from .events import follow as follow_events
from .polling import POLL_SECS

# Without --full, -f starts about this far before the end, at the start of a line.
TAIL_BYTES = 64 * 1024
# After the job ended, how long -f waits for its node's last chunk.
SETTLE_SECS = 30.0


class Printer:
    """Prints one stream of one attempt from `offset` on, as the scheduler has it."""

    def __init__(self, env: Env, job_id: str, stream: str, out: BinaryIO):
        self.env, self.job_id, self.stream, self.out = env, job_id, stream, out
        self.attempt: int | None = None
        self.offset = 0
        self.size = 0
        self.complete = False

    def catch_up(self) -> None:
        """Print what the scheduler has past `offset`, a chunk at a time."""
        while True:
            answer = self.env.scheduler.job_logs(self.job_id, self.stream, self.offset, self.attempt)
            self._learn(answer)
            if not answer.content:
                return
            self.out.write(answer.content)
            self.out.flush()
            self.offset += len(answer.content)

    def start_near_the_end(self) -> None:
        """Skip to a line start about TAIL_BYTES before the end (-f without --full)."""
        answer = self.env.scheduler.job_logs(self.job_id, self.stream, 0, self.attempt)
        self._learn(answer)
        if self.size <= TAIL_BYTES:
            return
        start = self.size - TAIL_BYTES
        head = self.env.scheduler.job_logs(self.job_id, self.stream, start, self.attempt).content
        newline = head.find(b"\n")
        self.offset = start + (newline + 1 if newline >= 0 else 0)

    def _learn(self, answer) -> None:
        self.size = int(answer.headers.get(LOG_SIZE_HEADER, 0))
        self.complete = answer.headers.get(LOG_COMPLETE_HEADER) == "true"
        if self.attempt is None:  # the latest attempt, as the scheduler answered
            self.attempt = int(answer.headers.get(LOG_ATTEMPT_HEADER, 0))


def print_full(env: Env, job_id: str, stream: str, attempt: int | None, out: BinaryIO) -> None:
    printer = Printer(env, job_id, stream, out)
    printer.attempt = attempt
    printer.catch_up()
    if not printer.complete and printer.size == 0 and printer.attempt == 0:
        note(f"corral: {job_id} has not run yet")


def follow(env: Env, job_id: str, stream: str, full: bool, out: BinaryIO) -> None:
    printer = Printer(env, job_id, stream, out)
    job = env.scheduler.get_job(job_id)
    printer.attempt = job.get("attempt") or 0
    if not full:
        printer.start_near_the_end()
    if job.get("status") in fmt.FINAL:
        return settle(env, printer)
    ended = False

    def handle(message: sse.Message) -> bool:
        nonlocal ended
        event = json.loads(message.data)
        if message.event == "log":
            if event.get("attempt") == printer.attempt and event.get("stream") == stream:
                printer.catch_up()
        elif message.event == "job":
            attempt = event.get("attempt") or 0
            if attempt > (printer.attempt or 0) and event.get("to") == states.RUNNING:
                new_attempt(printer, attempt)
            elif event.get("to") in fmt.FINAL:
                ended = True
        return not ended

    try:
        follow_events(env, {"job_id": job_id, "type": ["job", "log"]}, handle, on_open=printer.catch_up)
    except Rejected as exc:
        if exc.status not in (404, 503):
            raise
        poll(env, printer)  # no stream here: ask again and again
        return
    settle(env, printer)


def new_attempt(printer: Printer, attempt: int) -> None:
    printer.catch_up()  # the rest of the attempt that ended
    if printer.attempt:
        note(f"corral: {printer.job_id}: attempt {attempt}")
    printer.attempt, printer.offset, printer.complete = attempt, 0, False


def poll(env: Env, printer: Printer) -> None:
    """-f without the event stream: read the job and its output every POLL_SECS."""
    while True:
        printer.catch_up()
        job = env.scheduler.get_job(printer.job_id)
        if (job.get("attempt") or 0) > (printer.attempt or 0):
            new_attempt(printer, job["attempt"])
            continue
        if job.get("status") in fmt.FINAL:
            return settle(env, printer)
        env.sleep(POLL_SECS)


def settle(env: Env, printer: Printer) -> None:
    """The job ended: print the rest, until its node's last chunk is in."""
    deadline = env.now() + SETTLE_SECS
    while printer.attempt:  # (0: it never ran)
        printer.catch_up()
        if printer.complete:
            return
        if env.now() >= deadline:
            note(f"corral: the node has not sent the end of {printer.job_id}'s {printer.stream} "
                 f"(attempt {printer.attempt}); printed what the scheduler has")
            return
        env.sleep(POLL_SECS)


def binary_stdout() -> BinaryIO:
    """stdout as bytes: a job's output is written as it is, whatever its encoding."""
    return sys.stdout.buffer
