"""Who jobs run as: a uid per job by default, a fixed user, explicit root, errors,
work dir ownership; the uid pool."""
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import threading

import pytest

from corral.agent import identity, uids
from corral.agent.launch import User
from corral.shared.errors import SettingError
from helpers import wait_for

NOBODY = pwd.getpwnam("nobody")
RANGE = (70000, 79999)


def test_root_agent_runs_each_job_as_a_uid_of_its_own_by_default(tmp_path):
    users = identity.job_users(uid_range=RANGE, pool_path=str(tmp_path / "uids.json"), euid=0,
                               claims_dir=str(tmp_path / "claims"))
    assert users.mode == "per-job"
    first = users.acquire("job-1-1", "/w/job-1-1")
    second = users.acquire("job-2-1", "/w/job-2-1")
    assert (first.uid, first.gid, first.groups, first.switch) == (70000, 70000, (), True)
    assert second.uid == second.gid == 70001
    assert first.launch_user() == User(70000, 70000, ())
    # No passwd entry: the name is made up, HOME is the work dir.
    assert first.env("/w/job-1-1") == {"HOME": "/w/job-1-1", "USER": "corral-70000", "LOGNAME": "corral-70000"}
    assert users.acquire("job-1-1", "/w/job-1-1").uid == 70000  # asked again: the same
    assert users.describe()["uid_range"] == "70000-79999"


def test_a_fixed_job_user_is_what_agent_job_user_names():
    users = identity.job_users(user="nobody", uid_range=RANGE, euid=0)
    assert users.mode == "fixed"
    who = users.acquire("job-1-1", "/w")
    assert (who.uid, who.name) == (NOBODY.pw_uid, "nobody") and users.acquire("job-2-1", "/w") == who
    assert who.groups == tuple(sorted(set(os.getgrouplist("nobody", NOBODY.pw_gid))))
    assert who.launch_user() == User(NOBODY.pw_uid, NOBODY.pw_gid, who.groups)
    assert identity.job_users(run_as_root=True, euid=0).mode == "root"
    assert identity.job_users(euid=NOBODY.pw_uid).mode == "self"


def test_a_range_holding_an_existing_user_or_group_is_refused(tmp_path):
    with pytest.raises(SettingError, match="nobody|nogroup"):
        identity.job_users(uid_range=(NOBODY.pw_uid, NOBODY.pw_uid + 5), pool_path=str(tmp_path / "u"), euid=0,
                           claims_dir=str(tmp_path / "claims"))
    with pytest.raises(SettingError, match="root"):
        identity.job_users(uid_range=(0, 10), pool_path=str(tmp_path / "u"), euid=0,
                           claims_dir=str(tmp_path / "claims"))


def test_the_pool_gives_the_next_free_uid_after_the_last_and_cycles(tmp_path):
    path = str(tmp_path / "uids.json")
    claims = str(tmp_path / "claims")
    pool = uids.UidPool(100, 103, path, claims)
    pool.load()
    assert [pool.acquire(k) for k in ("a", "b", "c")] == [100, 101, 102]
    assert pool.release("a") == 100
    # 100 is free again, but the next one given is 103, then it wraps to 100.
    assert pool.acquire("d") == 103
    assert pool.acquire("e") == 100
    with pytest.raises(uids.UidsExhausted):
        pool.acquire("f")
    assert pool.release("nobody-held-this") is None
    pool.flush()   # the agent stopping: the file has every change
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.load(open(path)) == {"last": 100, "held": {"b": 101, "c": 102, "d": 103, "e": 100}}
    # A restarted agent continues after the last uid given, and keeps what is held.
    again = uids.UidPool(100, 103, path, claims)
    again.load()
    again.release("b")
    assert again.acquire("g") == 101
    assert not again.hold("h", 102) and again.hold("c", 102) and not again.hold("i", 99)
    assert sorted(os.listdir(claims)) == ["100", "101", "102", "103"]


def test_a_uid_held_ahead_passes_to_the_job_that_takes_it(tmp_path):
    """The warm launch's uid (warm.py) becomes the job's: same uid, same claim, and a
    restarted agent sees it held by the job."""
    path, claims = str(tmp_path / "uids.json"), str(tmp_path / "claims")
    pool = uids.UidPool(100, 103, path, claims)
    pool.load()
    uid = pool.acquire("warm:1")
    assert pool.rekey("warm:1", "job-1") == uid and pool.held() == {"job-1": uid}
    assert os.listdir(claims) == [str(uid)]
    with pytest.raises(KeyError):
        pool.rekey("warm:1", "job-2")  # nothing held under it any more
    other = pool.acquire("warm:2")
    with pytest.raises(KeyError):
        pool.rekey("warm:2", "job-1")  # a key holds one uid
    assert pool.held() == {"job-1": uid, "warm:2": other}
    pool.flush()
    again = uids.UidPool(100, 103, path, claims)
    again.load()
    assert again.held() == {"job-1": uid, "warm:2": other}


def test_agents_sharing_a_host_never_give_one_uid_to_two_jobs(tmp_path):
    claims = str(tmp_path / "claims")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = uids.UidPool(100, 103, str(tmp_path / "one" / "uids.json"), claims)
    two = uids.UidPool(100, 103, str(tmp_path / "two" / "uids.json"), claims)
    one.load()
    two.load()
    assert [one.acquire("a"), two.acquire("a"), one.acquire("b"), two.acquire("b")] == [100, 101, 102, 103]
    with pytest.raises(uids.UidsExhausted):
        one.acquire("c")
    assert not two.hold("x", 100)  # one's: a restarted `two` cannot take it
    one.release("a")
    assert two.acquire("c") == 100
    # An agent whose dir is gone (its state was deleted) holds nothing any more.
    two.flush()   # its file written: nothing left to write into the dir removed next
    shutil.rmtree(tmp_path / "two")
    assert one.acquire("d") == 103  # the next after one's last (102), claimed by `two`


def test_a_restarted_agent_removes_the_claims_it_left_for_jobs_that_are_gone(tmp_path):
    claims = str(tmp_path / "claims")
    pool = uids.UidPool(100, 103, str(tmp_path / "uids.json"), claims)
    pool.load()
    pool.acquire("a")
    pool.acquire("b")
    pool.flush()
    os.unlink(tmp_path / "uids.json")  # lost: only the claims remember
    again = uids.UidPool(100, 103, str(tmp_path / "uids.json"), claims)
    again.load()
    assert os.listdir(claims) == [] and again.acquire("c") == 100


def test_a_broken_pool_file_starts_afresh(tmp_path):
    path = tmp_path / "uids.json"
    path.write_text("{not json")
    pool = uids.UidPool(100, 101, str(path), str(tmp_path / "claims"))
    pool.load()
    assert pool.acquire("a") == 100


def test_per_job_users_forget_what_an_earlier_agent_held_for_jobs_that_are_gone(tmp_path):
    path = str(tmp_path / "uids.json")
    first = identity.job_users(uid_range=RANGE, pool_path=path, euid=0, claims_dir=str(tmp_path / "claims"))
    first.acquire("svc-1", "/w")
    first.acquire("run-2", "/w")
    first.flush()   # the first agent stopped
    second = identity.job_users(uid_range=RANGE, pool_path=path, euid=0, claims_dir=str(tmp_path / "claims"))
    assert second.forget_others(["svc-1"]) == [("run-2", 70001)]
    assert second.pool.held() == {"svc-1": 70000}
    assert second.acquire("new-3", "/w").uid == 70002  # not 70001 at once: reuse is delayed


def test_the_allocation_file_is_written_behind_a_jobs_start(tmp_path, monkeypatch):
    """Replacing the file may wait on the disk (ext4 flushes a file renamed over
    another): giving a job its uid never waits for that write."""
    path = str(tmp_path / "uids.json")
    gate, writing = threading.Event(), threading.Event()
    replace = os.replace

    def slow_replace(src, dst):
        writing.set()
        gate.wait(10)
        replace(src, dst)
    monkeypatch.setattr(uids.os, "replace", slow_replace)
    pool = uids.UidPool(100, 103, path, str(tmp_path / "claims"))
    pool.load()
    assert pool.acquire("a") == 100
    assert writing.wait(10)                           # the file's writer is held up on the disk...
    assert pool.acquire("b") == 101 and pool.release("a") == 100   # ...and no job waits for it
    gate.set()
    pool.flush()
    assert json.load(open(path)) == {"last": 101, "held": {"b": 101}}


def test_range_parsing():
    assert uids.parse_range("70000-79999") == (70000, 79999)
    assert uids.parse_range(" 5 - 5 ") == (5, 5)
    for bad in ("70000", "a-b", "10-5", "0-10", "1-4294967295", "-5-10"):
        with pytest.raises(ValueError):
            uids.parse_range(bad)


def test_giving_back_a_uid_without_cgroups_kills_what_its_job_left_running(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process under another uid")
    users = identity.job_users(uid_range=RANGE, pool_path=str(tmp_path / "uids.json"), euid=0,
                               claims_dir=str(tmp_path / "claims"),
                               kill_leftovers=True)
    who = users.acquire("job-1-1", "/")
    leftover = subprocess.Popen(["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups",
                                 "--", "sleep", "300"], start_new_session=True)
    try:
        wait_for(lambda: uids.processes_of(who.uid) == [leftover.pid], message="the leftover to run")
        users.release("job-1-1")
        assert leftover.wait(timeout=5) == -9
        assert uids.processes_of(who.uid) == []
    finally:
        leftover.kill()
        leftover.wait()


def test_resolve_gives_nobody_when_no_user_is_named():
    who = identity.resolve(euid=0)
    assert (who.uid, who.gid, who.name, who.home) == (NOBODY.pw_uid, NOBODY.pw_gid, "nobody",
                                                       NOBODY.pw_dir)
    assert who.switch and who.note is None
    assert who.env() == {"HOME": NOBODY.pw_dir, "USER": "nobody", "LOGNAME": "nobody"}


def test_a_missing_home_is_replaced_by_the_work_dir(tmp_path):
    who = identity.resolve(euid=0)
    if os.path.isdir(who.home):
        pytest.skip(f"nobody's home {who.home} exists on this host")
    assert who.env(str(tmp_path))["HOME"] == str(tmp_path)


def test_configured_user_by_name_or_uid():
    assert identity.resolve(user="nobody", euid=0) == identity.resolve(euid=0)
    assert identity.resolve(user=str(NOBODY.pw_uid), euid=0).name == "nobody"
    assert identity.resolve(user="  ", euid=0).name == "nobody"  # blank = default


def test_unknown_user_is_a_setting_error():
    with pytest.raises(SettingError, match="no-such-user-xyz"):
        identity.resolve(user="no-such-user-xyz", euid=0)
    with pytest.raises(SettingError):
        identity.resolve(user="no-such-user-xyz", euid=NOBODY.pw_uid)  # also when not root


def test_run_as_root_keeps_root_and_is_explicit():
    who = identity.resolve(run_as_root=True, euid=0)
    assert (who.uid, who.gid, who.switch) == (0, 0, False)
    assert who.launch_user() is None and "AGENT_RUN_AS_ROOT" in who.note
    assert identity.resolve(run_as_root=True, user="root", euid=0).uid == 0
    with pytest.raises(SettingError, match="AGENT_RUN_AS_ROOT"):
        identity.resolve(user="root", euid=0)  # root only through the explicit setting
    with pytest.raises(SettingError, match="contradict"):
        identity.resolve(run_as_root=True, user="nobody", euid=0)


def test_agent_that_is_not_root_runs_jobs_as_itself():
    who = identity.resolve(user="nobody", euid=NOBODY.pw_uid)
    assert who.uid == NOBODY.pw_uid and not who.switch and who.launch_user() is None
    assert "not root" in who.note
    daemon = identity.resolve(run_as_root=True, euid=NOBODY.pw_uid)
    assert daemon.uid == NOBODY.pw_uid and "not as root" in daemon.note


def test_prepare_workdir_makes_it_private_and_chowns_only_when_switching(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "f.txt").write_text("x")
    (work / "link").symlink_to("/etc/passwd")
    identity.prepare_workdir(str(work), identity.resolve(run_as_root=True))
    assert os.stat(work).st_uid == 0 and stat.S_IMODE(os.stat(work).st_mode) == 0o700
    per_job = identity.job_users(uid_range=RANGE, pool_path=str(tmp_path / "uids.json"), euid=0,
                                 claims_dir=str(tmp_path / "claims"))
    who = per_job.acquire("job-1-1", str(work))
    identity.prepare_workdir(str(work), who)
    for path in (work, work / "sub", work / "sub" / "f.txt"):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (who.uid, who.uid)
    assert stat.S_IMODE(os.stat(work).st_mode) == 0o700
    assert os.lstat(work / "link").st_uid == who.uid
    assert os.stat("/etc/passwd").st_uid == 0  # the link was not followed


def test_unreachable_ancestor():
    if os.geteuid() != 0:
        pytest.skip("needs root: the locked dir must belong to someone other than nobody")
    who = identity.resolve(euid=0)
    base = tempfile.mkdtemp(prefix="corral-id-test-", dir="/tmp")  # tmp_path's parents are 0700
    try:
        os.chmod(base, 0o755)
        locked = os.path.join(base, "locked")
        os.makedirs(os.path.join(locked, "work"))
        os.chmod(locked, 0o700)
        assert identity.unreachable_ancestor(os.path.join(locked, "work"), who) == locked
        os.chmod(locked, 0o711)
        assert identity.unreachable_ancestor(os.path.join(locked, "work"), who) is None
        root = identity.resolve(run_as_root=True, euid=0)
        os.chmod(locked, 0o700)
        assert identity.unreachable_ancestor(os.path.join(locked, "work"), root) is None
    finally:
        shutil.rmtree(base, ignore_errors=True)
