"""Schedules on two scheduler replicas sharing one PostgreSQL database (each a
gunicorn master with two workers): the replica firing them is stopped past its
lease and woken again, then the other one is killed (kill -9) and restarted, and
every slot still makes exactly one job. Jobs are counted from the API by slot."""
import os
import random
import signal
import time

import psycopg
import pytest

from cluster import Cluster, all_jobs, holder_pid, replica_of
from corral.scheduler.schedule_loop import LEASE_NAME, LEASE_TTL_SECS
from corral.shared.timeutil import iso
from helpers import wait_for
from schedule_support import assert_one_job_per_slot, create, disable, first_slot_soon, jobs_by_slot, random_moment, \
    wait_slot_fired

pytestmark = pytest.mark.e2e

B = "scheduler-b"
SLOTS = 45


def firing_replica(c: Cluster, db) -> str | None:
    """The replica whose worker holds the schedules' lease now (None: nobody, or it expired)."""
    row = db.execute("SELECT holder FROM corral_scheduler.lease WHERE name = %s "
                     "AND expires_at > EXTRACT(EPOCH FROM clock_timestamp())", (LEASE_NAME,)).fetchone()
    return None if row is None else replica_of(c, holder_pid(row[0]))


def test_two_replicas_make_exactly_one_job_per_slot_through_a_pause_and_a_kill_9(tmp_path, request, pg_url):
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"random seed {seed}")
    rng = random.Random(seed)
    c = Cluster(tmp_path, database_url=pg_url)
    try:
        c.start_registry()
        c.start_scheduler()
        c.start_scheduler(name=B)
        first = first_slot_soon()
        last = first + SLOTS - 1
        create(c.url_of(B), name="tick", interval_secs=1, start_at=iso(first), catch_up="all",
               job={"command": "true"})
        with psycopg.connect(pg_url, autocommit=True, connect_timeout=10) as db:
            wait_slot_fired(c.scheduler_url, "tick", first + 1)
            paused = wait_for(lambda: firing_replica(c, db), timeout=10, message="a replica to fire the schedule")
            other = B if paused == "scheduler" else "scheduler"
            random_moment(rng, 0.0, 1.0)
            c.procs[paused].signal(signal.SIGSTOP)  # master and workers, maybe in the middle of a pass
            stopped_at = time.time()
            try:
                wait_for(lambda: firing_replica(c, db) == other, timeout=LEASE_TTL_SECS + 10,
                         message=f"{other} to take the schedules over from the stopped {paused}")
                wait_slot_fired(c.url_of(other), "tick", stopped_at + LEASE_TTL_SECS + 1)
            finally:
                c.procs[paused].signal(signal.SIGCONT)  # it wakes, and must not fire what was fired
            print(f"{paused} stopped at slot {stopped_at - first:.2f} for {time.time() - stopped_at:.1f}s")

            random_moment(rng, 1.0, 3.0)
            c.procs[other].kill()
            killed_at = time.time()
            c.start_scheduler(name=other)
            print(f"{other} killed at slot {killed_at - first:.2f}; restarted")
            wait_slot_fired(c.url_of(paused), "tick", killed_at + 1, timeout=LEASE_TTL_SECS + 20)
            assert killed_at + 1 < last, "the pause and the kill happened within the slots"
            wait_slot_fired(c.scheduler_url, "tick", last, timeout=last - time.time() + LEASE_TTL_SECS + 20)
        disable(c.scheduler_url, "tick")

        by_slot = jobs_by_slot(all_jobs(c.url_of(B)), "tick")
        assert min(by_slot) == first
        assert_one_job_per_slot(by_slot, first, last)
    finally:
        c.stop()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(c.logs())
