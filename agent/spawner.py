"""The fork server's own program: a small Python process, started once by the agent as
its child (`python -I -S spawner.py FD`, only the standard library, so that its memory
and each clone of it stay small), that makes every job's process with one clone and
hands it to the agent. forkserver.py is the agent's side; docs/agent.md ("How a job
starts") says what a job gets.

For each request (the job's start as a dict, its stdout, stderr and a report pipe by
SCM_RIGHTS) the server clones a child with CLONE_PARENT, so that the job is the
agent's child, which waits for it and reads its exit status; on cgroup v2 with a
kernel that can, into its cgroup (CLONE_INTO_CGROUP). It answers with the pid at once
and goes on to the next request while the child sets itself up with system calls,
the same steps as launch.py's chain of programs, in the same order:

    its own session          (a process group kill() reaches)
    its work dir             (entered as root, as the chain's start did)
    its cgroups joined       (unless it was cloned into its v2 cgroup)
    its mount and IPC namespaces, mounts made slaves of the host's
    a /dev of its own        (PrivateDev's nodes, the usual links, a devpts of its own)
    a private /tmp, /var/tmp and /dev/shm
    every capability out of the bounding set, no_new_privs, then its uid, gid and groups
    stdin /dev/null, stdout and stderr its own, no other descriptor, default signals
    execve /bin/sh -c COMMAND with exactly its environment: the one exec

The job's environment is only the exec's argument: no code runs with it before the
drop. A set-up step that fails writes the chain's message to the job's stderr and
exits SETUP_FAILED_EXIT, as the chain's stage would (the job ends `failed`, the
node's fault). A work dir that cannot be entered or a shell that cannot be run is
written to the report pipe (the agent raises StartError, as Popen would); an exec
closes it (close-on-exec), which tells the agent the job runs.

Python has no clone3, mount or prctl (and os.unshare only from 3.12): they are called
through libc with ctypes. No kept library covers them (python-prctl is unmaintained
and has prctl alone), and each is one call with integer flags.
"""
import array
import ctypes
import marshal
import os
import platform
import signal
import socket
import stat
import struct
import sys

# Exit code and stderr prefix of a job whose set-up failed (a problem of the node); the
# chain's stages (launch.py) use the same.
SETUP_FAILED_EXIT = 125
SETUP_FAILED_PREFIX = "corral-launch:"
JOIN_FAILED_MESSAGE = f"{SETUP_FAILED_PREFIX} the job could not join its cgroup"
MOUNT_FAILED_MESSAGE = f"{SETUP_FAILED_PREFIX} could not mount a private /tmp, /var/tmp and /dev/shm"
DEV_FAILED_MESSAGE = f"{SETUP_FAILED_PREFIX} could not make the job's own /dev"
DROP_FAILED_MESSAGE = f"{SETUP_FAILED_PREFIX} could not drop the privileges of the job"

# The stages a start fails at, as the report pipe says them (then errno).
STAGE_WORKDIR = "workdir"
STAGE_EXEC = "exec"
STAGE_INTERNAL = "internal"

# Signals a job starts with at their default action: what the server ignores would
# otherwise stay ignored across the exec.
RESET_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ,
                 signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGALRM)

HEADER = struct.Struct("!I")
MAX_REQUEST_BYTES = 64 * 1024 * 1024
FDS_PER_REQUEST = 3  # the job's stdout, stderr and report pipe

# <linux/sched.h>, <sys/mount.h>, <linux/prctl.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_PARENT = 0x00008000
CLONE_INTO_CGROUP = 0x200000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_SLAVE = 2, 4, 8, 16384, 1 << 19
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
# clone3 is 435 in the unified syscall table of these architectures.
SYS_CLONE3 = 435
KNOWN_MACHINES = ("x86_64", "aarch64")


def machine_known() -> bool:
    return platform.machine() in KNOWN_MACHINES


# ---- system calls ---------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.unshare.argtypes = [ctypes.c_int]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class CloneArgs(ctypes.Structure):
    """struct clone_args (<linux/sched.h>), up to `cgroup` (CLONE_ARGS_SIZE_VER2)."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls", "set_tid",
        "set_tid_size", "cgroup")]


def _check(result: int) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def clone3(flags: int, cgroup_fd: int = -1) -> int:
    """clone3 as fork (0 in the child, its pid here), the child on a copy of this
    single-threaded process. With CLONE_PARENT its exit signal is this process's own
    (SIGCHLD: it was started as a child), and clone3 takes no other."""
    args = CloneArgs(flags=flags, cgroup=max(cgroup_fd, 0))
    return _check(_libc.syscall(SYS_CLONE3, ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args))))


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags))


def mount(source, target: str, fstype, flags: int, data) -> None:
    def b(value):
        return None if value is None else os.fsencode(value)
    _check(_libc.mount(b(source), b(target), b(fstype), flags, b(data)))


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0))


# ---- the job's process, from its clone to its exec ------------------------------------------

class SetupFailed(Exception):
    """A step of the set-up failed: the chain's message for it."""


def become(spec: dict, stdout: int, stderr: int, report: int, joined: bool, last_cap: int) -> None:
    """Turn this freshly cloned process into the job (never returns). `joined`: it was
    cloned into its cgroup already."""
    code = SETUP_FAILED_EXIT
    try:
        for sig in RESET_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.setsid()
        try:
            os.chdir(spec["workdir"])
        except OSError as exc:
            _write(report, f"{STAGE_WORKDIR}:{exc.errno or 0}:")
            os._exit(code)
        set_up(spec, joined, last_cap)
        _standard_streams(stdout, stderr, report)
        shell = spec["shell"]
        try:
            os.execve(shell, [shell, "-c", spec["command"]], spec["env"])
        except OSError as exc:
            _write(report, f"{STAGE_EXEC}:{exc.errno or 0}:")
            code = 127
    except SetupFailed as exc:
        _write(stderr, f"{exc}\n")
    except BaseException as exc:  # noqa: BLE001 - nothing may return from here
        _write(report, f"{STAGE_INTERNAL}:0:{exc!r}")
    os._exit(code)


def set_up(spec: dict, joined: bool, last_cap: int) -> None:
    """Every step between the work dir and the exec, as the chain's stages."""
    if not joined:
        for path in spec["join_files"]:
            try:
                with open(path, "w") as f:
                    f.write("0")
            except OSError:
                raise SetupFailed(f"{JOIN_FAILED_MESSAGE} {path}") from None
    dev_nodes = spec["dev_nodes"]
    if spec["private_dirs"] or dev_nodes is not None:
        try:
            unshare(CLONE_NEWNS | CLONE_NEWIPC)
            # slave: as the chain's `unshare --propagation slave` (launch.setup_argv says why).
            mount(None, "/", None, MS_REC | MS_SLAVE, None)
        except OSError:
            raise SetupFailed(MOUNT_FAILED_MESSAGE) from None
    if dev_nodes is not None:
        try:
            own_dev(dev_nodes)
        except (OSError, ValueError):
            raise SetupFailed(DEV_FAILED_MESSAGE) from None
    for d in spec["private_dirs"]:
        try:
            mount("corral-tmp", d, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={int(spec['tmp_size_mb'])}m")
        except OSError:
            raise SetupFailed(MOUNT_FAILED_MESSAGE) from None
    uid = spec["uid"]
    if uid is not None:
        try:
            for cap in range(last_cap + 1):  # needs CAP_SETPCAP: before the switch
                prctl(PR_CAPBSET_DROP, cap)
            prctl(PR_SET_NO_NEW_PRIVS, 1)
            os.setgroups(list(spec["groups"]))
            gid = uid if spec["gid"] is None else spec["gid"]
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except OSError as exc:
            raise SetupFailed(f"{DROP_FAILED_MESSAGE}: {exc}") from None


def own_dev(nodes) -> None:
    """The chain's /dev of the job's own: a tmpfs of root's with `nodes`
    (PATH:MAJOR:MINOR:MODE), the links every /dev has, /dev/pts and /dev/shm."""
    mount("corral-dev", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m")
    for node in nodes:
        path, major, minor, mode = node.rsplit(":", 3)
        target = os.path.join("/dev", path)
        if "/" in path:
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.mknod(target, stat.S_IFCHR | int(mode, 8), os.makedev(int(major), int(minor)))
        os.chmod(target, int(mode, 8))  # exactly, whatever the umask
    for link, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                     ("stderr", "/proc/self/fd/2")):
        os.symlink(to, os.path.join("/dev", link))
    for name, mode in (("pts", 0o755), ("shm", 0o1777)):
        os.mkdir(os.path.join("/dev", name))
        os.chmod(os.path.join("/dev", name), mode)
    try:  # where the kernel refuses a devpts of its own, the job has none (as with the chain)
        mount("corral-pts", "/dev/pts", "devpts", 0, "newinstance,ptmxmode=0666,mode=0620")
    except OSError:
        return
    os.symlink("pts/ptmx", "/dev/ptmx")


def _standard_streams(stdout: int, stderr: int, report: int) -> None:
    """stdin /dev/null, stdout and stderr the job's; every other descriptor closed but
    `report` (close-on-exec: the exec closes it)."""
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (stdout, 1), (stderr, 2)):
        if fd != target:
            os.dup2(fd, target)
    keep = sorted({0, 1, 2, report})
    for low, high in zip(keep, keep[1:] + [os.sysconf("SC_OPEN_MAX")]):
        os.closerange(low + 1, high)


def _write(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode(errors="replace"))
    except OSError:
        pass


# ---- the server -------------------------------------------------------------------------------

def serve(sock: socket.socket) -> None:
    """Answer requests until the agent closes its end."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # A Ctrl-C or a TERM to the agent's group is the agent's to handle: it closes the socket.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read()) if os.geteuid() == 0 else -1
    into_cgroup = True  # until the kernel says it cannot
    while True:
        fds = array.array("i")
        try:
            # Close-on-exec, all three: the child's stdout and stderr are dup2'd (the copies
            # are not), and its report pipe must close at its exec.
            data, ancillary, _, _ = sock.recvmsg(HEADER.size, socket.CMSG_SPACE(FDS_PER_REQUEST * fds.itemsize),
                                                 socket.MSG_CMSG_CLOEXEC)
        except InterruptedError:
            continue
        if not data:
            return
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        try:
            if len(data) < HEADER.size:
                data += read_exactly(sock, HEADER.size - len(data))
            (size,) = HEADER.unpack(data)
            if size > MAX_REQUEST_BYTES or len(fds) != FDS_PER_REQUEST:
                return
            spec = marshal.loads(read_exactly(sock, size))
            answer, into_cgroup = spawn(spec, fds[0], fds[1], fds[2], last_cap, into_cgroup)
        except EOFError:
            return
        finally:
            for fd in fds:
                os.close(fd)
        body = marshal.dumps(answer)
        sock.sendall(HEADER.pack(len(body)) + body)


def spawn(spec: dict, stdout: int, stderr: int, report: int, last_cap: int, into_cgroup: bool) -> tuple[dict, bool]:
    """Clone the job's process: (the answer, whether cloning into a cgroup still looks possible)."""
    cgroup_fd = -1
    if into_cgroup and spec["cgroup_dir"]:
        try:
            cgroup_fd = os.open(spec["cgroup_dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            cgroup_fd = -1
    try:
        pid = -1
        if cgroup_fd >= 0:
            try:
                pid = clone3(CLONE_PARENT | CLONE_INTO_CGROUP, cgroup_fd)
            except OSError as exc:
                if exc.errno not in (22, 7, 95, 16):  # EINVAL, E2BIG, EOPNOTSUPP, EBUSY: an older kernel
                    raise
                into_cgroup = False  # the children join as the chain's stage did
        if pid < 0:
            pid = clone3(CLONE_PARENT)
        if pid == 0:
            become(spec, stdout, stderr, report, joined=cgroup_fd >= 0 and into_cgroup, last_cap=last_cap)
    except OSError as exc:
        return {"pid": -1, "errno": exc.errno or 0, "detail": str(exc)}, into_cgroup
    finally:
        if cgroup_fd >= 0:
            os.close(cgroup_fd)
    return {"pid": pid}, into_cgroup


def read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
