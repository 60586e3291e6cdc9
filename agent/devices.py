"""Which device nodes a job may open, on a node with GPUs.

A job is given the GPUs placement reserved for it (their UUIDs, `gpus_assigned`), and
may open only those: the ordinary devices every program needs, and, with GPUs, the
NVIDIA control devices and its own `/dev/nvidiaN`. A job without GPUs opens no NVIDIA
device at all. Two ways to hold it to that (`AGENT_DEVICE_ISOLATION`):

  cgroup  cgroup v1's devices controller: every device denied but those (EPERM);
  mount   a /dev of the job's own in its mount namespace, holding only those nodes
          (ENOENT for the others; the job's uid may not make device nodes).

cgroup v2 has no devices file (its device control is an eBPF program, which no
well-kept Python library loads for us), so v2 nodes use `mount`. Both read the device
numbers of the nodes that exist here (`device_dir`), never the job's.

The ordinary devices are those container runtimes allow by default: null, zero, full,
random, urandom, tty, console, ptmx and the terminals, fuse and net/tun.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .gpus import Gpu

CGROUP, MOUNT, NONE, AUTO = "cgroup", "mount", "none", "auto"
MODES = (AUTO, CGROUP, MOUNT, NONE)
ORDINARY = ("null", "zero", "full", "random", "urandom", "tty", "console", "fuse", "net/tun")
# v1 rules beyond the nodes: the pty master and every terminal (a new devpts instance
# stands for them under `mount`).
ORDINARY_RULES = ("c 5:2 rwm", "c 136:* rwm")
NVIDIA_CONTROL = ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools")
NVIDIA_CAPS = "nvidia-caps"  # MIG's capability devices: every one, for a job with GPUs


class DeviceError(Exception):
    """A job's devices cannot be given here (a GPU reserved for it that this node lacks)."""


@dataclass(frozen=True)
class Node:
    """A device node a job may open: its path under /dev, numbers and mode."""

    path: str
    major: int
    minor: int
    mode: int

    def spec(self) -> str:
        """As the launch chain's set-up stage takes it (launch.PrivateDev): PATH:MAJOR:MINOR:MODE."""
        return f"{self.path}:{self.major}:{self.minor}:{self.mode:o}"

    def rule(self) -> str:
        return f"c {self.major}:{self.minor} rwm"


@dataclass(frozen=True)
class Access:
    """What one job may open."""

    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]   # its own, in the order placement gave them

    def cgroup_rules(self) -> list[str]:
        """devices.allow lines, after a devices.deny of everything (cgroup v1)."""
        return [*ORDINARY_RULES, *(node.rule() for node in self.nodes)]

    def specs(self) -> tuple[str, ...]:
        return tuple(node.spec() for node in self.nodes)

    def env(self) -> dict[str, str]:
        """What tells CUDA and NVIDIA's container tools which devices are the job's: its
        UUIDs in PCI bus order (CUDA's own order differs from nvidia-smi's), or none."""
        uuids = ",".join(gpu.uuid for gpu in self.gpus)
        return {"CUDA_VISIBLE_DEVICES": uuids, "NVIDIA_VISIBLE_DEVICES": uuids or "void",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


class Isolation:
    """This node's devices and how jobs are held to theirs (`mode`: CGROUP, MOUNT or NONE)."""

    def __init__(self, mode: str, gpus: Sequence[Gpu], device_dir: str = "/dev"):
        self.mode = mode
        self.gpus = {gpu.uuid: gpu for gpu in gpus}
        self.device_dir = device_dir

    @property
    def enforced(self) -> bool:
        return self.mode in (CGROUP, MOUNT)

    def for_job(self, assigned: Iterable[str]) -> Access | None:
        """The devices of a job given the GPUs `assigned` (UUIDs); None on a node without
        GPUs, whose jobs are left as they are. Raises DeviceError for a GPU this node
        does not have (AGENT_GPUS changed since it was placed)."""
        assigned = list(assigned)
        if not self.gpus and not assigned:
            return None
        own = []
        for uuid in assigned:
            gpu = self.gpus.get(uuid)
            if gpu is None:
                raise DeviceError(f"GPU {uuid}, reserved for the job, is not one of this node's "
                                  f"({', '.join(sorted(self.gpus)) or 'none'}; AGENT_GPUS)")
            own.append(gpu)
        nodes = self._nodes(ORDINARY)
        if own:
            minors = sorted({gpu.minor if gpu.minor is not None else _index_minor(gpu) for gpu in own})
            nodes += self._nodes((*NVIDIA_CONTROL, *self._caps(), *(f"nvidia{minor}" for minor in minors)))
        return Access(tuple(nodes), tuple(own))

    def _nodes(self, paths: Iterable[str]) -> list[Node]:
        """The character devices among `paths` that exist here (a node without fuse has none)."""
        found = []
        for path in paths:
            try:
                st = os.stat(os.path.join(self.device_dir, path))
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                found.append(Node(path, os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)))
        return found

    def _caps(self) -> list[str]:
        try:
            return [f"{NVIDIA_CAPS}/{name}" for name in sorted(os.listdir(os.path.join(self.device_dir, NVIDIA_CAPS)))]
        except OSError:
            return []


def _index_minor(gpu: Gpu) -> int:
    """A device declared without its minor number: /dev/nvidiaN of its (parent's) index."""
    return int(gpu.index.split(":")[0])


def choose_mode(wanted: str, has_gpus: bool, cgroup_devices: bool, mount_problem: str | None) -> tuple[str, str]:
    """The isolation mode and why: `wanted` (AGENT_DEVICE_ISOLATION); `cgroup_devices`:
    jobs' cgroups have v1's devices controller; `mount_problem`: why a private /dev
    cannot be made (None: it can). Raises ValueError when GPUs cannot be isolated as
    asked (an agent that cannot keep jobs to their GPUs does not start unless told `none`)."""
    if wanted == NONE:
        return NONE, "AGENT_DEVICE_ISOLATION=none: every job may open every device"
    if not has_gpus:
        return NONE, "the node has no GPUs"
    if wanted in (AUTO, CGROUP) and cgroup_devices:
        return CGROUP, "cgroup v1's devices controller"
    if wanted == CGROUP:
        raise ValueError("AGENT_DEVICE_ISOLATION=cgroup, but jobs' cgroups have no devices controller "
                         "(cgroup v1 only)")
    if mount_problem is None:
        return MOUNT, "a /dev of each job's own"
    raise ValueError(f"jobs cannot be kept to their GPUs: no cgroup v1 devices controller, and no /dev of "
                     f"their own ({mount_problem}); set AGENT_DEVICE_ISOLATION=none to run them anyway")
