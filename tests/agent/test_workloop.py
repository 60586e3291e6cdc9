"""The agent's work loop, driven one tick at a time (agent/workloop.py) with a fake agent."""
import threading
import types

from corral.agent.workloop import Steps, WorkLoop
from corral.shared.clients import Unreachable


class FakeAgent:
    def __init__(self, clock):
        self._clock = clock
        self.calls = []
        self.long_poll = True
        self.settings = types.SimpleNamespace(poll_interval=3.0)
        self.slot_freed = threading.Event()
        self.fail = set()
        self.services_only = False

    def _step(self, name):
        self.calls.append(name)
        if name in self.fail:
            raise Unreachable(f"{name} failed")

    def reap_once(self):
        self._step("reap")

    def take_claimed(self):
        self._step("take")

    def reconcile_once(self):
        self._step("reconcile")

    def poll_once(self):
        self._step("poll")

    def reconcile_paced(self, backoff):
        self._step("reconcile")
        return self._clock() + self.settings.poll_interval

    def only_services_left(self):
        return self.services_only


def steps(agent):
    return Steps(agent.reap_once, agent.take_claimed, agent.reconcile_once, agent.reconcile_paced, agent.poll_once,
                 agent.only_services_left, refused_backoff=None, slot_freed=agent.slot_freed, clock=agent._clock,
                 poll_interval=agent.settings.poll_interval, long_poll=agent.long_poll)


def fake(now=100.0):
    clock = [now]
    agent = FakeAgent(lambda: clock[0])
    return agent, clock


def test_with_claims_it_reaps_and_takes_claimed_work_every_tick_and_reconciles_every_poll_interval():
    agent, clock = fake()
    loop = WorkLoop(steps(agent), clock[0], claims=True)
    loop.tick(clock[0])
    assert agent.calls == ["reap", "take", "reconcile"]
    agent.calls.clear()
    clock[0] += 1.0
    loop.tick(clock[0])
    assert agent.calls == ["reap", "take"]
    clock[0] += 2.0
    agent.calls.clear()
    loop.tick(clock[0])
    assert agent.calls == ["reap", "take", "reconcile"]


def test_a_failing_reap_backs_off_and_the_rest_of_the_tick_goes_on():
    agent, clock = fake()
    agent.fail.add("reap")
    loop = WorkLoop(steps(agent), clock[0], claims=True)
    loop.tick(clock[0])
    assert agent.calls == ["reap", "take", "reconcile"] and loop.next_reap == clock[0] + 0.5
    agent.calls.clear()
    loop.tick(clock[0] + 0.4)
    assert "reap" not in agent.calls
    loop.tick(clock[0] + 0.5)
    assert agent.calls.count("reap") == 1


def test_when_polling_a_freed_slot_polls_at_once_and_a_failing_scheduler_waits_its_backoff():
    agent, clock = fake()
    loop = WorkLoop(steps(agent), clock[0], claims=False)

    def tick_at(t):
        agent.calls.clear()
        clock[0] = t
        loop.tick(t)
        return agent.calls

    assert tick_at(100.0) == ["reap", "take", "reconcile", "poll"]
    assert tick_at(100.5) == ["reap", "take"]
    agent.slot_freed.set()
    assert tick_at(100.6) == ["reap", "take", "reconcile", "poll"] and not agent.slot_freed.is_set()
    agent.fail.add("reconcile")
    assert tick_at(104.0) == ["reap", "take", "reconcile"] and not loop.poll_ok
    agent.slot_freed.set()   # while failing, a freed slot does not hurry the next try
    assert tick_at(104.5) == ["reap", "take"]
    assert tick_at(105.0) == ["reap", "take", "reconcile"]   # the backoff's 1 s passed


def test_once_mode_takes_work_from_one_poll_and_is_done_when_only_services_are_left():
    agent, clock = fake()
    loop = WorkLoop(steps(agent), clock[0], claims=False, once=True)
    assert not loop.done()
    loop.tick(clock[0])
    assert agent.calls.count("poll") == 1 and not loop.done()
    agent.calls.clear()
    loop.tick(clock[0] + 10)
    assert "poll" not in agent.calls and "reconcile" in agent.calls
    agent.services_only = True
    assert loop.done()
