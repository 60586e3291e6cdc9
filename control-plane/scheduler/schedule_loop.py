"""The loop that fires schedules.

A leased loop: one process across workers and replicas turns every due slot into a job
(schedules.Schedules.fire: one transaction per schedule, each write fenced by the lease)
and places them, within about a second of the slot's time on an idle scheduler.
"""
import logging
import time
from collections.abc import Callable

from corral.shared.backoff import Backoff
from corral.server.leased import PacedLoop
from corral.server.leader import LeaseLost

from .schedules import Schedules
from .service import Scheduler
from .store import Store

log = logging.getLogger(__name__)

LEASE_NAME = "scheduler-schedules"
LEASE_TTL_SECS = 10.0
# The longest sleep between passes: a new or changed schedule is seen within it.
SCHEDULE_POLL_SECS = 1.0
# A schedule that fails to fire (not its template: that is a failed run) is tried
# again after 1 s, then 2, 4, ... at most this: none of its slots is lost meanwhile.
FAILING_BACKOFF_CAP_SECS = 60.0


class Firing(PacedLoop[Store]):
    """One pass fires the due slots of every schedule; it answers how long to sleep: until
    the earliest next slot, at most SCHEDULE_POLL_SECS (so a schedule created or changed
    meanwhile is seen within that). A slot earlier than the moment this process took
    the lease over, or woke after a pause longer than the lease (stopped, starved, its
    host suspended), was missed: catch_up decides what becomes of it."""

    doing = "firing schedules"
    idle = LEASE_TTL_SECS / 4

    def __init__(self, store: Store, holder: str | None = None):
        # Slots before the tenure began were missed (catch_up decides them).
        super().__init__(store, LEASE_NAME, LEASE_TTL_SECS, holder, max_backoff=5.0)
        self.schedules = Schedules(self.store)
        self.scheduler = Scheduler(self.store)
        self.catch_up_max = store.settings.schedule_catch_up_max
        # Schedules that failed to fire: when each is tried again, and its backoff.
        # This process's pacing only; the schedule's slots are in the database.
        self.failing: dict[int, tuple[float, Backoff]] = {}

    def one_pass(self, now: float) -> float:
        created = 0
        for schedule_id in self.schedules.due(now):
            retry_at, backoff = self.failing.get(schedule_id, (now, None))
            if retry_at > now:
                continue
            try:
                fired = self.schedules.fire(schedule_id, now, self.tenure.since, self.catch_up_max)
            except LeaseLost:
                raise
            except Exception:  # one schedule's trouble holds up no other
                backoff = backoff or Backoff(1.0, FAILING_BACKOFF_CAP_SECS)
                delay = backoff.next()
                self.failing[schedule_id] = (now + delay, backoff)
                log.exception("firing schedule %d failed; it is tried again in %.0fs", schedule_id, delay)
                continue
            self.failing.pop(schedule_id, None)
            created += len(fired.created)
        if created:
            self.scheduler.place(now)
        following = self.schedules.next_slot()
        return SCHEDULE_POLL_SECS if following is None else max(0.0, min(SCHEDULE_POLL_SECS, following - now))


def start(store: Store, clock: Callable[[], float] = time.time):
    """Run the loop in this process (every gunicorn worker; the lease picks one)."""
    return Firing(store).start("schedules", SCHEDULE_POLL_SECS, clock)
