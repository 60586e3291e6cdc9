"""agent/slot_cgroups.py with real cgroups (root): an ended run job's cgroup is kept and
given to the next with that job's limits, and what the next job is measured by (peak
memory, CPU time, OOM kills) is its own; a cgroup not kept by it, or one past the
number kept, is removed."""
import os
import uuid

import pytest

from corral.agent import cgroups, runner
from corral.agent.slot_cgroups import SlotCgroups

pytestmark = pytest.mark.root

PYTHON = "/usr/bin/python3"


@pytest.fixture
def manager():
    if os.geteuid() != 0:
        pytest.skip("needs root to make cgroups")
    found = cgroups.detect(root_name=f"corral-slots-{uuid.uuid4().hex[:8]}")
    if not found.enforced:
        pytest.skip(f"needs cgroups: {found.reason}")
    if not found.reusable:
        pytest.skip(f"cgroups are not reused here ({found.mode}: a v2 memory.peak cannot be reset)")
    try:
        yield found
    finally:
        found.remove_job_cgroups()
        found.cleanup()


def run_in(cg, command, tmp_path):
    return runner.start({"command": command}, str(tmp_path), {"PATH": "/usr/bin:/bin"}, 4096, cgroup=cg).result()


def limit_mb(cg) -> int:
    with open(os.path.join(cg.dirs["memory"], "memory.limit_in_bytes")) as f:
        return int(f.read()) // (1024 * 1024)


def test_the_next_run_job_gets_the_kept_cgroup_with_its_own_limits_and_counters(manager, tmp_path):
    slots = SlotCgroups(manager, keep=2)
    first = slots.take(64, 100, 64)
    # The first job uses CPU, then asks for more memory than its limit: the kernel kills it.
    hog = f"{PYTHON} -c \"import time; t=time.time()\nwhile time.time() - t < 0.3: pass\nb = bytearray(256 << 20)\""
    result = run_in(first, hog, tmp_path)
    assert cgroups.ended_by_oom(result.exit_code, first), result
    used = first.stats()
    assert used["cpu_seconds"] >= 0.2 and used["peak_memory_bytes"] >= 32 << 20, used
    slots.give_back(first)
    assert first.name in manager.list_job_cgroups()  # kept

    second = slots.take(512, 50, 128)
    assert (second.name, second.paths()) == (first.name, first.paths())
    assert limit_mb(second) == 512 and second.limits == {"memory_mb": 512, "cpu_percent": 50, "max_processes": 128}
    assert second.oom_kills() == 0 and not second.oom_killed()
    fresh = second.stats()
    assert fresh["cpu_seconds"] < 0.05 and fresh["peak_memory_bytes"] < 32 << 20, fresh
    result = run_in(second, "echo small", tmp_path)
    assert result.exit_code == 0 and not cgroups.ended_by_oom(result.exit_code, second)
    slots.give_back(second)
    slots.close()
    assert first.name not in manager.list_job_cgroups()


def test_only_as_many_as_kept_and_only_its_own_are_kept(manager):
    slots = SlotCgroups(manager, keep=1)
    a, b = slots.take(64, 100, 64), slots.take(64, 100, 64)
    assert a.name != b.name
    slots.give_back(a)
    slots.give_back(b)  # one is kept already
    assert sorted(manager.list_job_cgroups()) == [a.name]
    other = manager.create("job-9-1", 64, 100, 64)  # a service's, named after it
    slots.give_back(other)
    assert "job-9-1" not in manager.list_job_cgroups()
    slots.close()
    assert manager.list_job_cgroups() == []
