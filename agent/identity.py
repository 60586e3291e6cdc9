"""Who jobs run as.

An agent running as root runs every job under a uid of its own, taken from
AGENT_UID_RANGE for the job's lifetime (uids.py; gid = uid, no supplementary
groups, no passwd entry): jobs cannot signal, trace or read each other. That is
the default. AGENT_JOB_USER runs every job as one existing user instead (jobs then
share a uid, as they did before per-job uids), AGENT_RUN_AS_ROOT keeps root: an
explicit setting, never a default. An agent that is not root cannot switch users:
its jobs run as its own user, and `Identity.note` says so.

`job_users()` picks the policy (a `JobUsers`); the agent asks it for each job's
`Identity` when it prepares the job and gives it back when the job has ended.
"""
from __future__ import annotations

import grp
import logging
import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from corral.shared.errors import SettingError

from . import uids
from .launch import User

log = logging.getLogger(__name__)

DEFAULT_JOB_USER = "nobody"
PER_JOB_NAME = "corral-{uid}"  # USER and LOGNAME of a job with a uid of its own


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    name: str
    home: str
    groups: tuple[int, ...]  # supplementary groups (the user's, as initgroups would set)
    switch: bool = False     # True: the agent changes to this user before running a job
    note: str | None = None  # why jobs run as they do, when it is worth a log line

    def launch_user(self) -> User | None:
        """Whom launch.argv drops to; None when not switching."""
        return User(self.uid, self.gid, tuple(self.groups)) if self.switch else None

    def env(self, workdir: str | None = None) -> dict[str, str]:
        """HOME, USER and LOGNAME for the job. A home that does not exist (nobody's is
        /nonexistent) is replaced by `workdir` when given, so tools can write caches."""
        home = self.home
        if workdir is not None and not os.path.isdir(home):
            home = workdir
        return {"HOME": home, "USER": self.name, "LOGNAME": self.name}

    def describe(self) -> dict:
        return {"user": self.name, "uid": self.uid, "gid": self.gid, "groups": list(self.groups),
                "switch": self.switch, "note": self.note}


class JobUsers:
    """One identity for every job: AGENT_JOB_USER ("fixed"), AGENT_RUN_AS_ROOT ("root"),
    or the agent's own user when it is not root ("self")."""

    def __init__(self, identity: Identity, mode: str):
        self.identity = identity
        self.mode = mode

    @property
    def note(self) -> str | None:
        return self.identity.note

    def acquire(self, key: str, workdir: str) -> Identity:
        """The identity the job `key` (`<job>-<attempt>`) runs as."""
        return self.identity

    def transfer(self, old_key: str, key: str, workdir: str) -> Identity:
        """The identity acquired for `old_key` (a warm launch, warm.py), now the job
        `key`'s (as acquire would give it)."""
        return self.identity

    def release(self, key: str) -> None:
        """The job `key` has ended and its processes are gone."""

    def flush(self) -> None:
        """Write what is kept across restarts now (the agent is stopping)."""

    def hold(self, key: str, uid: int | None) -> bool:
        """A re-adopted service `key` keeps `uid` (what acquire gave it before)."""
        return True

    def forget_others(self, keep: Iterable[str]) -> list[tuple[str, int]]:
        """At start-up, after re-adoption: what an earlier agent held for jobs that are
        gone is given back. The (key, uid) pairs given back."""
        return []

    def describe(self) -> dict:
        return {"mode": self.mode, **self.identity.describe()}


class PerJobUsers(JobUsers):
    """A uid of its own for every job (see uids.UidPool)."""

    mode = "per-job"

    def __init__(self, pool: uids.UidPool, kill_leftovers: bool = False):
        self.pool = pool
        # Without cgroups nothing else finds what a job left running outside its process
        # group (setsid, double forks): the processes of its uid are killed when it is
        # given back, so that the uid's next job never shares it with them.
        self.kill_leftovers = kill_leftovers

    @property
    def note(self) -> str | None:
        return None

    def _identity(self, uid: int, workdir: str) -> Identity:
        name = PER_JOB_NAME.format(uid=uid)
        return Identity(uid, uid, name, workdir, (), True)

    def acquire(self, key: str, workdir: str) -> Identity:
        """Raises uids.UidsExhausted when every uid is held."""
        return self._identity(self.pool.acquire(key), workdir)

    def transfer(self, old_key: str, key: str, workdir: str) -> Identity:
        return self._identity(self.pool.rekey(old_key, key), workdir)

    def release(self, key: str) -> None:
        uid = self.pool.release(key)
        if uid is not None and self.kill_leftovers:
            killed = uids.kill_processes_of(uid)
            if killed:
                log.warning("killed %d process(es) job %s left running as uid %d", killed, key, uid)

    def hold(self, key: str, uid: int | None) -> bool:
        return uid is not None and self.pool.hold(key, uid)

    def flush(self) -> None:
        self.pool.flush()

    def forget_others(self, keep: Iterable[str]) -> list[tuple[str, int]]:
        keep = set(keep)
        gone = [(key, uid) for key, uid in self.pool.held().items() if key not in keep]
        for key, _ in gone:
            self.release(key)
        return gone

    def describe(self) -> dict:
        return {"mode": self.mode, "uid_range": f"{self.pool.first}-{self.pool.last}",
                "user": PER_JOB_NAME.format(uid="UID"), "uid": None, "gid": None, "groups": [],
                "switch": True, "note": None}


def _lookup(user: str) -> pwd.struct_passwd:
    try:
        if user.isdigit():
            return pwd.getpwuid(int(user))
        return pwd.getpwnam(user)
    except KeyError:
        raise SettingError(f"AGENT_JOB_USER: no such user {user!r} on this node") from None


def _groups(entry: pwd.struct_passwd) -> tuple[int, ...]:
    try:
        return tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    except OSError:
        return (entry.pw_gid,)


def _identity(entry: pwd.struct_passwd, switch: bool, note: str | None = None) -> Identity:
    return Identity(entry.pw_uid, entry.pw_gid, entry.pw_name, entry.pw_dir, _groups(entry),
                    switch, note)


def resolve(run_as_root: bool = False, user: str | None = None,
            euid: int | None = None) -> Identity:
    """The one identity of the fixed policies (see job_users): `user` (None: `nobody`),
    root with run_as_root, or the agent's own user when it is not root. Raises
    SettingError for an unknown user, for a uid-0 user without run_as_root, and for
    run_as_root together with another user. `euid` overrides os.geteuid() (tests)."""
    euid = os.geteuid() if euid is None else euid
    user = user.strip() if isinstance(user, str) and user.strip() else None
    if run_as_root and user is not None and _lookup(user).pw_uid != 0:
        raise SettingError(f"AGENT_RUN_AS_ROOT=true and AGENT_JOB_USER={user} contradict "
                           "each other; set only one")
    if euid != 0:
        own = pwd.getpwuid(euid) if _has_pw(euid) else None
        if user is not None:
            _lookup(user)  # a typo is still an error, so it is found before going root
        wanted = "root" if run_as_root else (user or DEFAULT_JOB_USER)
        name = own.pw_name if own else str(euid)
        note = (f"the agent is not root, so jobs run as its own user {name} (uid {euid}), "
                f"not as {wanted}")
        if own is None:
            return Identity(euid, os.getegid(), name, os.path.expanduser("~"),
                            tuple(sorted(set(os.getgroups()))), False, note)
        return _identity(own, False, note)
    if run_as_root:
        return _identity(pwd.getpwuid(0), False,
                         "AGENT_RUN_AS_ROOT is set: jobs run as root")
    entry = _lookup(user or DEFAULT_JOB_USER)
    if entry.pw_uid == 0:
        raise SettingError(f"AGENT_JOB_USER={user} is root; to run jobs as root set "
                           "AGENT_RUN_AS_ROOT=true instead")
    return _identity(entry, True)


def job_users(run_as_root: bool = False, user: str | None = None,
              uid_range: tuple[int, int] | None = None, pool_path: str | None = None,
              euid: int | None = None, kill_leftovers: bool = False,
              claims_dir: str = uids.CLAIMS_DIR, load: bool = True) -> JobUsers:
    """The policy for this agent: a uid per job from `uid_range` (its allocation kept in
    `pool_path`, claimed host-wide in `claims_dir`) when the agent is root and neither
    `user` nor `run_as_root` is set; else one identity for all (see resolve). `load`
    False only describes (corral-agent --check): the allocation is neither read nor
    tidied. Raises SettingError, also for a range that holds a uid or gid of an
    existing user or group of this node: a job must never run as somebody who has
    files or a login here."""
    euid = os.geteuid() if euid is None else euid
    user = user.strip() if isinstance(user, str) and user.strip() else None
    if euid == 0 and not run_as_root and user is None:
        if uid_range is None or pool_path is None:
            raise ValueError("a uid per job needs uid_range and pool_path")
        check_range_unused(*uid_range)
        pool = uids.UidPool(*uid_range, pool_path, claims_dir)
        if load:
            pool.load()
        return PerJobUsers(pool, kill_leftovers)
    who = resolve(run_as_root, user, euid)
    mode = "self" if euid != 0 else ("root" if run_as_root else "fixed")
    return JobUsers(who, mode)


def check_range_unused(first: int, last: int) -> None:
    """SettingError when a user or group of this node has an id in first..last."""
    for entry in pwd.getpwall():
        if first <= entry.pw_uid <= last:
            raise SettingError(f"AGENT_UID_RANGE={first}-{last} holds uid {entry.pw_uid} of the user "
                               f"{entry.pw_name}; choose a range no user or group of this node has")
    for group in grp.getgrall():
        if first <= group.gr_gid <= last:
            raise SettingError(f"AGENT_UID_RANGE={first}-{last} holds gid {group.gr_gid} of the group "
                               f"{group.gr_name}; choose a range no user or group of this node has")


def _has_pw(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def prepare_workdir(path: str, identity: Identity) -> None:
    """Make the work dir private to the job user (mode 0700) and, when switching users,
    give it everything in it (e.g. an unpacked deploy zip); symlinks are not followed.
    Warns when the job user cannot reach the dir by its absolute path."""
    os.chmod(path, 0o700)
    if not identity.switch:
        return
    _chown_tree(path, identity.uid, identity.gid)
    problem = unreachable_ancestor(path, identity)
    if problem:
        log.warning("job user %s cannot search %s: the job starts in its work dir, but the "
                    "work dir's absolute path (its HOME, TMPDIR) does not resolve for it; make "
                    "the state dir's parents at least 0711", identity.name, problem)


def disown_workdir(path: str) -> None:
    """Give a kept work dir (CORRAL_KEEP_WORK_DIRS) to root once its job has ended, so
    that the next job given the same uid cannot read it."""
    try:
        _chown_tree(path, 0, 0)
    except OSError as exc:
        log.warning("could not give the kept work dir %s to root: %s", path, exc)


def _chown_tree(path: str, uid: int, gid: int) -> None:
    """chown `path` and everything below it; symlinks are not followed."""
    os.chown(path, uid, gid)
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(parent, name), uid, gid, follow_symlinks=False)


def unreachable_ancestor(path: str, identity: Identity) -> str | None:
    """The first parent directory of `path` the job user may not search (x), or None."""
    parent = os.path.dirname(os.path.abspath(path))
    chain = []
    while True:
        chain.append(parent)
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    for d in reversed(chain):
        try:
            st = os.stat(d)
        except OSError:
            return d
        if identity.uid == 0:
            continue
        if st.st_uid == identity.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == identity.gid or st.st_gid in identity.groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return d
    return None
