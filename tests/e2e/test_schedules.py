"""Schedules with real processes on SQLite (a gunicorn scheduler with two workers,
whose firing loops compete for one lease): every slot makes exactly one job
through three kill -9s of the whole scheduler; `catch_up: latest` makes one job
for ten seconds of downtime; `overlap: skip` never has two runs at once.

Jobs are counted from the API by their `slot`, never from the scheduler's own
bookkeeping. Random moments come from a seed printed with the test's output.
"""
import os
import random
import time

import pytest

from cluster import Cluster, all_jobs, started
from corral.shared.timeutil import epoch, iso
from helpers import wait_for
from schedule_support import (assert_one_job_per_slot, create, disable, first_slot_soon, jobs_by_slot, random_moment,
                              runs, wait_slot_fired)

pytestmark = pytest.mark.e2e

# The firing loop's lease (schedule_loop.LEASE_TTL_SECS): a scheduler killed while it
# holds it is taken over this long after its last pass, at the latest.
LEASE_SECS = 10.0
SLOTS = 60


@pytest.fixture
def rng():
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"random seed {seed}")
    return random.Random(seed)


def test_every_slot_makes_exactly_one_job_through_three_kill_9s(tmp_path, request, rng):
    c = Cluster(tmp_path)
    with started(c, request):
        c.start_agent("node-1", slots=4)
        c.wait_nodes_healthy("node-1")
        first = first_slot_soon()
        last = first + SLOTS - 1
        create(c.scheduler_url, name="tick", interval_secs=1, start_at=iso(first), catch_up="all",
               job={"command": "true"})
        resumed = first
        for kill in range(3):
            # Firing again (after the start, or the takeover of the last restart's lease),
            # then a random moment later the whole scheduler dies: master and both workers.
            wait_slot_fired(c.scheduler_url, "tick", resumed, timeout=LEASE_SECS + 20)
            random_moment(rng, 0.0, 2.0)
            c.procs["scheduler"].kill()
            killed_at = time.time()
            c.start_scheduler()
            resumed = killed_at + 1
            print(f"kill -9 #{kill + 1} at slot {killed_at - first:.2f}; restarted")
        assert resumed < last, "the kills happened within the 60 slots"
        wait_slot_fired(c.scheduler_url, "tick", last, timeout=last - time.time() + LEASE_SECS + 20)
        disable(c.scheduler_url, "tick")

        by_slot = jobs_by_slot(all_jobs(c.scheduler_url), "tick")
        assert min(by_slot) == first
        assert_one_job_per_slot(by_slot, first, last)
        assert [r["job_id"] for r in runs(c.scheduler_url, "tick") if r["job_id"] is None] == []  # none skipped
        # They are real jobs: every one runs, the caught-up ones too.
        ids = [jobs[0]["job_id"] for jobs in by_slot.values()]
        wait_for(lambda: all(j["status"] == "done" for j in (all_jobs(c.scheduler_url)[i] for i in ids)),
                 timeout=60, message="every scheduled job to be done")


def test_catch_up_latest_after_ten_seconds_down_makes_one_job_for_the_missed_slots(tmp_path, request):
    c = Cluster(tmp_path)
    with started(c, request):
        first = first_slot_soon()
        create(c.scheduler_url, name="tick", interval_secs=1, start_at=iso(first), catch_up="latest",
               job={"command": "true"})
        wait_slot_fired(c.scheduler_url, "tick", first + 2)
        c.procs["scheduler"].stop()
        down_at = time.time()
        time.sleep(10)  # the downtime itself: ten slots pass with no scheduler
        c.start_scheduler()
        back_at = time.time()
        wait_slot_fired(c.scheduler_url, "tick", back_at + 3)
        disable(c.scheduler_url, "tick")

        by_slot = jobs_by_slot(all_jobs(c.scheduler_url), "tick")
        assert all(len(jobs) == 1 for jobs in by_slot.values()), by_slot
        made = sorted(by_slot)
        gaps = [(before, after) for before, after in zip(made, made[1:]) if after - before > 1]
        # One gap: the slots missed while down made no job but the newest of them.
        assert len(gaps) == 1, [(iso(a), iso(b)) for a, b in gaps]
        before, latest = gaps[0]
        assert before < down_at + 1 and latest > down_at + 9
        assert made == [first + k for k in range(round(before - first) + 1)] + \
            [latest + k for k in range(round(made[-1] - latest) + 1)]
        skipped = [r for r in runs(c.scheduler_url, "tick") if r["job_id"] is None]
        assert [epoch(r["slot"]) for r in skipped] == [before + k for k in range(1, round(latest - before))]
        assert len(skipped) >= 8
        assert all(r["skipped"] == "missed while the scheduler was down (catch_up: latest)" for r in skipped)


def test_overlap_skip_never_runs_two_at_once(tmp_path, request):
    c = Cluster(tmp_path)
    with started(c, request):
        c.start_agent("node-1", slots=4)
        c.wait_nodes_healthy("node-1")
        first = first_slot_soon()
        # Each run takes about three slots; the node could run four at once.
        create(c.scheduler_url, name="slow", interval_secs=1, start_at=iso(first), overlap="skip",
               job={"command": "sleep 2.5"})
        wait_slot_fired(c.scheduler_url, "slow", first + 10, timeout=40)
        disable(c.scheduler_url, "slow")

        jobs = [js[0] for js in jobs_by_slot(all_jobs(c.scheduler_url), "slow").values()]
        finished = wait_for(lambda: (lambda listed: listed if all(j["status"] == "done" for j in listed) else None)(
            [all_jobs(c.scheduler_url)[j["job_id"]] for j in jobs]), timeout=30, message="the runs to end")
        spans = sorted((epoch(j["running_at"]), epoch(j["finished_at"]), j["job_id"]) for j in finished)
        assert len(spans) >= 3, spans
        for (_, ended, one), (began, _, following) in zip(spans, spans[1:]):
            assert began >= ended, f"{following} started at {iso(began)} before {one} ended at {iso(ended)}"
        skipped = [r for r in runs(c.scheduler_url, "slow") if r["job_id"] is None]
        assert len(skipped) >= len(spans) - 1, "slots while a run was on were skipped"
        assert all(r["skipped"].startswith("overlap: skip: job-") for r in skipped)
