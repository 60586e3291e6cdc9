"""A job's disk limit and the node's free-space floor (agent/disk.py): the pure
decisions, measuring a work dir, and the Agent ending a job whose work dir outgrew
its `disk_mb` and taking no work under the floor, against the real scheduler app
(test_disk_limits_integration.py: `corral-agent` processes, for real)."""
import json
import logging
import os

import responses

from corral.agent import cgroups, disk
from corral.agent.cli import main
from corral.agent.endings import Report, ended_by, report_of
from corral.agent.jobs import END_DISK, END_FENCED, END_TIMEOUT
from helpers import wait_for
from scheduler_double import REGISTRY, SCHEDULER

MiB = 1024 * 1024


# --- pure decisions --------------------------------------------------------------------------

def test_a_work_dir_is_over_its_limit_only_past_it():
    assert not disk.over_limit(20 * MiB, 20)
    assert disk.over_limit(20 * MiB + 1, 20)
    assert not disk.over_limit(10 ** 15, None)  # no limit


def test_the_node_is_under_its_floor_only_below_it():
    assert disk.under_floor(1024 * MiB - 1, 1024)
    assert not disk.under_floor(1024 * MiB, 1024)
    assert not disk.under_floor(0, 0)  # no floor


def test_a_job_ended_for_disk_is_failed_and_says_its_limit():
    got = report_of(END_DISK, 0, "wrote", setup_failed=False, oom_limit_mb=None, node_id="n", lease_secs=20,
                    disk_mb=20)
    assert got == Report("failed", -1, "wrote\njob exceeded its disk limit of 20 MB")
    assert (ended_by(END_DISK, False), ended_by(END_TIMEOUT, False), ended_by(None, True)) == (
        "disk", "timeout", "oom")
    assert ended_by(None, False) is None and ended_by(END_FENCED, False) is None


# --- measuring --------------------------------------------------------------------------------

def test_usage_counts_every_file_once_and_follows_no_link(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "big").write_bytes(b"x" * (3 * MiB))
    os.link(tmp_path / "a" / "b" / "big", tmp_path / "again")
    (tmp_path / "elsewhere").symlink_to("/usr")
    used = disk.usage(str(tmp_path))
    assert used.complete and 3 * MiB <= used.bytes < 4 * MiB


def test_a_measurement_out_of_time_is_a_lower_bound(tmp_path):
    for n in range(3):
        (tmp_path / str(n)).mkdir()
    ticks = iter(range(100))
    used = disk.usage(str(tmp_path), budget_secs=1.5, clock=lambda: next(ticks))
    assert not used.complete


def test_a_missing_work_dir_measures_nothing(tmp_path):
    assert disk.usage(str(tmp_path / "gone")) == disk.Usage(0, True)


# --- the floor --------------------------------------------------------------------------------

def test_under_the_floor_the_watch_says_why_once_and_when_it_is_over(caplog):
    free = [100 * MiB]
    watch = disk.DiskWatch("/w", 1024, 1.0, jobs=None, end=None, free=lambda path: free[0])
    with caplog.at_level(logging.WARNING, logger="corral.agent.disk"):
        assert watch.check_floor() == ("only 100 MB free on the filesystem of /w, under AGENT_MIN_FREE_DISK_MB "
                                       "(1024 MB)")
        watch.check_floor()
        free[0] = 2048 * MiB
        assert watch.check_floor() is None
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["taking no new work", "taking work again"]


# --- the Agent against the real scheduler app ---------------------------------------------------

def test_a_job_whose_work_dir_outgrows_its_disk_mb_is_ended_as_failed_by_disk(make_agent, scheduler):
    agent = make_agent()
    scheduler.add(command="head -c 5242880 /dev/zero > big && sleep 60", disk_mb=1)
    assert agent.intake.poll_once() == [("job-1", 1)]
    assert wait_for(agent.disk.check_once, timeout=30, message="the job to outgrow its limit") == [("job-1", 1)]
    assert wait_for(agent.reap_once, timeout=30, message="the job to end") == [("job-1", 1, "failed")]
    final = scheduler.final("job-1")
    assert (final["status"], final["exit_code"], final["ended_by"]) == ("failed", -1, "disk")
    assert final["stderr"].splitlines()[-1] == "job exceeded its disk limit of 1 MB"
    job = scheduler.job("job-1")
    assert (job["status"], job["ended_by"], job["disk_mb"]) == ("failed", "disk", 1)


def test_a_job_within_its_disk_mb_runs_to_its_end(make_agent, scheduler):
    agent = make_agent()
    scheduler.add(command="head -c 1048576 /dev/zero > small && echo ok", disk_mb=5)
    assert agent.intake.poll_once() == [("job-1", 1)]

    def ended():
        assert agent.disk.check_once() == []  # never over its limit
        return agent.reap_once()

    assert wait_for(ended, timeout=30, message="the job to end") == [("job-1", 1, "done")]
    assert scheduler.job("job-1")["ended_by"] == "exit"


def test_under_the_floor_the_agent_takes_no_work_and_takes_it_again_once_space_is_back(make_agent, scheduler,
                                                                                       caplog):
    free_mb = disk.free_bytes("/") // MiB
    with caplog.at_level(logging.WARNING, logger="corral.agent.disk"):
        agent = make_agent(min_free_disk_mb=free_mb + 1024 * 1024)  # more than this disk has
    assert agent.claims_blocked() and "under AGENT_MIN_FREE_DISK_MB" in agent.disk.low
    assert "taking no new work: only" in caplog.text
    scheduler.add(command="echo hi")
    assert agent.intake.poll_once() == [] and agent.claims.claim_once() == ([], False)
    assert scheduler.job("job-1")["status"] == "pending"

    agent.disk.floor_mb = 1  # as if space came back
    agent.disk.check_once()
    assert not agent.claims_blocked() and "taking work again" in caplog.text
    assert agent.intake.poll_once() == [("job-1", 1)]
    assert wait_for(agent.reap_once, timeout=30, message="the job to end") == [("job-1", 1, "done")]


def test_under_the_floor_the_heartbeat_and_registration_say_why_and_stop_saying_it_once_space_is_back(
        make_agent, api):
    api.add(responses.POST, f"{REGISTRY}/nodes", json={}, status=201)
    api.add(responses.POST, f"{REGISTRY}/nodes/node-1/heartbeat", json={})

    def sent(url_end):
        return [json.loads(c.request.body) for c in api.calls if c.request.url.endswith(url_end)][-1]

    agent = make_agent(node_id="node-1", min_free_disk_mb=disk.free_bytes("/") // MiB + 1024 * 1024)
    agent.membership.register()
    agent.membership.heartbeat_once()
    for body in (sent("/nodes"), sent("/heartbeat")):
        assert body["refusing_work"] == agent.disk.low and "under AGENT_MIN_FREE_DISK_MB" in body["refusing_work"]

    agent.disk.floor_mb = 1  # as if space came back
    agent.disk.check_once()
    agent.membership.heartbeat_once()
    assert sent("/heartbeat").get("refusing_work") is None  # omitted: the registry clears it
    agent.membership.register()
    assert sent("/nodes").get("refusing_work") is None


# --- corral-agent --check ---------------------------------------------------------------------

def _check(capsys, monkeypatch, tmp_path, *flags, **env):
    monkeypatch.setattr(cgroups, "detect", lambda **kw: cgroups.NoCgroups("no cgroups in this test"))
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "state"))  # not made yet: --check creates nothing
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with responses.RequestsMock() as mock:
        for url in (REGISTRY, SCHEDULER):
            mock.add(responses.GET, url + "/healthz", json={"status": "ok"})
        code = main(["--check", *flags, "--node-id", "n1", "--registry-url", REGISTRY, "--scheduler-url", SCHEDULER])
    return code, capsys.readouterr().out


def test_check_reports_the_free_space_against_the_floor(capsys, monkeypatch, tmp_path):
    code, out = _check(capsys, monkeypatch, tmp_path, "--json", AGENT_MIN_FREE_DISK_MB="1")
    space = json.loads(out)["disk"]
    assert code == 0 and space["min_free_mb"] == 1 and space["free_mb"] > 1 and not space["under_floor"]
    assert not (tmp_path / "state").exists()


def test_check_exits_1_when_the_node_is_under_its_floor(capsys, monkeypatch, tmp_path):
    floor = disk.free_bytes(str(tmp_path)) // MiB + 1024 * 1024
    code, out = _check(capsys, monkeypatch, tmp_path, AGENT_MIN_FREE_DISK_MB=str(floor))
    assert code == 1
    assert f"UNDER AGENT_MIN_FREE_DISK_MB ({floor} MB)" in out
    assert "the agent would take no work" in out
