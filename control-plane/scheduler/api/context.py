"""What the scheduler's routes use, and the job views they share.

The store, settings, clock, the waiting room, the event stream's hub and budget, the
registry clients..., built once per process by wiring.py, and the job views they share:
an operator's and an agent's."""
from collections.abc import Callable
from dataclasses import dataclass

from corral.server import auth, revocations
from corral.shared.clients import RegistryClient

from .. import contract, event_stream, longpoll, stream_hub, views
from ..event_log import EventLog
from ..job_logs import JobLogs
from ..schedules import Schedules
from ..service import Scheduler
from ..settings import SchedulerSettings
from ..store import Store

MAX_PAGE = 1000  # the most items one page of a list answers (`limit`)


@dataclass(frozen=True)
class SchedulerApi:
    """The context every scheduler route handler gets first. `drain_registry` and
    `revoke_registry`: the registry clients of the drain and revoke routes (their own
    timeouts)."""

    settings: SchedulerSettings
    store: Store
    scheduler: Scheduler
    clock: Callable[[], float]
    room: longpoll.WaitRoom
    floors: revocations.Floors
    schedules: Schedules
    job_logs: JobLogs
    event_log: EventLog
    hub: stream_hub.StreamHub
    stream_budget: stream_hub.StreamBudget
    stream_timing: event_stream.Timing
    drain_registry: RegistryClient
    revoke_registry: RegistryClient

    def job_view(self, job) -> contract.Job:
        """A job as an operator (or the read-only token, without env values) sees it."""
        return views.job(job, self.settings, self.clock(), hide_env=auth.read_only())

    def agent_view(self, job) -> contract.Job:
        """A job as its node's agent gets it: with the grant that lets the node record the
        job's service in the registry (shared/credentials.py; none without tokens)."""
        grant = None
        if job.job_type == "service" and job.node_id is not None:
            grant = self.settings.credentials.service_grant(job.job_id, job.attempt, job.node_id)
        return views.job(job, self.settings, self.clock(), grant)


def require_items_node(items) -> None:
    """Every item of an agent's batch must be about the agent's own node."""
    for _, item in items:
        if isinstance(item, dict):
            auth.require_node(item["node_id"])
