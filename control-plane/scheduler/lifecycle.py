"""Every decision about a job's state, in one pure module.

The job, the event, the policy and `now` come in, a `Transition` (or a refusal) goes
out; the store applies it in one write (store/transitions.py): a compare-and-set on the
job's status and attempt, its event row, its notification. What each event does:
Transition.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from corral.shared import wire
from corral.shared.errors import Conflict
from corral.shared.states import FINAL_STATUSES, JobStatus, after_failure, check_transition

from . import gangs
from .retry import RetryDelay

# A job's stdout/stderr belong to its current attempt (live output fills them while it
# runs): a job that goes back to pending for another attempt starts without any.
NO_OUTPUT = {"stdout": None, "stderr": None}
# What an operator's retry clears: the last attempt's result.
NO_RESULT = {"exit_code": None, "stdout": None, "stderr": None, "oom_killed": None,
             "peak_memory_bytes": None, "cpu_seconds": None, "ended_by": None, "peak_gpu_memory_mb": None,
             "gpu_utilization_percent": None}


class JobFacts(Protocol):
    """What the lifecycle reads of a job: a row of the store's Job model, or a
    test's stand-in."""

    @property
    def job_id(self) -> str: ...  # read-only: the model derives it from the row id

    job_type: str
    status: str
    attempt: int
    retry_count: int
    max_retries: int
    node_id: str | None
    node_losses: int
    on_node_lost: str
    running_at: float | None


Report = dict[str, Any]  # a validated report (validation.status_report)


@dataclass(frozen=True)
class Policy:
    """The settings the lifecycle decides by."""

    max_node_losses: int = 3
    job_timeout_secs: float = 3600.0
    output_tail_bytes: int = 64 * 1024
    backoff: RetryDelay = field(default_factory=lambda: RetryDelay(2.0, 2.0, 300.0))


@dataclass(frozen=True)
class Transition:
    """What an event does to a job: its new status, the other fields that change, the
    reason recorded in its history, and what it counts for (a timeout).

        event                         from        to
        started (claim, report)       pending  -> running
        finished: exit 0              running  -> done
        finished: failed, retries     running  -> pending   (retry_count + 1, after a backoff)
        finished: failed, no retries  running  -> failed
        finished: past its timeout    running  -> failed    (a timeout is final)
        finished: given up by node    running  -> pending   (node_losses + 1) or failed
        node lost                     running  -> pending   (node_losses + 1) or failed
        timed out (the watcher)       running  -> failed
        late success                  pending  -> done      (a run given up for lost had finished)
        cancelled                     pending, running -> cancelled
        a dependency can never hold   pending  -> cancelled (dependencies.py)
        retried (an operator)         failed   -> pending   (a fresh retry budget)

    A node loss is not the job's fault: it keeps its retry budget, counted in
    `node_losses` instead, up to `max_node_losses`; `on_node_lost=fail` fails it."""

    old: str
    new: str
    reason: str
    changes: dict[str, Any]
    timed_out: bool = False
    # What the ended attempt used, as its node reported (cpu_seconds, peak_memory_bytes):
    # for usage accounting (store/usage.py), also where the job keeps none (a retry).
    used: dict[str, Any] | None = None

    @property
    def final(self) -> bool:
        return self.new in FINAL_STATUSES

    @property
    def notify(self) -> bool:
        """A final state is published (SNS), once, with the transition that reached it."""
        return self.final


def _to(job: JobFacts, new: str, reason: str, **changes: Any) -> Transition:
    check_transition(job.status, new)
    return Transition(job.status, new, reason, changes)


def tail(text: str | None, limit: int) -> str | None:
    """The last `limit` characters of a job's output as the job record keeps them. A NUL
    (binary output) becomes U+FFFD, as undecodable bytes already are: PostgreSQL's text
    cannot hold it, and the exact bytes are in the complete logs (job_logs.py)."""
    if text is None:
        return None
    if len(text) > limit:
        text = text[-limit:]
    return text.replace("\x00", "\ufffd")


def outcome(report: Report, policy: Policy) -> dict[str, Any]:
    """The result fields of a finished attempt, as its agent reported them."""
    return {"exit_code": report["exit_code"],
            "stdout": tail(report["stdout"], policy.output_tail_bytes),
            "stderr": tail(report["stderr"], policy.output_tail_bytes),
            "oom_killed": report["oom_killed"], "peak_memory_bytes": report["peak_memory_bytes"],
            "cpu_seconds": report["cpu_seconds"], "ended_by": report.get("ended_by") or wire.ENDED_BY_EXIT,
            "peak_gpu_memory_mb": report.get("peak_gpu_memory_mb"),
            "gpu_utilization_percent": report.get("gpu_utilization_percent")}


def _append(text: str | None, line: str) -> str:
    return f"{text.rstrip()}\n{line}" if text else line


# ---- the events -----------------------------------------------------------------------------

def started(job: JobFacts, now: float, limits_enforced: bool | None, limits: dict[str, Any] | None,
            private_tmp: bool | None, reason: str) -> Transition:
    """The node took the attempt (a claim, or the original design's `running` report)."""
    return _to(job, "running", reason, running_at=now, limits_enforced=limits_enforced, limits=limits,
               private_tmp=private_tmp, stop_reason=None, stop_at=None)


def past_timeout(job: JobFacts, now: float, policy: Policy) -> bool:
    """Whether a `run` job has run past its own timeout_secs, else JOB_TIMEOUT_SECS."""
    own = getattr(job, "timeout_secs", None)  # a stand-in without the field has none
    return (job.job_type == "run" and job.running_at is not None
            and now - job.running_at >= (own if own is not None else policy.job_timeout_secs))


def finished(job: JobFacts, report: Report, now: float, policy: Policy) -> Transition:
    """A `done` or `failed` report of the job's current attempt."""
    used = {"cpu_seconds": report["cpu_seconds"], "peak_memory_bytes": report["peak_memory_bytes"]}
    return replace(_finished(job, report, now, policy), used=used)


def _finished(job: JobFacts, report: Report, now: float, policy: Policy) -> Transition:
    result = outcome(report, policy)
    if report["status"] == "done":
        return _to(job, "done", "exit code 0", finished_at=now, **result)
    if report["requeue"] and report.get("ended_by") in wire.STOP_REASONS:
        return stopped(job, now, report["ended_by"])
    if report["requeue"]:
        return node_lost(job, now, f"node {job.node_id} gave the attempt up", policy, result)
    if report.get("ended_by") == wire.ENDED_BY_TIMEOUT or past_timeout(job, now, policy):
        # The agent stopped it at the deadline; a timeout is final, as when the
        # watcher gets there first.
        result["ended_by"] = wire.ENDED_BY_TIMEOUT
        return replace(_to(job, "failed", "timed out", finished_at=now, **result), timed_out=True)
    why = f"exit code {report['exit_code']}" + (", out of memory" if report["oom_killed"] else "") + (
        ", over its disk limit" if report.get("ended_by") == wire.ENDED_BY_DISK else "")
    return _failed(job, why, result, now, policy)


def _failed(job: JobFacts, why: str, result: dict[str, Any], now: float, policy: Policy) -> Transition:
    """A failed attempt: retried after a backoff while the retry budget lasts, else final."""
    if after_failure(job.retry_count, job.max_retries) is JobStatus.PENDING:
        delay = policy.backoff.delay(job.retry_count)
        return _to(job, "pending", f"attempt {job.attempt} failed ({why}); retrying in {delay:.1f}s",
                   retry_count=job.retry_count + 1, node_id=None, running_at=None, placed_at=None,
                   next_attempt_at=now + delay, ended_by=result["ended_by"], **NO_OUTPUT)
    return _to(job, "failed", f"{why}; no retries left", finished_at=now, **result)


def node_lost(job: JobFacts, now: float, why: str, policy: Policy, result: dict[str, Any] | None = None) -> Transition:
    """The attempt ended through no fault of the job's: run it again elsewhere without
    spending its retry budget, unless it asked not to (on_node_lost=fail) or has lost
    its node too often (max_node_losses)."""
    result = dict(result or {}, exit_code=-1)
    if job.status == "running" or gangs.is_member(job):  # an attempt ended (one only placed never started)
        result["ended_by"] = wire.ENDED_BY_NODE_LOST
    if gangs.is_member(job):  # its multi-node job decides (gangs.py)
        return _to(job, "failed", why, finished_at=now, **result)
    if job.on_node_lost == "fail":
        result["stderr"] = _append(result.get("stderr"), f"{why}; not requeued (on_node_lost=fail)")
        return _to(job, "failed", f"{why}; on_node_lost=fail", finished_at=now, **result)
    if job.node_losses >= policy.max_node_losses:
        result["stderr"] = _append(result.get("stderr"), f"{why}; the job lost its node too often "
                                                         f"(MAX_NODE_LOSSES={policy.max_node_losses})")
        return _to(job, "failed", f"{why}; lost its node {job.node_losses + 1} times", finished_at=now,
                   **result)
    return _to(job, "pending", f"{why}; requeued", node_id=None, placed_at=None, running_at=None,
               node_losses=job.node_losses + 1, **NO_OUTPUT,
               **({"ended_by": result["ended_by"]} if "ended_by" in result else {}))


STOPPED_FOR = {wire.ENDED_BY_DRAIN: "the drain of its node reached its deadline",
               wire.ENDED_BY_PREEMPTION: "preempted"}


def stopped(job: JobFacts, now: float, reason: str, forced: bool = False) -> Transition:
    """A stop the scheduler asked of the running attempt (wire.STOP_REASONS) is done:
    the job goes back to the queue, no retry spent and no node loss counted (the job
    did nothing wrong). `forced`: its agent did not report it stopped in time, and the
    scheduler requeues it itself (the agent kills it once it no longer finds it
    running there)."""
    why = STOPPED_FOR[reason] + ("; its node did not report the stop in time" if forced else "")
    if gangs.is_member(job):  # its multi-node job is requeued as one (gangs.py)
        return _to(job, "failed", why, finished_at=now, stop_reason=None, stop_at=None, exit_code=-1,
                   ended_by=reason)
    counted = {"preemptions": (getattr(job, "preemptions", 0) or 0) + 1} if reason == wire.ENDED_BY_PREEMPTION else {}
    return _to(job, "pending", f"{why}; requeued", node_id=None, placed_at=None, running_at=None,
               stop_reason=None, stop_at=None, exit_code=-1, ended_by=reason, **counted, **NO_OUTPUT)


# The watcher fails a job this long after its timeout and kill grace: by then its agent
# has stopped it and reported, unless the agent died or cannot report.
WATCHER_SLACK_SECS = 5.0


def timed_out(job: JobFacts, now: float) -> Transition:
    """The watcher's backstop: a `run` job still running past its timeout, its kill
    grace and WATCHER_SLACK_SECS (its agent died, or cannot report)."""
    return replace(_to(job, "failed", "timed out", finished_at=now, exit_code=-1, stderr="job timed out",
                       ended_by=wire.ENDED_BY_TIMEOUT), timed_out=True)


def is_late_success(job: JobFacts, report: Report, started_attempts: list[tuple[int, str]]) -> bool:
    """A `done` report of an attempt the scheduler gave up on (its node seemed lost:
    its agent, or the scheduler itself, was cut off or paused) while the job waits
    to run again. `started_attempts`: (attempt, node) of every attempt from the
    reported one on that went `running`. The reported attempt must have run on the
    reporting node, and no later attempt may have started: then its result is kept
    rather than discarded and the job run a second time."""
    if report["status"] != "done" or job.status != "pending" or report["attempt"] > job.attempt:
        return False
    if job.node_id == report["node_id"] and job.attempt == report["attempt"]:
        return False  # the current placement itself: not a late report (refused as usual)
    return started_attempts == [(report["attempt"], report["node_id"])]


def late_success(job: JobFacts, report: Report, now: float, policy: Policy) -> Transition:
    return _to(job, "done", f"attempt {report['attempt']} finished on node {report['node_id']} (exit code 0) "
                            f"after it had been requeued; its result is kept",
               finished_at=now, attempt=report["attempt"], node_id=report["node_id"], next_attempt_at=None,
               **outcome(report, policy))


# ---- multi-node jobs (gangs.py) -----------------------------------------------------------

def gang_started(job: JobFacts, now: float) -> Transition:
    """Every member of the multi-node job's attempt runs."""
    return started(job, now, None, None, None, "every member runs")


def gang_done(job: JobFacts, members: list[Any], now: float) -> Transition:
    """Every member exited 0: the job is done, with rank 0's output and what all used."""
    first = min(members, key=gangs.rank_of)
    cpu = [m.cpu_seconds for m in members if m.cpu_seconds is not None]
    peak = [m.peak_memory_bytes for m in members if m.peak_memory_bytes is not None]
    return _to(job, "done", f"every member of attempt {job.attempt} exited 0", finished_at=now, exit_code=0,
               stdout=first.stdout, stderr=first.stderr, oom_killed=False, ended_by=wire.ENDED_BY_EXIT,
               cpu_seconds=sum(cpu) if cpu else None, peak_memory_bytes=max(peak) if peak else None)


def gang_ended(job: JobFacts, member: Any, now: float, policy: Policy) -> Transition:
    """A member of the multi-node job's attempt ended other than done: the attempt ends
    as that member's did. A timeout is final; a stop (drain, preemption) or a lost node
    requeues the job as they would a job of one node; a failure spends a retry."""
    who = f"member {gangs.rank_of(member)} (job-{member.id} on {member.node_id})"
    ended_by = member.ended_by or wire.ENDED_BY_EXIT
    result = {"exit_code": member.exit_code, "stdout": member.stdout, "stderr": member.stderr,
              "oom_killed": member.oom_killed, "ended_by": ended_by}
    if ended_by == wire.ENDED_BY_TIMEOUT:
        return replace(_to(job, "failed", f"{who} timed out", finished_at=now, **result), timed_out=True)
    if ended_by in wire.STOP_REASONS:
        return stopped(job, now, ended_by)
    if ended_by == wire.ENDED_BY_NODE_LOST:
        return node_lost(job, now, f"{who} lost its node", policy, result)
    what = "was cancelled" if member.status == "cancelled" else f"failed (exit code {member.exit_code})"
    return _failed(job, f"{who} {what}", result, now, policy)


def gang_cancelled(member: JobFacts, now: float, why: str) -> Transition:
    """A member ended because its multi-node job's attempt did (its agent stops it with
    its kill signal and grace, as for any cancel)."""
    ended = {"ended_by": wire.ENDED_BY_CANCEL} if member.status == "running" else {}
    return _to(member, "cancelled", why, finished_at=now, **ended)


def cancelled(job: JobFacts, now: float) -> Transition | None:
    """None: already cancelled (a repeat changes nothing). Done and failed jobs stay."""
    if job.status == "cancelled":
        return None
    if job.status in ("done", "failed"):
        raise Conflict(f"{job.job_id} is already {job.status}; only pending or running jobs can be cancelled")
    ended = {"ended_by": wire.ENDED_BY_CANCEL} if job.status == "running" else {}
    return _to(job, "cancelled", "cancelled by request", finished_at=now, **ended)


def dependency_failed(job: JobFacts, now: float, reason: str) -> Transition:
    """A job waiting on another that ended so that its condition can never hold."""
    return _to(job, "cancelled", reason, finished_at=now)


def retried(job: JobFacts, now: float) -> Transition:
    """An operator puts a failed job back to pending with a fresh retry budget."""
    if job.status != "failed":
        raise Conflict(f"{job.job_id} is {job.status}; only failed jobs can be retried")
    return _to(job, "pending", "retried by request", retry_count=0, node_id=None, placed_at=None,
               running_at=None, finished_at=None, next_attempt_at=None, **NO_RESULT)
