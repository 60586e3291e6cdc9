"""Asking the scheduler again and again (`--wait`, `logs -f`), riding out a scheduler that
cannot be reached for a while."""
from typing import Callable

from corral.shared.clients import Unreachable

from .common import Env, note

POLL_SECS = 0.5  # how often --wait and logs -f ask
LOST_LIMIT_SECS = 60.0  # how long they keep trying while the scheduler cannot be reached
SIGINT_EXIT = 130


class Poller:
    """Reads a job (or what `fetch` reads) again and again; rides out a scheduler that is
    briefly unreachable."""

    def __init__(self, env: Env, job_id: str, quiet: bool = False, fetch: Callable[[], dict] | None = None):
        self.env, self.job_id, self.quiet = env, job_id, quiet
        self.fetch = fetch or (lambda: env.scheduler.get_job(job_id))
        self.lost_since: float | None = None

    def next(self) -> dict:
        while True:
            self.env.sleep(POLL_SECS)
            try:
                fresh = self.fetch()
            except Unreachable as exc:
                now = self.env.now()
                if self.lost_since is None:
                    self.lost_since = now
                    if not self.quiet:
                        note(f"corral: cannot reach the scheduler ({exc.reason}); still trying")
                elif now - self.lost_since > LOST_LIMIT_SECS:
                    raise
                continue
            if self.lost_since is not None and not self.quiet:
                note("corral: the scheduler answers again")
            self.lost_since = None
            return fresh
