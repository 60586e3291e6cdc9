"""Schedules in end-to-end tests: create one, and count its jobs by slot."""
import collections
import math
import random
import time

import requests

from corral.shared.timeutil import epoch, iso
from helpers import wait_for


def first_slot_soon(lead: float = 1.5) -> float:
    """A whole second at least `lead` seconds from now: the first slot of an interval
    schedule created now (its `start_at`)."""
    return float(math.ceil(time.time() + lead))


def create(url: str, **body) -> dict:
    answer = requests.post(url + "/schedules", json=body, timeout=10)
    assert answer.status_code == 201, answer.text
    return answer.json()


def disable(url: str, name: str) -> None:
    requests.patch(f"{url}/schedules/{name}", json={"enabled": False}, timeout=10).raise_for_status()


def runs(url: str, name: str) -> list[dict]:
    """Every run of the schedule, oldest slot first (at most 1,000)."""
    answer = requests.get(f"{url}/schedules/{name}/runs", params={"limit": 1000}, timeout=10)
    answer.raise_for_status()
    return sorted(answer.json(), key=lambda run: run["slot"])


def jobs_by_slot(jobs: dict[str, dict], name: str) -> dict[float, list[dict]]:
    """The schedule's jobs (from all_jobs) grouped by their slot, in epoch seconds."""
    by_slot: dict[float, list[dict]] = collections.defaultdict(list)
    for job in jobs.values():
        if job["schedule"] == name:
            by_slot[epoch(job["slot"])].append(job)
    return dict(by_slot)


def wait_slot_fired(url: str, name: str, slot: float, timeout: float = 30.0) -> None:
    """Until the schedule has a run for `slot` or a later one."""
    def fired():
        newest = requests.get(f"{url}/schedules/{name}/runs", params={"limit": 1}, timeout=5).json()
        return bool(newest) and epoch(newest[0]["slot"]) >= slot
    wait_for(fired, timeout=timeout, interval=0.1, message=f"{name} to fire its slot {iso(slot)}")


def assert_one_job_per_slot(by_slot: dict[float, list[dict]], first: float, last: float, every: float = 1.0) -> None:
    """Exactly one job for each slot from `first` to `last` (and for any later slot the
    schedule fired before it was disabled), and none for any other time."""
    doubled = {iso(slot): [j["job_id"] for j in jobs] for slot, jobs in by_slot.items() if len(jobs) > 1}
    assert not doubled, f"slots with more than one job: {doubled}"
    newest = max(by_slot, default=first)
    expected = {first + k * every for k in range(round((max(newest, last) - first) / every) + 1)}
    missing = sorted(iso(slot) for slot in expected - set(by_slot))
    assert not missing, f"slots without a job: {missing}"
    strays = sorted(iso(slot) for slot in set(by_slot) - expected)
    assert not strays, f"jobs for times that are not slots: {strays}"


def random_moment(rng: random.Random, low: float, high: float) -> None:
    """Wait a random time, so that what follows (a kill) lands anywhere in a pass."""
    time.sleep(rng.uniform(low, high))
