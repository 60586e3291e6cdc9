"""What the `corral` command line's tests share: the servers' mocked addresses, a fixed now,
running a command through click's runner, and checking a one-line error."""
import datetime

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
