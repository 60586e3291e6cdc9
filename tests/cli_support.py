"""What the `corral` command line's tests share: the servers' mocked addresses, a fixed now,
running a command through click's runner, and checking a one-line error."""
import datetime
import json

from click.testing import CliRunner

from corral.cli.main import cli

SCHED = "http://sched.test"
REG = "http://reg.test"
NOW = datetime.datetime(2026, 11, 29, 12, 0, 0, tzinfo=datetime.timezone.utc).timestamp()


def iso(seconds_ago: float) -> str:
    dt = datetime.datetime.fromtimestamp(NOW - seconds_ago, tz=datetime.timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def corral(*args, token=None):
    env = {"CORRAL_ADDR": SCHED, "CORRAL_REGISTRY_ADDR": REG, "CORRAL_TOKEN": token,
           "FORCE_COLOR": None, "NO_COLOR": None, "TTY_COMPATIBLE": None}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="corral")


def one_line_error(result, code=1) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stdout == ""
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def a_job(job_id="job-7", command="etl", **fields) -> dict:
    """A job answer as the scheduler gives one, with `fields` changed."""
    job = {"job_id": job_id, "name": None, "node_id": "node-1", "command": command, "job_type": "run",
           "status": "pending", "attempt": 1, "retry_count": 0, "max_retries": 1, "exit_code": None,
           "created_at": iso(180), "running_at": None, "finished_at": None}
    job.update(fields)
    return job


def body_of(mock, index=0) -> dict:
    """The JSON body of the mock's `index`th call."""
    return json.loads(mock.calls[index].request.body)
