"""Reconciling what the agent holds with what the scheduler lists as running here.

Which jobs ended there, which are stale, which were lost here. Pure: keys and counters
in, decisions out; agent.Agent acts on them (kills, drops, reports).

A job the agent holds that the scheduler no longer lists was ended there (timed
out, moved, cancelled): the agent kills it (a claimed one not started yet is
dropped), and reports nothing. A job the scheduler lists that the agent neither
holds nor still has a report for was lost here (a restart, a claim whose answer
never arrived): it is reported failed, but only once every claim sent before the
list was read has been handled, since such a claim may be bringing it.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corral.shared import wire

Key = tuple[str, int]  # (job_id, attempt)


def job_attempt(job: dict[str, Any]) -> int:
    """The attempt a job dict belongs to: `attempt` if the scheduler sends one,
    otherwise `retry_count` (the attempt number in the design's job fields)."""
    value = job.get("attempt")
    if value is None:
        value = job.get("retry_count") or 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"job {job.get('job_id')!r} has a bad attempt number {value!r}")
    return value


def job_key(job: dict[str, Any]) -> Key:
    """(job_id, attempt) of a job dict; ValueError, KeyError or TypeError when it has none."""
    return str(job["job_id"]), job_attempt(job)


def listed_keys(jobs: Iterable[Any]) -> tuple[set[Key], list[Any]]:
    """The keys of the jobs a list names, and the items that are not jobs."""
    keys, malformed = set(), []
    for job in jobs:
        try:
            keys.add(job_key(job))
        except (KeyError, TypeError, ValueError, AttributeError):
            malformed.append(job)
    return keys, malformed


def stops_asked(jobs: Iterable[Any]) -> dict[Key, str]:
    """The attempts a lease answer asks stopped now, with why (wire.STOP_REASONS); an
    item that is not one, or names another reason, asks nothing."""
    asked = {}
    for job in jobs:
        try:
            reason = job.get("stop")
            if reason in wire.STOP_REASONS:
                asked[job_key(job)] = reason
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return asked


def ended_there(held: Iterable[Key], listed: set[Key]) -> list[Key]:
    """The jobs held here (running or claimed) that the scheduler no longer lists."""
    return sorted(set(held) - listed)


def stale(held: Iterable[tuple[Key, float]], listed: set[Key], sent_at: float) -> list[Key]:
    """Of the jobs held here, each (key, accepted at), those missing from a list the
    scheduler answered to a request sent at `sent_at`: only jobs accepted before it
    count (the scheduler had them running when it read the list)."""
    return sorted(key for key, accepted_at in held if accepted_at < sent_at and key not in listed)


def lost_here(listed: set[Key], known: set[Key], suspects: dict[Key, int], claims_sent: int,
              claims_done: int) -> tuple[list[Key], dict[Key, int]]:
    """The listed jobs the agent does not know (`known`: held, claimed, or with a
    report pending) that no claim can bring any more, and the suspects left.

    `suspects` maps each unknown job to the number of claims sent when it was first
    seen; it is lost once at least that many claims have been handled
    (`claims_done`). `claims_sent`: the claims sent when this list was read."""
    unknown = listed - known
    waiting = {key: suspects.get(key, claims_sent) for key in unknown}
    lost = sorted(key for key in unknown if claims_done >= waiting[key])
    for key in lost:
        del waiting[key]
    return lost, waiting
