"""The work dirs' own filesystems (agent/diskfs.py): which mode the agent chooses from
what its start-up probe found, what a job that failed on a full filesystem reports,
and the watch ending a job whose filesystem is full
(test_disk_fs_integration.py: real loop mounts under `corral-agent` processes)."""
import os
import shutil

import pytest

from corral.agent import diskfs, disk
from corral.agent.endings import Report, ended_by, report_of
from corral.agent.jobs import RUNNING, JobTable, LocalJob
from corral.shared.errors import SettingError
from helpers import unmount_under

WORKS = diskfs.Probe(root=True, loop_control=True, mkfs="/sbin/mkfs.ext4", trial=None)


@pytest.mark.parametrize("probe, why", [
    (diskfs.Probe(False, True, "/sbin/mkfs.ext4", None), "the agent is not root"),
    (diskfs.Probe(True, False, "/sbin/mkfs.ext4", None), "/dev/loop-control is missing or not usable"),
    (diskfs.Probe(True, True, None, None), "mkfs.ext4 is not installed"),
    (diskfs.Probe(True, True, "/sbin/mkfs.ext4", "mount failed: no loop"), "a trial filesystem failed: mount failed: "
                                                                          "no loop"),
])
def test_auto_falls_back_to_the_watch_saying_why_and_fs_refuses_to_start(probe, why):
    assert diskfs.decide("auto", probe) == (False, why)
    with pytest.raises(SettingError) as raised:
        diskfs.decide("fs", probe)
    assert raised.value.message == f"AGENT_DISK_LIMIT_MODE is fs but this node cannot give jobs a filesystem: {why}"


def test_auto_and_fs_use_filesystems_where_the_probe_worked_and_watch_never_probes():
    assert diskfs.decide("auto", WORKS)[0] is True
    assert diskfs.decide("fs", WORKS)[0] is True
    assert diskfs.decide("watch", None) == (False, "AGENT_DISK_LIMIT_MODE is watch")


def test_a_filesystem_is_full_below_a_few_blocks_free():
    assert diskfs.is_full(0) and diskfs.is_full(29696)
    assert not diskfs.is_full(diskfs.FULL_BYTES)


def test_a_job_that_failed_on_its_full_filesystem_is_ended_by_disk_with_its_own_exit_code():
    got = report_of(None, 1, "head: error writing 'big': No space left on device", setup_failed=False,
                    oom_limit_mb=None, node_id="n", lease_secs=20, disk_mb=20, disk_full=True)
    assert got == Report("failed", 1, "head: error writing 'big': No space left on device\n"
                         "job reached its disk limit of 20 MB: its work dir is a filesystem of that size and it "
                         "is full (writes failed with 'No space left on device')")
    assert ended_by(None, False, disk_full=True) == "disk"
    # Success on a full filesystem is a success; without one, nothing changes.
    assert report_of(None, 0, "", setup_failed=False, oom_limit_mb=None, node_id="n", lease_secs=20, disk_mb=20,
                     disk_full=True) == Report("done", 0, "")
    assert ended_by(None, False) is None


def test_the_watch_ends_a_running_job_whose_filesystem_is_full(tmp_path):
    jobs = JobTable()
    local = LocalJob("job-1", 1, "run", str(tmp_path), 0.0, None, process=object(), disk_mb=20)
    local.prepared.set()
    assert local.state == RUNNING
    jobs.add(local)
    ended = []
    watch = disk.DiskWatch(str(tmp_path), 0, 1.0, jobs, lambda job, why: ended.append((job.key, why)) or True,
                           free=lambda path: 10 ** 12, measure=lambda path: disk.Usage(18 * 1024 * 1024, True),
                           full=lambda path: path == str(tmp_path))
    assert watch.check_jobs() == [("job-1", 1)]
    assert ended == [(("job-1", 1), "disk")]


@pytest.fixture
def fs(tmp_path):
    if os.geteuid() != 0 or not os.access("/dev/loop-control", os.R_OK | os.W_OK) or not shutil.which("mkfs.ext4"):
        pytest.skip("work dir filesystems need root, /dev/loop-control and mkfs.ext4")
    made = diskfs.DiskFs(str(tmp_path / "disk"), str(tmp_path / "work"))
    os.makedirs(made.work_root)
    try:
        yield made
    finally:
        unmount_under(str(tmp_path))


def test_the_start_up_sweep_removes_what_an_earlier_agent_left_but_the_adopted_services(fs):
    kept, left = os.path.join(fs.work_root, "svc-1"), os.path.join(fs.work_root, "job-1")
    for path in (kept, left):
        os.mkdir(path)
        assert fs.create(path, 8)
    with open(os.path.join(left, "data"), "wb") as f:
        f.write(b"x" * 4096)
    assert fs.sweep([kept]) == 1
    assert diskfs.mounted(kept) and os.path.exists(fs.image_path(kept))
    assert not diskfs.mounted(left) and not os.path.exists(fs.image_path(left)) and os.listdir(left) == []
    fs.release(kept)
    assert not diskfs.mounted(kept) and os.listdir(fs.image_root) == []


def test_a_filesystem_that_cannot_be_made_leaves_nothing_and_the_job_keeps_its_work_dir(fs):
    workdir = os.path.join(fs.work_root, "job-2")
    os.mkdir(workdir)
    assert fs.create(workdir, 0) is False  # mkfs refuses an empty image: the watch holds this one
    assert not diskfs.mounted(workdir) and os.path.isdir(workdir) and os.listdir(fs.image_root) == []


def test_the_probe_works_here_and_clears_a_trial_a_killed_agent_left(fs):
    leftover = os.path.join(fs.image_root, ".probe-old", "mnt")
    os.makedirs(leftover)
    assert fs.create(leftover, diskfs.PROBE_MB, quiet=False)
    assert fs.probe() == diskfs.Probe(True, True, shutil.which("mkfs.ext4"), None)
    assert not diskfs.mounted(leftover) and os.listdir(fs.image_root) == []
