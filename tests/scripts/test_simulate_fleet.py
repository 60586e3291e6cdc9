"""The fleet simulator's agents behave like the real one where the benchmark's
figures depend on it."""
import importlib.util
import os
import sys

from corral.agent.lease import IDLE_RENEW_SECS
from paths import REPO



def load_simulator(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO, "scripts"))  # as when run as a script
    spec = importlib.util.spec_from_file_location("simulate_fleet", os.path.join(REPO, "scripts", "simulate_fleet.py"))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def test_idle_simulated_agents_renew_their_lease_as_seldom_as_real_ones(monkeypatch):
    simulator = load_simulator(monkeypatch)
    assert simulator.idle_renew_secs(simulator.Config()) == IDLE_RENEW_SECS > 0
    assert simulator.idle_renew_secs(simulator.Config(idle_renew_secs=0)) == 0
