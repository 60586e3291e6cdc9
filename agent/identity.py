"""Who jobs run as.

An agent running as root runs jobs as an unprivileged user: `nobody` by default,
or the configured one. Keeping root for jobs is an explicit setting, never a
default. An agent that is not root cannot switch users: its jobs run as its own
user, and `Identity.note` says so.
"""
from __future__ import annotations

import logging
import os
import pwd
import stat
from dataclasses import dataclass

from corral.shared.errors import SettingError

log = logging.getLogger(__name__)

DEFAULT_JOB_USER = "nobody"


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    name: str
    home: str
    groups: tuple[int, ...]  # supplementary groups (the user's, as initgroups would set)
    switch: bool = False     # True: the agent changes to this user before running a job
    note: str | None = None  # why jobs run as they do, when it is worth a log line

    def popen_kwargs(self) -> dict:
        """Keyword arguments for runner.start / subprocess.Popen; {} when not switching."""
        if not self.switch:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

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
    """The identity jobs run as. `user` None means `nobody`. Raises SettingError for an
    unknown user, for a uid-0 user without run_as_root, and for run_as_root together
    with another user. `euid` overrides os.geteuid() (tests)."""
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


def _has_pw(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def prepare_workdir(path: str, identity: Identity) -> None:
    """Give the job user its work dir (and everything already in it, e.g. an unpacked
    deploy zip). Only when switching users; symlinks are not followed. Warns when
    the job user cannot reach the dir by its absolute path."""
    if not identity.switch:
        return
    os.chown(path, identity.uid, identity.gid)
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(parent, name), identity.uid, identity.gid,
                     follow_symlinks=False)
    problem = unreachable_ancestor(path, identity)
    if problem:
        log.warning("job user %s cannot traverse %s, so it reaches its work dir only by "
                    "relative paths; make the state dir's parents at least 0711",
                    identity.name, problem)


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
