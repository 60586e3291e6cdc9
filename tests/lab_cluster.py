"""Several hosts for real (root only): the registry and the scheduler in the lab's
control-plane namespace, each agent in a namespace of its own with its own address, on
one bridge (netns.Lab); every process is stopped and the namespaces removed after the
test.

The servers listen on the lab's bridge, not loopback, so they need the tokens (else they
refuse to start): the test calls the operator routes with the operator token (`api`),
and each agent proves its node with its own credential, derived from the agent secret."""
import os
import shutil

import pytest
import requests

import netns
from cluster import BIN, Proc, base_env, kill_leftover_jobs, world_traversable_dir
from helpers import wait_for

from corral.shared.credentials import node_token

OPERATOR_TOKEN = "multihost-operator-token-7a2b9c"
AGENT_SECRET = "multihost-agent-secret-4f1d2c"
SERVER_TOKENS = {"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": AGENT_SECRET}
REGISTRY = f"http://{netns.CP_ADDR}:9000"
SCHEDULER = f"http://{netns.CP_ADDR}:9001"
api = requests.Session()
api.headers["Authorization"] = f"Bearer {OPERATOR_TOKEN}"


def lab_of(tmp_path, agents: int):
    """The lab (its namespaces up), the list its processes are kept in and their
    directories (logs; states, which job uids may traverse); stopped and removed when
    the generator is closed."""
    reason = netns.available()
    if reason:
        pytest.skip(reason)
    lab = netns.Lab(agents=agents).up()
    procs: list[Proc] = []
    state = world_traversable_dir("corral-lab-")
    try:
        yield lab, procs, (tmp_path, state)
    finally:
        for proc in reversed(procs):
            proc.stop()
        for proc in procs:
            if proc.name.startswith("host-"):
                kill_leftover_jobs(proc.name, os.path.join(state, proc.name))
        lab.down()
        shutil.rmtree(state, ignore_errors=True)


def start(lab, procs, dirs, name, ns, argv, **env):
    """A process in namespace `ns`: an agent when `env` names NODE_ID, else a server."""
    tmp_path, state_root = dirs
    if "NODE_ID" in env:
        env["CORRAL_NODE_TOKEN"] = node_token(AGENT_SECRET, env["NODE_ID"])
    else:
        env.update(SERVER_TOKENS)
    full = base_env(os.path.join(state_root, name), **env)
    proc = Proc(name, netns.Lab.exec_argv(ns, argv), full, str(tmp_path / f"{name}.log"))
    procs.append(proc)
    return proc


def start_servers(lab, procs, dirs, registry_env=None, **scheduler_env) -> None:
    """The registry and the scheduler on the control-plane host, answering."""
    start(lab, procs, dirs, "registry", lab.cp,
          [os.path.join(BIN, "corral-registry"), "--host", netns.CP_ADDR, "--port", "9000"], **(registry_env or {}))
    start(lab, procs, dirs, "scheduler", lab.cp,
          [os.path.join(BIN, "corral-scheduler"), "--host", netns.CP_ADDR, "--port", "9001"],
          REGISTRY_URL=REGISTRY, **scheduler_env)
    for url in (REGISTRY, SCHEDULER):
        wait_for(lambda: requests.get(url + "/healthz", timeout=2).ok, timeout=30, message=url)
