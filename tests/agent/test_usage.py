"""What a lease renewal says the node's jobs use: the pure arithmetic over two
readings (time passed in), and the meter that reads the held jobs' cgroups."""
import logging

from corral.agent import cgroups
from corral.agent.jobs import LocalJob
from corral.agent.usage import MAX_CPU_PERCENT, MAX_MEMORY_MB, Meter, Sample, usage

MiB = 1024 * 1024


def test_memory_is_the_jobs_memory_now_summed_in_mb():
    now = Sample(10.0, {"a": (100 * MiB, 1.0), "b": (50 * MiB + 5, None), "c": (None, 2.0)})
    assert usage(None, now)["memory_mb"] == 150


def test_the_first_reading_has_no_interval_so_no_cpu():
    assert usage(None, Sample(10.0, {"a": (MiB, 50.0)})) == {"memory_mb": 1, "cpu_percent": 0}


def test_cpu_is_the_jobs_cpu_time_over_the_interval_in_percent_of_one_cpu():
    before = Sample(100.0, {"a": (0, 10.0), "b": (0, 4.0)})
    after = Sample(104.0, {"a": (0, 14.0), "b": (0, 6.0)})  # 4 s and 2 s of CPU in 4 s
    assert usage(before, after)["cpu_percent"] == 150


def test_a_job_that_ended_between_readings_drops_out_without_going_negative():
    before = Sample(100.0, {"a": (0, 10.0), "gone": (0, 500.0)})
    after = Sample(105.0, {"a": (0, 11.0)})
    assert usage(before, after)["cpu_percent"] == 20


def test_a_job_that_started_between_readings_counts_from_its_first_reading():
    """Its CPU time before the interval (a re-adopted service's hours) is not this interval's."""
    before = Sample(100.0, {"a": (0, 10.0)})
    after = Sample(105.0, {"a": (0, 11.0), "new": (0, 7200.0)})
    assert usage(before, after)["cpu_percent"] == 20
    later = Sample(110.0, {"a": (0, 11.0), "new": (0, 7202.5)})
    assert usage(after, later)["cpu_percent"] == 50


def test_a_counter_that_went_back_or_was_unreadable_counts_nothing_this_time():
    before = Sample(100.0, {"reset": (0, 50.0), "unread": (0, None), "a": (0, 1.0)})
    after = Sample(102.0, {"reset": (0, 1.0), "unread": (0, 9.0), "a": (0, 2.0)})
    assert usage(before, after)["cpu_percent"] == 50


def test_no_time_passed_is_no_cpu_not_a_division_by_zero():
    before = Sample(100.0, {"a": (0, 1.0)})
    assert usage(before, Sample(100.0, {"a": (0, 2.0)}))["cpu_percent"] == 0
    assert usage(before, Sample(99.0, {"a": (0, 2.0)}))["cpu_percent"] == 0  # a clock that went back


def test_figures_past_what_a_renewal_may_say_are_sent_as_the_bound():
    before = Sample(0.0, {"a": (0, 0.0)})
    huge = Sample(1.0, {"a": ((MAX_MEMORY_MB + 5) * MiB, 5000.0)})
    assert usage(before, huge) == {"memory_mb": MAX_MEMORY_MB, "cpu_percent": MAX_CPU_PERCENT}


class Reading(cgroups.NullJobCgroup):
    def __init__(self, name, values):
        super().__init__(name)
        self.values = values

    def usage(self):
        if isinstance(self.values, Exception):
            raise self.values
        return dict(zip(("memory_bytes", "cpu_seconds"), self.values))


def held(job_id, cgroup):
    return LocalJob(job_id, 1, "run", "/nonexistent", 0.0, None, cgroup=cgroup)


def test_the_meter_reads_the_held_jobs_cgroups_and_keeps_the_previous_reading():
    now = [100.0]
    jobs = [held("job-1", Reading("job-1-1", (64 * MiB, 1.0))), held("job-2", None)]  # job-2: preparing
    meter = Meter(lambda: jobs, lambda: True, lambda: now[0])
    assert meter.read() == {"memory_mb": 64, "cpu_percent": 0}
    jobs[0].cgroup.values, now[0] = (32 * MiB, 3.0), 110.0
    assert meter.read() == {"memory_mb": 32, "cpu_percent": 20}


def test_the_meter_reads_nothing_without_cgroups():
    meter = Meter(lambda: [held("job-1", Reading("job-1-1", (MiB, 1.0)))], lambda: False, lambda: 0.0)
    assert meter.read() is None


def test_a_failed_reading_is_no_usage_logged_at_debug_and_the_next_one_works(caplog):
    now = [100.0]
    job = held("job-1", Reading("job-1-1", (MiB, 1.0)))
    meter = Meter(lambda: [job], lambda: True, lambda: now[0])
    meter.read()
    job.cgroup.values, now[0] = PermissionError("denied"), 105.0
    with caplog.at_level(logging.DEBUG, logger="corral.agent.usage"):
        assert meter.read() is None
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    job.cgroup.values, now[0] = (MiB, 2.0), 110.0
    assert meter.read() == {"memory_mb": 1, "cpu_percent": 10}  # from the last reading that worked
