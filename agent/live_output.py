"""Live output: while jobs run, the tails of their output go to the scheduler.

One `POST /jobs/output` per pass, with only the streams that changed. Off the path of
starting and finishing a job: it reads what the work loop and the output readers
already keep.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from corral.shared import backoff, limits, wire
from corral.shared.clients import ClientError, Rejected, SchedulerClient, split_batches

log = logging.getLogger(__name__)

# About this many bytes of JSON per request: with the default tails, dozens of jobs
# fit in one, well under the scheduler's CORRAL_MAX_BODY_BYTES.
BATCH_BYTES = 1024 * 1024
BATCH_MAX = limits.MAX_BATCH // 2  # items per request
# The longest pause between tries while the scheduler cannot be reached.
BACKOFF_CAP_SECS = 30.0


class LiveOutput:
    """Sends running jobs' new output. `jobs` returns the agent's LocalJob objects
    (a snapshot); `client` is this thread's own SchedulerClient.

    Every `interval` (AGENT_OUTPUT_INTERVAL_SECS) it sends the current tail of each
    stream that changed since it was last sent: the same bounded tail the final report
    carries (CORRAL_OUTPUT_TAIL_BYTES), never the whole history. The scheduler stores
    it only for the current attempt of a job still `running` on this node, so a late
    update never overwrites a final report's output. What was sent last is pruned to
    the jobs still held at every pass."""

    def __init__(self, node_id: str, jobs: Callable[[], Iterable], client: SchedulerClient, interval: float):
        self.node_id = node_id
        self.jobs = jobs
        self.client = client
        self.interval = interval
        # (job_id, attempt) -> the (stdout, stderr) versions last delivered.
        self._sent: dict[tuple[str, int], tuple] = {}

    def send_once(self) -> int:
        """One pass: send what changed. Returns how many jobs' updates were sent.
        Raises ClientError when the scheduler cannot be reached
        (nothing is marked sent then: the next pass sends the newest tails)."""
        changed = []  # (key, versions, item)
        held = set()
        for local in self.jobs():
            process = local.process
            if not local.prepared.is_set() or process is None or local.end_reason is not None:
                continue
            held.add(local.key)
            versions = process.output_versions()
            last = self._sent.get(local.key, (None, None))
            if versions == last:
                continue
            if process.poll() is not None:
                continue  # it ended: its report carries the output
            tails = process.output_tails()
            item = {"job_id": local.job_id, "node_id": self.node_id, "attempt": local.attempt}
            for name, version, before, text in zip(wire.LOG_STREAMS, versions, last, tails):
                if version != before:
                    item[name] = text
            changed.append((local.key, versions, item))
        self._sent = {key: versions for key, versions in self._sent.items() if key in held}
        for chunk in split_batches(changed, lambda entry: entry[2], BATCH_MAX, BATCH_BYTES):  # usually one
            self._deliver(chunk)
        return len(changed)

    def _deliver(self, chunk: list[tuple]) -> None:
        try:
            results = self.client.send_output([item for _, _, item in chunk])
        except Rejected as exc:
            # The same tails would be refused again (400, 413): skip them, send newer ones.
            log.warning("the scheduler refused live output of %d job(s): %s", len(chunk), exc)
            results = []
        except ValueError as exc:  # an answer without one result per item
            log.warning("%s", exc)
            results = []
        for (key, versions, _), result in zip(chunk, results):
            if result.get("code") not in (200, 409):  # 409: the attempt ended; not an error
                log.warning("the scheduler refused live output of job %s attempt %s (%s: %s)",
                            *key, result.get("code"), result.get("error"))
        # Refused or not, these versions were answered: only newer output goes next time.
        for key, versions, _ in chunk:
            self._sent[key] = versions

    def run(self, stop: threading.Event) -> None:
        """Send every interval until `stop`; failures are logged and retried later
        (doubling the pause up to BACKOFF_CAP_SECS)."""
        try:
            backoff.every(self.interval, stop, self.send_once, "sending live output", log, (ClientError,),
                          BACKOFF_CAP_SECS)
        finally:
            self.client.close()


