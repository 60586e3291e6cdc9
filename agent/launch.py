"""How a job's process starts: the launch chain from the agent (root) to the job's shell.

unshare, a set-up shell, setpriv and an environment stage, each exec'ing the next, and
the private /tmp the chain mounts. Nothing before the privilege drop reads anything the
job controls. docs/agent.md ("How a job starts", "Private /tmp", "Warm launch") and
docs/security.md say what it guarantees.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.shared.files import write_private

from .spawner import (DEV_FAILED_MESSAGE, DROP_FAILED_MESSAGE, JOIN_FAILED_MESSAGE, MOUNT_FAILED_MESSAGE,
                      SETUP_FAILED_EXIT, SETUP_FAILED_PREFIX)
from corral.shared.validate import ENV_NAME_RE

# What the root stages run with: no variable of the job's or the agent's (an LD_PRELOAD,
# LD_AUDIT, locale or library path of the job would otherwise act inside root processes).
# The stages are named by absolute paths (find_tools), the job's command is only an
# argument they pass along, and the root shell's script is a constant of this module.
LAUNCH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
LAUNCH_ENV = {"PATH": LAUNCH_PATH}
SHELL = "/bin/sh"
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
FSTAB_NAME = "private-tmp.fstab"  # in the agent's dir (write_fstab)

# Exit code, stderr prefix and messages of a job whose set-up failed (a problem of the
# node), the fork server's (spawner.py) and the chain's alike.
ENV_FAILED_MESSAGE = f"{SETUP_FAILED_PREFIX} the job's environment could not be read"

# Root: $1 the mount program, $2 the fstab ("" for none), $3 the size of each tmpfs
# in MB, $4 $5 $6 the mknod, mkdir and ln programs ($4 "": no /dev of the job's own),
# then the cgroup files to write 0 (itself) into (cgroups.JobCgroup.join_files) up to
# "--", then, with $4, the device nodes of the job's /dev (PrivateDev) up to "--",
# then the next stage. The job's /dev is a tmpfs of root's (the job may not write in
# it, nor make device nodes) with those nodes, the links every /dev has, a devpts of
# its own (none where the kernel refuses one) and the directory of /dev/shm.
_FAIL_DEV = '{ echo "' + DEV_FAILED_MESSAGE + '" >&2; exit ' + str(SETUP_FAILED_EXIT) + '; }'
_SETUP = ('m=$1 t=$2 z=$3 k=$4 d=$5 l=$6; shift 6; '
          'for p in "$@"; do [ "$p" = -- ] && break; '
          'echo 0 > "$p" || { echo "' + JOIN_FAILED_MESSAGE + ' $p" >&2; '
          'exit ' + str(SETUP_FAILED_EXIT) + '; }; shift; done; shift; '
          'if [ -n "$k" ]; then '
          '"$m" -n -t tmpfs -o nosuid,noexec,mode=0755,size=1m corral-dev /dev </dev/null || ' + _FAIL_DEV + '; '
          'for s in "$@"; do [ "$s" = -- ] && break; '
          'n=${s%%:*}; r=${s#*:}; a=${r%%:*}; r=${r#*:}; b=${r%%:*}; o=${r#*:}; '
          'case $n in */*) "$d" -p "/dev/${n%/*}" || ' + _FAIL_DEV + ';; esac; '
          '"$k" -m "$o" "/dev/$n" c "$a" "$b" || ' + _FAIL_DEV + '; shift; done; shift; '
          '"$l" -s /proc/self/fd /dev/fd && "$l" -s /proc/self/fd/0 /dev/stdin && '
          '"$l" -s /proc/self/fd/1 /dev/stdout && "$l" -s /proc/self/fd/2 /dev/stderr && '
          '"$d" -m 0755 /dev/pts && "$d" -m 1777 /dev/shm || ' + _FAIL_DEV + '; '
          '"$m" -n -t devpts -o newinstance,ptmxmode=0666,mode=0620 corral-pts /dev/pts </dev/null 2>/dev/null '
          '&& "$l" -s pts/ptmx /dev/ptmx; '
          'fi; '
          'if [ -n "$t" ]; then "$m" -n -i -a -t tmpfs -T "$t" -o "nosuid,nodev,mode=1777,size=${z}m" '
          '</dev/null || { echo "' + MOUNT_FAILED_MESSAGE + '" >&2; exit ' + str(SETUP_FAILED_EXIT) + '; }; fi; '
          'exec "$@"')
SETUP_NAME = "corral-setup"
# The job's user: source the environment from standard input, then /dev/null there, exec the job.
_RUN_JOB = 'exec </dev/null; exec ' + SHELL + ' -c "$1"'
_ENV_STAGE = ('[ -r /proc/self/fd/0 ] || { echo "' + ENV_FAILED_MESSAGE + '" >&2; '
              'exit ' + str(SETUP_FAILED_EXIT) + '; }; '
              '. /proc/self/fd/0; ' + _RUN_JOB)
ENV_STAGE_NAME = "corral-env"
# A warm chain's job-user stage: the same, once its script (warm_script) is complete.
_WARM_READY = "__corral_ready"
_WARM_STAGE = ('. /proc/self/fd/0 || exit ' + str(SETUP_FAILED_EXIT) + '; '
               '[ "${' + _WARM_READY + '-}" = 1 ] || exit ' + str(SETUP_FAILED_EXIT) + '; '
               'unset ' + _WARM_READY + '; ' + _RUN_JOB)
WORKDIR_FAILED_MESSAGE = f"{SETUP_FAILED_PREFIX} the job could not enter its work dir"


# Fallback privilege drop when setpriv (util-linux) is missing: a few lines of Python
# run isolated (-I: no PYTHON* variables, no user site) and without site imports (-S).
# As setpriv's flags in drop_argv: every capability out of the bounding set (which
# needs root's CAP_SETPCAP, so before the switch), no_new_privs, then the ids.
# argv: uid gid groups(comma-separated) -- command...
_DROP_PY = ("import os,sys,ctypes\n"
            "u,g,gs=sys.argv[1:4]\n"
            "try:\n"
            " p=ctypes.CDLL(None,use_errno=True).prctl\n"
            " p.argtypes=[ctypes.c_int]+[ctypes.c_ulong]*4\n"
            " for c in range(int(open('/proc/sys/kernel/cap_last_cap').read())+1):\n"
            "  if p(24,c,0,0,0): raise OSError(ctypes.get_errno(),'PR_CAPBSET_DROP %d failed'%c)\n"
            " if p(38,1,0,0,0): raise OSError(ctypes.get_errno(),'PR_SET_NO_NEW_PRIVS failed')\n"
            " os.setgroups([int(x) for x in gs.split(',') if x]);os.setgid(int(g));os.setuid(int(u))\n"
            "except (OSError,ValueError) as e: sys.stderr.write('" + DROP_FAILED_MESSAGE + ": %s\\n'%e); "
            "sys.exit(" + str(SETUP_FAILED_EXIT) + ")\n"
            "a=sys.argv[5:]\n"
            "try: os.execv(a[0],a)\n"
            "except OSError as e: sys.stderr.write('corral: cannot run %s: %s\\n'%(a[0],e)); sys.exit(127)\n")


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the programs the root stages exec (None: not installed)."""
    setpriv: str | None
    unshare: str | None
    mount: str | None
    # A /dev of the job's own (PrivateDev).
    mknod: str | None = None
    mkdir: str | None = None
    ln: str | None = None
    # The interpreter itself, not a virtualenv's link to it: the drop runs with -I -S
    # (no site-packages needed), and a virtualenv under /tmp (a checkout in a temporary
    # folder) is hidden by the job's private /tmp when the drop runs.
    python: str = os.path.realpath(sys.executable)


def find_tools() -> Tools:
    """Looked up once, in LAUNCH_PATH only (never the agent's own PATH)."""
    def which(name: str) -> str | None:
        found = shutil.which(name, path=LAUNCH_PATH)
        return os.path.abspath(found) if found else None
    return Tools(which("setpriv"), which("unshare"), which("mount"), which("mknod"), which("mkdir"), which("ln"))


@dataclass(frozen=True)
class PrivateTmp:
    """A private /tmp for one job: the agent's fstab (write_fstab) and the size of each
    of its file systems."""
    fstab: str
    size_mb: int


@dataclass(frozen=True)
class PrivateDev:
    """A /dev of the job's own (devices.py, the `mount` isolation): the device nodes it
    holds, each PATH:MAJOR:MINOR:MODE (octal) with PATH under /dev."""
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class User:
    """Whom the job runs as after the drop: ids only (a per-job uid has no name)."""
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


def quote(value: str) -> str:
    """`value` in single quotes for /bin/sh: nothing inside is expanded."""
    return "'" + value.replace("'", "'\\''") + "'"


def env_script(env: Mapping[str, str]) -> bytes:
    """The shell script that gives the job-user stage exactly `env`: variables of
    LAUNCH_ENV the job lacks are unset (and PWD, which the shell exports on its own),
    then every variable is exported. It reaches that stage as standard input (a memfd),
    not argv, which every user may read in /proc/<pid>/cmdline; standard input is also
    a descriptor /bin/sh can close (it names none above 9), so the job inherits none.
    Raises ValueError for a name that is not a shell identifier or a value with a NUL
    byte, which no environment can hold."""
    check_env(env)
    lines = [f"unset {name}" for name in sorted({*LAUNCH_ENV, "PWD"} - set(env))]
    lines += [f"export {name}={quote(value)}" for name, value in env.items()]
    return ("\n".join(lines) + "\n").encode()


def check_env(env: Mapping[str, str]) -> None:
    """ValueError for a name that is not a shell identifier or a value with a NUL byte,
    which no environment can hold."""
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise ValueError(f"bad environment variable name {name!r}")
        if not isinstance(value, str) or "\x00" in value:
            raise ValueError(f"environment variable {name} has a value that is not text without NUL bytes")


def private_dirs() -> tuple[str, ...]:
    """The private dirs a job gets a file system of its own on: those that are
    directories here (write_fstab's entries)."""
    return tuple(d for d in PRIVATE_DIRS if os.path.isdir(d) and not os.path.islink(d))


def write_fstab(path: str) -> str:
    """Write the fstab of the jobs' private /tmp, /var/tmp and /dev/shm (those that are
    directories here) to `path` (mode 0600); the path. One `mount -a` mounts them all
    (one program instead of three); the options, size included, are on its command line.
    The source is named with a token of this agent process, since `mount -a` silently
    skips an entry whose source is already mounted at its target (an agent running
    inside a job of another agent would otherwise share that job's /tmp)."""
    source = f"corral-tmp-{secrets.token_hex(8)}"
    text = "".join(f"{source} {d} tmpfs defaults 0 0\n" for d in private_dirs())
    write_private(path, text)
    return path


def memfd(name: str, data: bytes) -> int:
    """A close-on-exec memfd holding `data`, its offset back at the start (it becomes a
    child's standard input)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def argv(command: str, tools: Tools, cgroup_files: Sequence[str] = (), user: User | None = None,
         private_tmp: PrivateTmp | None = None, private_dev: PrivateDev | None = None) -> list[str]:
    """The chain for one job, to be run in its work dir with its environment script
    (env_script) as standard input:

        unshare --mount --ipc --propagation slave --                 (private /tmp or /dev)
        /bin/sh -c SETUP corral-setup MOUNT FSTAB SIZE MKNOD MKDIR LN JOIN... -- [NODE... --]
                                                                     (cgroups, private /tmp or /dev)
        setpriv --no-new-privs --bounding-set=-all
                --reuid=U --regid=G --clear-groups --                (another user, for good)
        /bin/sh -c ENV_STAGE corral-env COMMAND                      (always)
        /bin/sh -c COMMAND                                           the job

    Each stage execs the next, so the job keeps the pid the agent started and is in its
    cgroup and namespaces before its first instruction (no preexec_fn, which is unsafe
    in a threaded process). `user` None: no switch (the agent is not root, or runs jobs
    as root by choice)."""
    return _root_stages(tools, cgroup_files, user, private_tmp, private_dev) + [
        SHELL, "-c", _ENV_STAGE, ENV_STAGE_NAME, command]


def warm_argv(tools: Tools, cgroup_files: Sequence[str] = (), user: User | None = None,
              private_tmp: PrivateTmp | None = None) -> list[str]:
    """A warm chain: argv's stages started before the job is known, in a cgroup made for
    the job to come, ending in one that waits on its standard input (a pipe) for
    warm_script. It waits in the work dirs' directory, which root entered for it.
    (Moving a waiting process into a cgroup made at the claim would cost more than it
    saves: another process's move waits for an RCU grace period; a thread's own join
    does not.) A chain whose pipe closes before the script is whole exits and runs none
    of it."""
    return _root_stages(tools, cgroup_files, user, private_tmp) + [SHELL, "-c", _WARM_STAGE, ENV_STAGE_NAME]


def _root_stages(tools: Tools, cgroup_files: Sequence[str], user: User | None,
                 private_tmp: PrivateTmp | None, private_dev: PrivateDev | None = None) -> list[str]:
    """Every stage before the job-user one: the set-up, then the drop to `user`."""
    chain = setup_argv(tools, cgroup_files, private_tmp, private_dev)
    if user is not None:
        chain += drop_argv(user, tools)
    return chain


def warm_script(command: str, workdir: str, env: Mapping[str, str]) -> bytes:
    """What a warm chain waits for: into `workdir`, exactly `env` (env_script), then
    `command` as the job's shell's, and last the line that says the script is whole.
    `workdir` may be relative to the directory the chain was started in. Raises
    ValueError as env_script does."""
    # One { } block: the shell runs none of it before it has read the closing brace.
    # -P: a physical cd, so that a relative path is walked from where the chain waits;
    # the shell's logical cd would walk the absolute path, whose parents the job's user
    # may not be allowed to search.
    return (f"{{\ncd -P -- {quote(workdir)} || {{ echo {quote(WORKDIR_FAILED_MESSAGE)} >&2; "
            f"exit {SETUP_FAILED_EXIT}; }}\nunset OLDPWD\n").encode() \
        + env_script(env) + f"set -- {quote(command)}\n{_WARM_READY}=1\n}}\n".encode()


def setup_argv(tools: Tools, cgroup_files: Sequence[str] = (), private_tmp: PrivateTmp | None = None,
               private_dev: PrivateDev | None = None) -> list[str]:
    """The root stages: the namespaces, then the shell that joins the cgroups (writes
    0 into each of `cgroup_files`), makes the job's own /dev and mounts the private
    /tmp; empty when there is nothing to set up."""
    chain: list[str] = []
    if private_dev is not None and None in (tools.mknod, tools.mkdir, tools.ln):
        raise ValueError("a /dev of the job's own needs mknod, mkdir and ln (coreutils)")
    if private_tmp is not None or private_dev is not None:
        if tools.unshare is None or tools.mount is None:
            raise ValueError("a private /tmp or /dev needs unshare and mount (util-linux)")
        # slave: the job's own mounts stay in it, while the work dirs' filesystems
        # (diskfs.py, under a shared work root) mounted and unmounted after it was made
        # reach it, a warm launch's included, and leave no copy behind.
        chain += [tools.unshare, "--mount", "--ipc", "--propagation", "slave", "--"]
    if cgroup_files or private_tmp is not None or private_dev is not None:
        dev_tools = [tools.mknod or "", tools.mkdir or "", tools.ln or ""] if private_dev else ["", "", ""]
        chain += [SHELL, "-c", _SETUP, SETUP_NAME, tools.mount or "",
                  private_tmp.fstab if private_tmp else "", str(int(private_tmp.size_mb)) if private_tmp else "",
                  *dev_tools, *cgroup_files, "--", *((*private_dev.nodes, "--") if private_dev else ())]
    return chain


def drop_argv(user: User, tools: Tools) -> list[str]:
    """An argv prefix that switches every id (real, effective, saved; no way back) to
    `user` and execs what follows: setpriv when installed, else a tiny Python. Before
    that it empties the capability bounding set and sets no_new_privs, so that nothing
    the job execs can give it privileges back: a setuid-root program (su, passwd,
    sudo) runs with the job's ids, and file capabilities (ping's cap_net_raw) are not
    granted."""
    groups = ",".join(str(g) for g in user.groups)
    if tools.setpriv:
        return [tools.setpriv, "--no-new-privs", "--bounding-set=-all", f"--reuid={user.uid}",
                f"--regid={user.gid}", f"--groups={groups}" if groups else "--clear-groups", "--"]
    return [tools.python, "-I", "-S", "-c", _DROP_PY, str(user.uid), str(user.gid), groups, "--"]


def setup_failed(exit_code: int, stderr: str) -> bool:
    """Whether a job ended because a launch stage failed (not the job's own doing)."""
    return exit_code == SETUP_FAILED_EXIT and SETUP_FAILED_PREFIX in stderr


# --- can this node give jobs a private /tmp? -------------------------------------------------

def private_tmp_problem(tools: Tools, work_root: str, fstab: str, euid: int | None = None) -> str | None:
    """Why jobs cannot get a private /tmp here, or None when they can. The real test:
    the chain sets one up with `fstab` in a throwaway namespace (a few milliseconds,
    nothing left behind). A work root under one of the private dirs would vanish from
    the jobs' view."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return f"the agent is not root (euid {euid})"
    if tools.unshare is None or tools.mount is None:
        return "unshare or mount (util-linux) is not installed"
    real = os.path.realpath(work_root)
    for d in PRIVATE_DIRS:
        base = os.path.realpath(d)
        if real == base or real.startswith(base.rstrip("/") + "/"):
            return (f"the work dirs ({work_root}) lie under {d}, which a private {d} "
                    "would hide from the jobs")
    try:
        probe = subprocess.run([*setup_argv(tools, private_tmp=PrivateTmp(fstab, 1)), SHELL, "-c", "exit 0"],
                               env=LAUNCH_ENV, cwd="/", stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"setting one up failed: {exc}"
    if probe.returncode != 0:
        return (f"setting one up failed (exit {probe.returncode}): "
                f"{probe.stderr.strip() or 'no message'}")
    return None


def private_dev_problem(tools: Tools, nodes: Sequence[str], euid: int | None = None) -> str | None:
    """Why jobs cannot get a /dev of their own here (PrivateDev of `nodes`), or None when
    they can: the chain makes one in a throwaway namespace and lists it."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return f"the agent is not root (euid {euid})"
    try:
        chain = setup_argv(tools, private_dev=PrivateDev(tuple(nodes)))
        probe = subprocess.run([*chain, SHELL, "-c", "[ -c /dev/null ] && echo x > /dev/null"],
                               env=LAUNCH_ENV, cwd="/", stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=10)
    except ValueError as exc:
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"making one failed: {exc}"
    if probe.returncode != 0:
        return f"making one failed (exit {probe.returncode}): {probe.stderr.strip() or 'no message'}"
    return None
