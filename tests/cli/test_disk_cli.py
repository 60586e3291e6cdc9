"""The command line and a job's disk limit: `--disk-mb` on submit, `disk_mb` and
`ended_by` in `corral job status`, and the line a followed job ends with."""
import re

from responses import matchers

from cli_support import NOW, SCHED, corral, iso
from corral.cli import jobs


def disk_job(**fields) -> dict:
    job = {"job_id": "job-7", "name": None, "node_id": "node-1", "command": "dd", "job_type": "run",
           "status": "failed", "attempt": 1, "exit_code": -1, "disk_mb": 20, "ended_by": "disk",
           "stdout": "", "stderr": "job exceeded its disk limit of 20 MB\n", "created_at": iso(180),
           "running_at": iso(65), "finished_at": iso(60)}
    job.update(fields)
    return job


def test_job_run_sends_disk_mb(mock):
    mock.post(f"{SCHED}/jobs", status=201, json=disk_job(status="pending"),
              match=[matchers.json_params_matcher({"command": "true", "disk_mb": 20})])
    result = corral("job", "run", "--disk-mb", "20", "--", "true")
    assert result.exit_code == 0, result.output


def test_job_status_shows_the_disk_limit_and_why_the_agent_ended_the_job(mock):
    mock.get(f"{SCHED}/jobs/job-7", json=disk_job())
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    out = corral("job", "status", "job-7").stdout
    assert re.search(r"^disk_mb +20 MB$", out, re.M) and re.search(r"^ended_by +disk$", out, re.M), out
    mock.replace("GET", f"{SCHED}/jobs/job-7", json=disk_job(disk_mb=None, ended_by=None))
    out = corral("job", "status", "job-7").stdout
    assert re.search(r"^disk_mb +no limit$", out, re.M), out


def test_a_job_ended_for_disk_says_so_where_it_is_followed():
    assert "over its disk limit of 20 MB" in jobs.progress(disk_job(), NOW)
    assert "disk" not in jobs.progress(disk_job(ended_by=None, exit_code=1), NOW)
