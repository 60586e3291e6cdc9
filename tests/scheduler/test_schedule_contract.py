"""A schedule's request (POST /schedules): what it takes and the clear refusals of
what it does not."""
import pytest

from corral.scheduler.contract import ScheduleRequest
from corral.shared.errors import BadRequest

JOB = {"command": "python etl.py"}


def test_a_cron_schedule_and_an_interval_schedule_are_taken_with_their_defaults():
    cron = ScheduleRequest.check({"name": "nightly-etl", "cron": "30 2 * * *", "time_zone": "Europe/Berlin",
                                  "job": JOB})
    assert (cron.overlap, cron.catch_up, cron.enabled, cron.time_zone) == ("allow", "latest", True, "Europe/Berlin")
    every = ScheduleRequest.check({"name": "tick", "interval_secs": 1, "start_at": "2026-12-24T02:00:00+01:00",
                                   "job": dict(JOB, priority=80, constraints=[{"label": "zone", "op": "=",
                                                                               "value": "a"}]),
                                   "overlap": "skip", "catch_up": "all", "enabled": False})
    assert every.interval_secs == 1 and every.job["priority"] == 80 and every.time_zone == "UTC"


@pytest.mark.parametrize("body, says", [
    ({"name": "x", "job": JOB}, "give 'cron' or 'interval_secs' (one of them)"),
    ({"name": "x", "cron": "@daily", "interval_secs": 60, "job": JOB}, "give 'cron' or 'interval_secs'"),
    ({"name": "x", "cron": "61 2 * * *", "job": JOB}, "field 1 (minute) is not valid: '61'"),
    ({"name": "x", "cron": "0 2 * *", "job": JOB}, "a cron expression has five fields"),
    ({"name": "x", "cron": "@yearly", "job": JOB}, "unknown cron alias '@yearly'"),
    ({"name": "x", "cron": "@daily", "time_zone": "Mars/Base", "job": JOB}, "unknown time zone 'Mars/Base'"),
    ({"name": "x", "interval_secs": 0.5, "job": JOB}, "'interval_secs' must be"),
    ({"name": "x", "interval_secs": "60", "job": JOB}, "'interval_secs' must be"),
    ({"name": "x", "cron": "@daily", "start_at": "2026-12-24T02:00:00Z", "job": JOB},
     "'start_at' anchors an 'interval_secs' schedule"),
    ({"name": "x", "interval_secs": 60, "start_at": "2026-12-24T02:00:00", "job": JOB}, "'start_at' needs a zone"),
    ({"name": "x", "interval_secs": 60, "start_at": "tomorrow", "job": JOB}, "'start_at' must be an ISO-8601"),
    ({"name": "x", "cron": "@daily", "job": {"command": " "}},
     "'job' is not a valid job request: 'command' must not be blank"),
    ({"name": "x", "cron": "@daily", "job": {"command": "x", "priority": 101}},
     "'job' is not a valid job request: 'priority' must be"),
    ({"name": "x", "cron": "@daily", "job": {"command": "x", "env_vars": {"LD_PRELOAD": "/x.so"}}},
     "'job' is not a valid job request"),
    ({"name": "x", "cron": "@daily", "job": {"command": "x", "run_at": "2026-12-24T02:00:00Z"}},
     "'job' may not have 'run_at'"),
    ({"name": "x", "cron": "@daily", "job": {"command": "x", "delay_secs": 5}}, "'job' may not have 'delay_secs'"),
    ({"name": "x", "cron": "@daily", "job": {"command": "x", "depends_on": [{"job_id": "job-1"}]}},
     "'job' may not have 'depends_on'"),
    ({"name": "x", "cron": "@daily", "job": {"command": "x", "array": {"count": 2}}}, "'job' may not have 'array'"),
    ({"name": "x", "cron": "@daily", "job": "echo hi"}, "'job' must be a job request, as POST /jobs takes it"),
    ({"name": "a b", "cron": "@daily", "job": JOB}, "'name' must be"),
    ({"name": "x", "cron": "@daily", "job": JOB, "overlap": "queue"}, "'overlap' must be one of"),
    ({"name": "x", "cron": "@daily", "job": JOB, "catch_up": "some"}, "'catch_up' must be one of"),
    ({"name": "x", "cron": "@daily", "job": JOB, "every": 5}, "unknown field 'every'"),
])
def test_a_bad_schedule_is_refused_with_a_clear_sentence(body, says):
    with pytest.raises(BadRequest) as refused:
        ScheduleRequest.check(body)
    assert says in refused.value.message
