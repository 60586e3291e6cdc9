"""What each team is allowed, as every request and placement reads it: its largest
`timeout_secs`, its quota and its share in fair share.

Each process keeps them and reads them again at most every TEAM_SETTINGS_SECS, so that
a submit or a placement reads no team row: a change an admin makes applies within that
time on every process (at once on the one that made it, which calls `forget`)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .. import fairshare, quotas
from ..models import Team
from .rows import json_value, tuples

TEAM_SETTINGS_SECS = 2.0


class TeamSettings:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._max_timeouts: dict[str, float] = {}
        self._quotas: dict[str, quotas.Quota] = {}
        self._shares: dict[str, int] = {}

    def max_timeout(self, team: str) -> float | None:
        """The team's max_timeout_secs (None: none)."""
        with self._lock:
            self._fresh()
            return self._max_timeouts.get(team)

    def quotas(self) -> dict[str, quotas.Quota]:
        """The teams that have a quota, with it (empty: no team has one)."""
        with self._lock:
            self._fresh()
            return self._quotas

    def shares(self) -> dict[str, int]:
        """Every team with its fair-share weight."""
        with self._lock:
            self._fresh()
            return self._shares

    def forget(self) -> None:
        """Read them again at the next question (this process changed a team)."""
        with self._lock:
            self._read_at = None

    def _fresh(self) -> None:
        now = self._clock()
        if self._read_at is not None and 0 <= now - self._read_at < TEAM_SETTINGS_SECS:
            return
        rows = tuples(Team.select(Team.name, Team.max_timeout_secs, Team.quota, Team.share))
        self._max_timeouts, self._quotas, self._shares = {}, {}, {}
        for name, max_timeout, quota, share in rows:
            self._shares[name] = fairshare.DEFAULT_SHARE if share is None else share
            if max_timeout is not None:
                self._max_timeouts[name] = max_timeout
            if quota is not None:
                self._quotas[name] = quotas.Quota.from_dict(json_value(quota))
        self._read_at = now
