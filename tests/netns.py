"""Test hosts in network namespaces: a control-plane host and agent hosts on one
private bridge, made and removed by the test (root only).

    root ns ── veth ──┐
    cp ns:  bridge (10.231.7.1) ── veth ── agent ns a1 (10.231.7.11)
                                 └─ veth ── agent ns a2 (10.231.7.12)

The addresses exist only inside these namespaces and the test's own veth.
"""
import fcntl
import os
import shutil
import subprocess
import uuid

SUBNET = "10.231.7"
CP_ADDR = f"{SUBNET}.1"
ROOT_ADDR = f"{SUBNET}.254"
LOCK_PATH = "/run/corral-test-netns.lock"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=20)


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (the `ip` command)"
    return None


class Lab:
    def __init__(self, agents: int = 2):
        tag = uuid.uuid4().hex[:5]
        self.cp = f"crcp{tag}"
        self.agent_ns = [f"cra{i + 1}{tag}" for i in range(agents)]
        self.agent_addr = [f"{SUBNET}.{11 + i}" for i in range(agents)]
        self._tag = tag
        self._links: list[str] = []
        self._lock: int | None = None

    def up(self) -> "Lab":
        # One lab on this host at a time: every lab has the same subnet, and the test
        # process reaches it through a veth of the root namespace (a second lab of
        # another test process would route that subnet too).
        self._lock = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            return self._up()
        except BaseException:
            self.down()
            raise

    def _up(self) -> "Lab":
        ip("netns", "add", self.cp)
        ip("-n", self.cp, "link", "set", "lo", "up")
        ip("-n", self.cp, "link", "add", "br0", "type", "bridge")
        ip("-n", self.cp, "addr", "add", f"{CP_ADDR}/24", "dev", "br0")
        ip("-n", self.cp, "link", "set", "br0", "up")
        # The test process (root namespace) reaches the lab through its own veth.
        host_end = f"crh{self._tag}"
        ip("link", "add", host_end, "type", "veth", "peer", "name", "up0", "netns", self.cp)
        self._links.append(host_end)
        ip("addr", "add", f"{ROOT_ADDR}/24", "dev", host_end)
        ip("link", "set", host_end, "up")
        self._attach(self.cp, "up0")
        for i, (ns, addr) in enumerate(zip(self.agent_ns, self.agent_addr)):
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"port{i}", "netns", self.cp)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            self._attach(self.cp, f"port{i}")
        return self

    def _attach(self, ns: str, link: str) -> None:
        ip("-n", ns, "link", "set", link, "master", "br0")
        ip("-n", ns, "link", "set", link, "up")

    def cut(self, ns: str) -> None:
        """Partition an agent host: its only link goes down."""
        ip("-n", ns, "link", "set", "eth0", "down")

    def heal(self, ns: str) -> None:
        ip("-n", ns, "link", "set", "eth0", "up")

    def down(self) -> None:
        for ns in [*self.agent_ns, self.cp]:
            ip("netns", "del", ns, check=False)
        for link in self._links:
            ip("link", "del", link, check=False)
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None

    @staticmethod
    def exec_argv(ns: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]
