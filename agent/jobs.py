"""The jobs an agent holds a slot for, and the one place other threads read them.

LocalJob is one job and its states; JobTable the queue of claimed jobs and the held
ones, under one lock.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.trace import INVALID_SPAN, Span

from corral.shared.tracecontext import TraceContext

from . import cgroups, runner, services
from .stop_terms import StopTerms

Key = tuple[str, int]  # (job_id, attempt)

# Why the agent ended a job itself; None means the job exited on its own.
END_TIMEOUT = "timeout"
END_RECONCILED = "reconciled"  # the scheduler no longer lists it: do not report
END_STOPPING = "stopping"
END_FENCED = "fenced"  # the lease lapsed: stopped before the scheduler requeues it
END_DISK = "disk"  # its work dir outgrew its disk_mb (disk.py)
# The scheduler asked it stopped (a lease answer's `stop`): the drain of the node reached its
# deadline, or it was preempted. The same words as the report's `ended_by` (wire.STOP_REASONS).
END_DRAINED = "drain"
END_PREEMPTED = "preemption"

PREPARING = "preparing"
RUNNING = "running"
ENDING = "ending"
NOT_STARTED = "not started"


@dataclass
class LocalJob:
    """One job this agent holds a slot for. The worker thread that prepares it sets
    `process` (or `start_error`) under `lock`, then `prepared`; after that only the
    work loop touches it."""
    job_id: str
    attempt: int
    job_type: str
    workdir: str
    started_at: float
    deadline: float | None
    process: runner.RunningJob | services.AdoptedProcess | None = None
    cgroup: cgroups.JobCgroup | None = None
    memory_mb: int | None = None
    disk_mb: int | None = None  # the most its work dir may hold (disk.py); None: no limit
    gpus: tuple[str, ...] = ()  # the UUIDs of the GPUs placement reserved for it (gpus_assigned)
    end_reason: str | None = None
    killer: threading.Thread | None = None
    start_error: tuple[int, str] | None = None  # (exit code, stderr) when it could not start
    monitor: services.ServiceMonitor | None = None
    state_path: str | None = None  # services: the file the next agent re-adopts from
    log_files: tuple[str, str] | None = None  # services: stdout and stderr files
    uid: int | None = None  # the uid it runs as (services: recorded in their state file)
    user_key: str | None = None  # set while it holds an identity from the agent's JobUsers
    adopted: bool = False
    trace: TraceContext | None = None  # the attempt's own (its TRACEPARENT), in the job's trace
    stop: StopTerms = field(default_factory=StopTerms)  # its kill signal and grace, its warning
    warn_at: float | None = None  # when its warning is due (the deadline's clock); None once sent
    deadline_epoch: float | None = None  # its deadline in epoch seconds (CORRAL_DEADLINE)
    span: Span = INVALID_SPAN  # corral.attempt (spans.py), ended with the attempt
    prepared: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def key(self) -> Key:
        return (self.job_id, self.attempt)

    @property
    def state(self) -> str:
        """preparing, running, ending (the agent ends it: timeout, cancel, fence, stop)
        or not started (prepared without a process)."""
        if not self.prepared.is_set():
            return ENDING if self.end_reason is not None else PREPARING
        if self.process is None:
            return NOT_STARTED
        return ENDING if self.end_reason is not None else RUNNING


class JobTable:
    """A job is first *claimed*: the scheduler handed it over (a claim, or a report's
    riding claim) and it waits in the queue for the work loop as the job dict the
    scheduler sent. The work loop takes it (Intake.take_claimed) and it becomes a
    LocalJob, whose `state` is then:

        preparing ──▶ running ──▶ ending ──▶ (removed: its report is in the outbox)
            │                        ▲
            └──────── not started ───┘  (start_error, or ended while preparing)

    One lock covers the queue and the held jobs, so free slots are never counted twice
    or not at all while a job moves from one to the other, and readers on other
    threads (lease, fence, live output, heartbeat) get snapshots. Only the work loop
    adds and removes held jobs; a preparing thread changes its own LocalJob under the
    job's own lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Key, LocalJob] = {}
        self._claimed: list[tuple[Key, dict]] = []

    # --- held jobs ---------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._held)

    def snapshot(self) -> list[LocalJob]:
        with self._lock:
            return list(self._held.values())

    def keys(self) -> set[Key]:
        with self._lock:
            return set(self._held)

    def get(self, key: Key) -> LocalJob | None:
        with self._lock:
            return self._held.get(key)

    def held(self, key: Key) -> LocalJob:
        """The held job `key`; KeyError when there is none."""
        with self._lock:
            return self._held[key]

    def add(self, local: LocalJob) -> None:
        with self._lock:
            self._held[local.key] = local

    def remove(self, key: Key) -> None:
        with self._lock:
            self._held.pop(key, None)

    def holds_job(self, job_id: str) -> bool:
        """Whether an attempt of `job_id` is held here."""
        with self._lock:
            return self._holds(job_id)

    def _holds(self, job_id: str) -> bool:  # under the lock
        return any(local.job_id == job_id for local in self._held.values())

    # --- claimed, not taken yet ------------------------------------------------------

    def queue(self, claimed: list[tuple[Key, dict]]) -> None:
        with self._lock:
            self._claimed.extend(claimed)

    def claimed_keys(self) -> list[Key]:
        with self._lock:
            return [key for key, _ in self._claimed]

    def has_claimed(self) -> bool:
        with self._lock:
            return bool(self._claimed)

    def drop_claimed(self, key: Key) -> bool:
        """Forget a claimed job (the scheduler ended it before it started); whether it was there."""
        with self._lock:
            before = len(self._claimed)
            self._claimed = [(k, job) for k, job in self._claimed if k != key]
            return len(self._claimed) != before

    def take_all_claimed(self) -> list[tuple[Key, dict]]:
        with self._lock:
            claimed, self._claimed = self._claimed, []
            return claimed

    def take_claimed(self, start: Callable[[Key, dict], LocalJob | None]) -> list[Key]:
        """Move the claimed jobs into the table: `start(key, job)` (under the lock)
        returns the LocalJob that now holds the slot, or None when the job leaves the
        queue without one (given back). A job one of whose attempts is still held here
        waits in the queue for it to end. The keys taken."""
        taken = []
        with self._lock:
            waiting = []
            for key, job in self._claimed:
                if self._holds(key[0]):
                    waiting.append((key, job))
                    continue
                local = start(key, job)
                if local is not None:
                    self._held[key] = local
                    taken.append(key)
            self._claimed = waiting
        return taken

    def free(self, slots: int) -> int:
        """Slots neither holding a job nor promised to a claimed one."""
        with self._lock:
            return max(0, slots - len(self._held) - len(self._claimed))
