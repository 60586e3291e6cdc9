"""A uid per job, from a configured range (AGENT_UID_RANGE).

As Nomad's dynamic workload users and systemd's DynamicUser do: jobs of one node cannot
signal, trace or read each other. A uid needs no passwd entry; gid = uid, no
supplementary groups. docs/agent.md ("Users") says how to set it up.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

from corral.shared.files import write_private

log = logging.getLogger(__name__)

CLAIMS_DIR = "/run/corral/uids"
# How long after a change the file is written (_write_behind).
WRITE_DELAY_SECS = 0.05


class UidsExhausted(Exception):
    """Every uid of the range is held by a job of this node."""


def parse_range(text: str) -> tuple[int, int]:
    """"70000-79999" -> (70000, 79999). Raises ValueError."""
    first, sep, last = text.partition("-")
    try:
        low, high = int(first.strip()), int(last.strip())
    except ValueError:
        raise ValueError(f"must look like 70000-79999, got {text!r}") from None
    if not sep or not 1 <= low <= high <= 2**31 - 2:
        raise ValueError(f"must be FIRST-LAST with 1 <= FIRST <= LAST < 2^31-1, got {text!r}")
    return low, high


class UidPool:
    """Hands out the next free uid after the last one given, cycling through the range,
    so a uid comes back as late as possible (files a job left outside its work dir stay
    its uid's until then). The allocation is a JSON file (mode 0600) in the agent's dir,
    `{"last": uid, "held": {"<job>-<attempt>": uid}}`, written on every change, so a
    restarted agent keeps its re-adopted services' uids. Several agents may share a host
    and a range: a uid is also claimed host-wide by creating CLAIMS_DIR/<uid> (O_EXCL,
    naming the agent's dir and the job), removed when it is given back. A uid whose
    claim exists is skipped unless the agent dir it names is gone; a restarted agent
    removes the claims it left for jobs that are gone; /run is emptied at boot."""

    def __init__(self, first: int, last: int, path: str, claims_dir: str = CLAIMS_DIR):
        self.first, self.last = first, last
        self.path = path
        self.claims_dir = claims_dir
        self.owner = os.path.dirname(os.path.abspath(path))  # the agent's dir, in its claims
        self._lock = threading.Lock()
        self._last_given = last  # so that the first uid given is `first`
        self._held: dict[str, int] = {}
        # The file is written behind the changes, by a thread of its own (_save).
        self._write_wanted = threading.Event()
        self._write_lock = threading.Lock()
        self._writer_pid: int | None = None
        self._changes = self._written = 0  # changes made, and the count the file has

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def load(self) -> None:
        """Read the file a previous agent left (a missing or broken file: start afresh,
        which only means a uid may come back sooner), and remove this agent's claims of
        uids it no longer holds."""
        os.makedirs(self.claims_dir, mode=0o700, exist_ok=True)
        try:
            with open(self.path) as f:
                data = json.load(f)
            last = data["last"]
            held = {str(k): v for k, v in data["held"].items()}
        except FileNotFoundError:
            last, held = None, {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring the uid allocation file %s: %s", self.path, exc)
            last, held = None, {}
        with self._lock:
            if isinstance(last, int) and self.first <= last <= self.last:
                self._last_given = last
            self._held = {k: v for k, v in held.items()
                          if isinstance(v, int) and not isinstance(v, bool) and self.first <= v <= self.last}
            self._sweep_claims()

    def _sweep_claims(self) -> None:
        """Remove the claims of this agent's that its held map does not list (a crash
        between the two writes, a lost allocation file)."""
        try:
            names = os.listdir(self.claims_dir)
        except OSError:
            return
        mine = set(self._held.values())
        for name in names:
            if name.isdigit() and int(name) not in mine and self._claim_owner(int(name)) == self.owner:
                self._unclaim(int(name))

    def held(self) -> dict[str, int]:
        with self._lock:
            return dict(self._held)

    def acquire(self, key: str) -> int:
        """A uid for the job `key` (its own again when it already holds one)."""
        with self._lock:
            if key in self._held:
                return self._held[key]
            taken = set(self._held.values())
            for step in range(1, self.size + 1):
                uid = self.first + (self._last_given - self.first + step) % self.size
                if uid not in taken and self._claim(uid, key):
                    self._held[key] = self._last_given = uid
                    self._save()
                    return uid
        raise UidsExhausted(f"every uid of {self.first}-{self.last} is held by a job of this node "
                            "or of another agent on this host")

    def hold(self, key: str, uid: int) -> bool:
        """Mark `uid` as held by `key` (a re-adopted service). False when it is outside
        the range or another job (of this agent or another) holds it."""
        with self._lock:
            if not self.first <= uid <= self.last or any(
                    k != key and v == uid for k, v in self._held.items()):
                return False
            if self._claim_owner(uid) != self.owner and not self._claim(uid, key):
                return False
            self._held[key] = uid
            self._save()
            return True

    def rekey(self, old_key: str, key: str) -> int:
        """The uid `old_key` holds, held by `key` from now on (its host-wide claim names
        `old_key` still: only its first line, the agent's dir, is read). One `key`
        already holds is a bug: raises KeyError, as does an `old_key` that holds none."""
        with self._lock:
            if key in self._held:
                raise KeyError(f"{key} holds uid {self._held[key]} already")
            uid = self._held[key] = self._held.pop(old_key)
            self._save()
            return uid

    def release(self, key: str) -> int | None:
        """Give back the uid of `key`; the uid, or None when it held none."""
        with self._lock:
            uid = self._held.pop(key, None)
            if uid is not None:
                self._unclaim(uid)
                self._save()
            return uid

    def _claim(self, uid: int, key: str) -> bool:
        """Claim `uid` host-wide; False when somebody holds it already."""
        path = os.path.join(self.claims_dir, str(uid))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            owner = self._claim_owner(uid)
            if not owner or os.path.isdir(owner):
                return False
            log.info("uid %d was claimed by the agent in %s, which is gone; taking it over", uid, owner)
            self._unclaim(uid)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                return False
        with os.fdopen(fd, "w") as f:
            f.write(f"{self.owner}\n{key}\n")
        return True

    def _claim_owner(self, uid: int) -> str | None:
        try:
            with open(os.path.join(self.claims_dir, str(uid))) as f:
                return f.readline().rstrip("\n")
        except OSError:
            return None

    def _unclaim(self, uid: int) -> None:
        try:
            os.unlink(os.path.join(self.claims_dir, str(uid)))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove the claim of uid %d: %s", uid, exc)

    def _save(self) -> None:
        """Have the file written, behind the caller: a job's start must not wait for the
        disk, and replacing a file may (ext4 flushes the data of a file renamed over
        another: now and then tens of milliseconds on a job's start path under load,
        docs/benchmarks.md, "Where the late jobs were").
        The file is a hint (see _write), so a change it has not reached yet costs no
        more than a lost write would. Called under the pool's lock."""
        self._changes += 1
        pid = os.getpid()
        if self._writer_pid != pid:
            self._writer_pid = pid
            threading.Thread(target=self._write_behind, name="uid-file", daemon=True).start()
        self._write_wanted.set()

    def flush(self) -> None:
        """Write the file now, with every change so far (an agent stopping)."""
        self._write()

    def _write_behind(self) -> None:
        while True:
            self._write_wanted.wait()
            # A moment later: the job whose start changed the pool starts first (the
            # write competes with it for the CPU), and a burst of changes is one write.
            time.sleep(WRITE_DELAY_SECS)
            self._write_wanted.clear()  # changes from now on ask for another write
            self._write()

    def _write(self) -> None:
        """Atomically (a crash leaves the old file or the new one), the latest state. Not
        synced: a lost write only lets a uid come back sooner; services keep theirs in
        their own state files, which are, and the claims a lost write leaves are swept
        at the next start (load)."""
        with self._write_lock:
            with self._lock:
                changes = self._changes
                data = {"last": self._last_given, "held": dict(self._held)}
            if changes == self._written:
                return  # the file has it already (a flush got there first)
            try:
                write_private(self.path, json.dumps(data))
                self._written = changes
            except OSError as exc:
                log.warning("could not write the uid allocation file %s: %s", self.path, exc)


def processes_of(uid: int) -> list[int]:
    """Live pids whose real uid is `uid` (from /proc/<pid>/status; zombies, which have
    exited already, are left out)."""
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"State:") and line.split()[1] in (b"Z", b"X"):
                        break
                    if line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(name))
                        break
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return found


def kill_processes_of(uid: int, timeout: float = 2.0) -> int:
    """SIGKILL every process running under `uid` until none is left (or `timeout`):
    without cgroups, what a job left behind outside its process group. Returns how
    many were signalled."""
    deadline = time.monotonic() + timeout
    signalled = 0
    while True:
        pids = processes_of(uid)
        if not pids or time.monotonic() >= deadline:
            return signalled
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                signalled += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
