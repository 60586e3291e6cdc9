"""What the scheduler's routes use, and the job views they share.

The store, settings, clock, the waiting room, the event stream's hub and budget, the
registry clients..., built once per process by wiring.py, and the job views they share:
an operator's and an agent's."""
from collections.abc import Callable
from dataclasses import dataclass

from corral.server import audit_trail, auth, revocations
from corral.shared.clients import RegistryClient
from corral.shared.errors import Forbidden, NotFound

from .. import contract, event_stream, gangs, longpoll, stream_hub, views
from ..event_log import EventLog
from ..identities import Identities
from ..job_logs import JobLogs
from ..schedules import Schedules
from ..service import Scheduler
from ..settings import SchedulerSettings
from ..store import Store

MAX_PAGE = 1000  # the most items one page of a list answers (`limit`)


def require_team_admin(team: str, change: str) -> None:
    """Forbidden unless this request's user administers `team` (its admins and cluster
    admins do); `change` says what they may not do ("change its members")."""
    if not auth.principal().administers(team):
        raise Forbidden(f"only the admins of team {team!r} and cluster admins {change}")


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
    tokens: Identities
    schedules: Schedules
    job_logs: JobLogs
    event_log: EventLog
    hub: stream_hub.StreamHub
    stream_budget: stream_hub.StreamBudget
    stream_timing: event_stream.Timing
    drain_registry: RegistryClient
    revoke_registry: RegistryClient

    def job_view(self, job, members: bool = False) -> contract.Job:
        """A job as this request's user sees it: its env var values only for its submitter,
        its team's admins and cluster admins (corral.server.principals). A node's agent sees
        them: it runs the job. `members`: a job of many nodes lists them."""
        who = auth.calling_principal()
        listed = self.store.gangs.members(job.id) if members and gangs.spans_nodes(job) else None
        return views.job(job, self.settings, self.clock(),
                         hide_env=who is not None and not who.sees_env(job.team, job.submitted_by), members=listed)

    def job(self, job_id: str):
        """The job `job_id` if this request's user may see it; another team's job is
        NotFound, as a job that does not exist (so ids tell nothing)."""
        job = self.store.jobs.get(job_id)
        if not auth.principal().can_see(job.team):
            raise NotFound(f"no job {job_id!r}")
        audit_trail.note(team=job.team)
        return job

    def require_visible(self, job_id: str) -> None:
        """NotFound unless this request's user may see the job (no read for those who see all)."""
        if not auth.principal().sees_every_team:
            self.job(job_id)

    def require_changeable(self, job_id: str) -> None:
        """Cancel, retry: NotFound for a job the user may not see, Forbidden for one of their
        team's they may not change (only its submitter, the team's admins, cluster admins)."""
        who = auth.principal()
        job = self.job(job_id)
        if not who.can_change_job(job.team, job.submitted_by):
            raise Forbidden(f"only its submitter ({job.submitted_by}), the admins of team {job.team!r} and "
                            f"cluster admins may change {job.job_id}")

    def require_array(self, array_id: str, change: bool = False) -> None:
        """The same checks for an array, by the team and submitter of its jobs."""
        who = auth.principal()
        if who.is_admin and not who.read_only or not change and who.sees_every_team:
            return
        owner = self.store.jobs.array_owner(array_id)
        if owner is None or not who.can_see(owner[0]):
            raise NotFound(f"no array {array_id!r}")
        if change and not who.can_change_job(*owner):
            raise Forbidden(f"only its submitter ({owner[1]}), the admins of team {owner[0]!r} and cluster "
                            f"admins may change {array_id}")

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
