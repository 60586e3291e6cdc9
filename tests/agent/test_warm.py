"""The warm launch keeper (agent/warm.py) with a fake chain, cgroups and clock: when
it starts a chain, for which limits, under which uid key, and what it gives back."""
import logging
import types

import pytest

from corral.agent import cgroups, identity, uids, warm

LIMITS = warm.Limits(512, 100, 1024)


class FakeChain:
    def __init__(self, cgroup, user, private_tmp):
        self.cgroup, self.user, self.private_tmp = cgroup, user, private_tmp
        self.ended = self.discarded = False
        self.pid = 4242

    def alive(self):
        return not (self.ended or self.discarded)

    def discard(self):
        self.discarded = True

    def failure(self):
        return "exit 125: corral-launch: could not mount a private /tmp"


class FakeCgroups(cgroups.NoCgroups):
    def __init__(self):
        super().__init__("test")
        self.present = set()

    def create(self, name, memory_mb, cpu_percent, max_processes=None):
        group = super().create(name, memory_mb, cpu_percent, max_processes)
        self.present.add(name)
        group.remove = lambda timeout=2.0: self.present.discard(name) or True
        return group


@pytest.fixture
def parts(tmp_path):
    pool = uids.UidPool(70000, 70009, str(tmp_path / "uids.json"), claims_dir=str(tmp_path / "claims"))
    pool.load()
    now = [100.0]
    started = []
    failing = []
    wanted = [True]

    def start(tail_bytes, *, cgroup, user, private_tmp):
        if failing:
            raise failing[0]
        started.append(FakeChain(cgroup, user, private_tmp))
        return started[-1]

    manager = FakeCgroups()
    keeper = warm.WarmKeeper(identity.PerJobUsers(pool), manager, 1024, lambda mb: ("tmp", mb), LIMITS,
                             wanted=lambda: wanted[0], start=start, clock=lambda: now[0])

    return types.SimpleNamespace(pool=pool, now=now, started=started, failing=failing, wanted=wanted,
                                 manager=manager, keeper=keeper)


def test_it_starts_one_chain_for_the_first_limits_under_a_uid_and_cgroup_of_its_own(parts):
    first = parts.keeper.fill_once()
    assert first is not None and parts.keeper.ready() is first
    assert parts.keeper.fill_once() is None and len(parts.started) == 1  # one at a time
    chain = parts.started[0]
    assert parts.pool.held() == {first.key: chain.user.uid} and first.key.startswith("warm:")
    assert chain.cgroup.name == first.cgroup.name and first.cgroup.name in parts.manager.present
    assert chain.cgroup.limits == {"memory_mb": 512, "cpu_percent": 100, "max_processes": None}
    assert chain.private_tmp == ("tmp", 512) and first.limits == LIMITS


def test_it_starts_none_while_the_agent_could_take_no_job(parts):
    parts.wanted[0] = False
    assert parts.keeper.fill_once() is None and parts.started == []


def test_a_run_job_with_its_limits_takes_it_and_the_next_comes_a_moment_later(parts):
    first = parts.keeper.fill_once()
    assert parts.keeper.take("run", LIMITS) is first and parts.keeper.ready() is None
    assert not first.start.discarded and first.key in parts.pool.held()  # the job's now
    assert parts.keeper.fill_once() is None  # not while the job it gave is starting
    parts.now[0] += warm.SETTLE_SECS
    second = parts.keeper.fill_once()
    assert second is not None and second.key != first.key and second.cgroup.name != first.cgroup.name


@pytest.mark.parametrize("job_type, limits", [("service", LIMITS), ("run", warm.Limits(300, 100, 1024)),
                                              ("run", warm.Limits(512, 50, 1024)),
                                              ("run", warm.Limits(512, 100, 10))])
def test_a_job_it_does_not_fit_starts_cold_and_the_chain_goes(parts, job_type, limits):
    first = parts.keeper.fill_once()
    assert parts.keeper.take(job_type, limits) is None
    parts.now[0] += warm.SETTLE_SECS
    second = parts.keeper.fill_once()
    assert first.start.discarded and first.key not in parts.pool.held()
    assert first.cgroup.name not in parts.manager.present
    # The next is made for what the last run job asked.
    assert second.limits == (limits if job_type == "run" else LIMITS)


def test_a_chain_that_ended_on_its_own_is_given_back_and_the_next_waits(parts, caplog):
    first = parts.keeper.fill_once()
    first.start.ended = True
    with caplog.at_level(logging.WARNING, logger="corral.agent.warm"):
        assert parts.keeper.fill_once() is None
    assert "could not mount a private /tmp" in caplog.text
    assert first.key not in parts.pool.held() and first.cgroup.name not in parts.manager.present
    assert parts.keeper.take("run", LIMITS) is None
    parts.now[0] += 0.9
    assert parts.keeper.fill_once() is None  # backing off
    parts.now[0] += 0.2
    assert parts.keeper.fill_once() is not None


def test_a_chain_that_cannot_start_leaves_nothing_held_and_backs_off(parts, caplog):
    parts.failing.append(OSError("no setpriv"))
    with caplog.at_level(logging.WARNING, logger="corral.agent.warm"):
        assert parts.keeper.fill_once() is None
    assert "no setpriv" in caplog.text
    assert parts.pool.held() == {} and parts.manager.present == set()
    parts.failing.clear()
    assert parts.keeper.fill_once() is None
    parts.now[0] += 1.0
    assert parts.keeper.fill_once() is not None


def test_close_gives_the_chain_back_and_starts_no_other(parts):
    first = parts.keeper.fill_once()
    parts.keeper.close()
    assert first.start.discarded and parts.pool.held() == {} and parts.manager.present == set()
    parts.now[0] += 1000
    assert parts.keeper.fill_once() is None and parts.keeper.take("run", LIMITS) is None


def test_no_name_of_it_is_a_jobs():
    from corral.agent.prepare import cgroup_name
    from corral.agent.services import file_stem
    for job_id in ("warm", "warm-1", "warm:1", "warm-1-next", "1-next"):
        for attempt in (1, 2):
            assert file_stem(job_id, attempt) != warm.WARM_KEY.format(n=attempt)
            assert cgroup_name(job_id, attempt) != warm.WARM_CGROUP.format(n=attempt)
