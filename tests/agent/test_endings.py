"""What the agent reports of a started job that ended (endings.report_of, pure)."""
import pytest

from corral.agent.endings import (FENCED_MESSAGE, OOM_MESSAGE, SETUP_MESSAGE, STOPPED_MESSAGE, TIMEOUT_MESSAGE,
                                  Report, report_of)
from corral.agent.jobs import END_FENCED, END_STOPPING, END_TIMEOUT


def report(end_reason=None, exit_code=0, stderr="", setup_failed=False, oom_limit_mb=None):
    return report_of(end_reason, exit_code, stderr, setup_failed=setup_failed, oom_limit_mb=oom_limit_mb,
                     node_id="node-1", lease_secs=20)


def test_a_job_that_exits_on_its_own_reports_its_exit_code():
    assert report(exit_code=0, stderr="warn") == Report("done", 0, "warn")
    assert report(exit_code=3, stderr="boom\n") == Report("failed", 3, "boom\n")


def test_a_job_past_its_timeout_failed_with_minus_one_whatever_it_exited_with():
    assert report(END_TIMEOUT, exit_code=0, stderr="partial") == Report("failed", -1, "partial\n" + TIMEOUT_MESSAGE)


@pytest.mark.parametrize("reason, message", [(END_STOPPING, STOPPED_MESSAGE),
                                             (END_FENCED, FENCED_MESSAGE.format(20))])
def test_the_nodes_own_ends_are_requeued_without_spending_a_retry(reason, message):
    assert report(reason, exit_code=-15) == Report("failed", -1, message, requeue=True)


def test_a_launch_that_failed_before_the_command_is_the_nodes_problem():
    got = report(exit_code=1, stderr="mount: permission denied", setup_failed=True)
    assert got == Report("failed", -1, "mount: permission denied\n" + SETUP_MESSAGE.format("node-1"))


def test_an_out_of_memory_kill_says_so_with_the_limit():
    assert report(exit_code=-9, oom_limit_mb=64) == Report("failed", -9, OOM_MESSAGE.format(64))


def test_the_agents_reason_wins_over_an_out_of_memory_reading():
    assert report(END_TIMEOUT, exit_code=-9, oom_limit_mb=64).stderr == TIMEOUT_MESSAGE
