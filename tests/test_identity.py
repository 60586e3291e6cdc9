"""Who jobs run as: defaults, explicit root, errors, work dir ownership."""
import os
import pwd
import shutil
import tempfile

import pytest

from corral.agent import identity, runner
from corral.shared.errors import SettingError

NOBODY = pwd.getpwnam("nobody")


def test_root_agent_runs_jobs_as_nobody_by_default():
    who = identity.resolve(euid=0)
    assert (who.uid, who.gid, who.name, who.home) == (NOBODY.pw_uid, NOBODY.pw_gid, "nobody",
                                                       NOBODY.pw_dir)
    assert who.switch and who.note is None
    assert who.groups == tuple(sorted(set(os.getgrouplist("nobody", NOBODY.pw_gid))))
    assert who.popen_kwargs() == {"user": NOBODY.pw_uid, "group": NOBODY.pw_gid,
                                  "extra_groups": list(who.groups)}
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
    assert who.popen_kwargs() == {} and "AGENT_RUN_AS_ROOT" in who.note
    assert identity.resolve(run_as_root=True, user="root", euid=0).uid == 0
    with pytest.raises(SettingError, match="AGENT_RUN_AS_ROOT"):
        identity.resolve(user="root", euid=0)  # root only through the explicit setting
    with pytest.raises(SettingError, match="contradict"):
        identity.resolve(run_as_root=True, user="nobody", euid=0)


def test_agent_that_is_not_root_runs_jobs_as_itself():
    who = identity.resolve(user="nobody", euid=NOBODY.pw_uid)
    assert who.uid == NOBODY.pw_uid and not who.switch and who.popen_kwargs() == {}
    assert "not root" in who.note
    daemon = identity.resolve(run_as_root=True, euid=NOBODY.pw_uid)
    assert daemon.uid == NOBODY.pw_uid and "not as root" in daemon.note


def test_prepare_workdir_chowns_only_when_switching(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "f.txt").write_text("x")
    (work / "link").symlink_to("/etc/passwd")
    identity.prepare_workdir(str(work), identity.resolve(run_as_root=True))
    assert os.stat(work).st_uid == 0
    identity.prepare_workdir(str(work), identity.resolve())
    for path in (work, work / "sub", work / "sub" / "f.txt"):
        assert os.stat(path).st_uid == NOBODY.pw_uid
    assert os.lstat(work / "link").st_uid == NOBODY.pw_uid
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


def test_runner_refuses_an_unknown_user(tmp_path):
    job = {"job_id": "job-1", "command": "true"}
    env = runner.build_environment(job, {})
    with pytest.raises(runner.StartError):
        runner.start(job, str(tmp_path), env, 100, popen_kwargs={"user": "no-such-user-xyz"})
    with pytest.raises(runner.StartError):
        runner.start(job, str(tmp_path), env, 100, prefix=["env", "--"],
                     popen_kwargs={"user": "no-such-user-xyz"})
