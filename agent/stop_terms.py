"""How a claimed job asks to be stopped and warned, read from the scheduler's job.

Every end Corral causes (its timeout, a cancel or preemption, the agent stopping or
losing its lease) sends the job's `kill_signal` to all its processes, waits its
`kill_grace_secs`, then SIGKILLs what is left. A `run` job with `signal_before_end`
gets that signal `secs` before its timeout, once. Pure: the job dict and the times
come in.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass

from corral.shared import wire


@dataclass(frozen=True)
class StopTerms:
    kill_signal: int = signal.SIGTERM
    kill_grace: float | None = None   # None: the agent's AGENT_KILL_GRACE_SECS (a scheduler that sent none)
    warn_signal: int | None = None
    warn_before: float | None = None  # seconds before the deadline

    def grace(self, node_end: bool, agent_grace: float) -> float:
        """The seconds between the stop signal and SIGKILL. An end the node causes for
        itself (`node_end`: the agent stopping, its lease lapsed) waits no longer than
        the agent's own AGENT_KILL_GRACE_SECS, which is all a stopping agent has."""
        own = agent_grace if self.kill_grace is None else self.kill_grace
        return min(own, agent_grace) if node_end else own

    def warn_at(self, deadline: float | None) -> float | None:
        """When the warning is due (the deadline's clock), or None: no warning."""
        if deadline is None or self.warn_signal is None or self.warn_before is None:
            return None
        return deadline - self.warn_before


def signal_number(name: object) -> int | None:
    """The number of a signal the scheduler names (wire.JOB_SIGNALS), else None."""
    if not isinstance(name, str) or name not in wire.JOB_SIGNALS:
        return None
    return int(getattr(signal, "SIG" + name))


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        return None
    return float(value)


def stop_terms(job: dict) -> StopTerms:
    """The job's terms; what is missing or malformed (a scheduler of an older release)
    is the default: TERM, the agent's grace, no warning."""
    warning = job.get("signal_before_end")
    warn_signal = warn_before = None
    if isinstance(warning, dict):
        warn_signal, warn_before = signal_number(warning.get("signal")), _seconds(warning.get("secs"))
        if warn_signal is None or not warn_before:
            warn_signal = warn_before = None
    return StopTerms(kill_signal=signal_number(job.get("kill_signal")) or signal.SIGTERM,
                     kill_grace=_seconds(job.get("kill_grace_secs")),
                     warn_signal=warn_signal, warn_before=warn_before)
