"""`corral schedule …`: jobs run at the slots of a cron expression or an interval."""
import time

import click

from corral.shared import wire

from . import format as fmt
from . import scheduling as sched
from .common import Env, echo_json, json_option, note
from .job_options import job_options, request_fields
from .jobs import shell_command
from .scheduling import Checked

NAME = Checked(sched.parse_name, "NAME")


@click.group()
def schedule() -> None:
    """Add, list, show, enable, disable and delete schedules, and list their runs."""


@schedule.command("add")
@click.argument("name", type=NAME)
@click.option("--cron", metavar="EXPR", help="Five fields (minute hour day-of-month month day-of-week), or "
                                             "@hourly, @daily, @weekly, @monthly.")
@click.option("--every", "interval_secs", type=float, metavar="SECS", help="Instead of --cron: every SECS seconds.")
@click.option("--start-at", metavar="TIME", help="With --every: the first slot (ISO-8601 with a zone).")
@click.option("--tz", "time_zone", metavar="ZONE", help="The IANA zone --cron is read in (default UTC).")
@click.option("--overlap", type=sched.choice(*wire.SCHEDULE_OVERLAP),
              help="A slot whose last run is still on: allow (default), skip, cancel_previous.")
@click.option("--catch-up", type=sched.choice(*wire.SCHEDULE_CATCH_UP),
              help="The slots missed while the scheduler was down: latest (default), none, all.")
@click.option("--disabled", is_flag=True, help="Create it disabled (`corral schedule enable` starts it).")
@click.option("--team", type=sched.TEAM, help="The team it and its runs belong to (default: your default team); "
                                            "making one takes that team's admin.")
@job_options
@json_option("Print the schedule's JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] CMD [ARG]...")
@click.pass_obj
def add(env: Env, name: str, cron, interval_secs, start_at, time_zone, overlap, catch_up, disabled, team, as_json,
        command, **options) -> None:
    """Run CMD at every slot of --cron (in --tz) or every --every seconds. Options may come
    before or after NAME; CMD goes after `--`. The job options are those of `corral job run`
    (not --at, --after or --array: a slot is one job, started at its time)."""
    env.subject = name
    job = request_fields(options)
    if command:
        job["command"] = shell_command(command)
    if "command" not in job and "deploy_url" not in job:
        raise click.UsageError("give the command to run (after --) or --deploy-url")
    body = {"name": name, "job": job, **{key: value for key, value in (
        ("cron", cron), ("interval_secs", interval_secs), ("start_at", start_at), ("time_zone", time_zone),
        ("overlap", overlap), ("catch_up", catch_up), ("team", team)) if value is not None}}
    if disabled:
        body["enabled"] = False
    answer = env.scheduler.create_schedule(body)
    if as_json:
        echo_json(answer)
    else:
        click.echo(name)
        note(f"next run: {next_run(answer)}")


def next_run(schedule: dict) -> str:
    if not schedule.get("enabled"):
        return "none (disabled)"
    return f"{schedule.get('next_run_local')} ({fmt.relative(schedule.get('next_run_at'), time.time())})"


def when(schedule: dict) -> str:
    if schedule.get("cron"):
        return f"{schedule['cron']} ({schedule.get('time_zone')})"
    return f"every {schedule.get('interval_secs'):g}s"


@schedule.command("list")
@json_option()
@click.pass_obj
def list_schedules(env: Env, as_json: bool) -> None:
    """Every schedule with when it runs and its next run."""
    schedules = env.scheduler.list_schedules()
    if as_json:
        echo_json(schedules)
        return
    if not schedules:
        note("no schedules")
        return
    fmt.emit(fmt.table(["NAME", "TEAM", "WHEN", "NEXT RUN", "OVERLAP", "CATCH-UP", "LAST JOB"],
                       [[s.get("name"), s.get("team", "-"), when(s), next_run(s), s.get("overlap"), s.get("catch_up"),
                         s.get("last_job_id") or "-"] for s in schedules]))


@schedule.command("show")
@click.argument("name", type=NAME)
@json_option()
@click.pass_obj
def show(env: Env, name: str, as_json: bool) -> None:
    """One schedule, whole."""
    env.subject = name
    answer = env.scheduler.get_schedule(name)
    if as_json:
        echo_json(answer)
        return
    fmt.emit(fmt.table(["FIELD", "VALUE"], [[key, fmt.timestamp(value) if key.endswith("_at") and value else value]
                                            for key, value in answer.items()]))


def _switch(env: Env, name: str, enabled: bool, as_json: bool) -> None:
    env.subject = name
    answer = env.scheduler.change_schedule(name, {"enabled": enabled})
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"{name}: {'enabled, next run ' + next_run(answer) if enabled else 'disabled'}")


@schedule.command("enable")
@click.argument("name", type=NAME)
@json_option("Print the schedule's JSON.")
@click.pass_obj
def enable(env: Env, name: str, as_json: bool) -> None:
    """Start it again: its next slot is counted from now (what it missed is not run)."""
    _switch(env, name, True, as_json)


@schedule.command("disable")
@click.argument("name", type=NAME)
@json_option("Print the schedule's JSON.")
@click.pass_obj
def disable(env: Env, name: str, as_json: bool) -> None:
    """Stop it: no slot fires until it is enabled."""
    _switch(env, name, False, as_json)


@schedule.command("delete")
@click.argument("name", type=NAME)
@click.pass_obj
def delete(env: Env, name: str) -> None:
    """Delete it (the jobs it created stay)."""
    env.subject = name
    env.scheduler.delete_schedule(name)
    click.echo(f"{name}: deleted")


@schedule.command("runs")
@click.argument("name", type=NAME)
@click.option("--limit", type=Checked(sched.parse_count(1, 1000), "N"), default=20, show_default=True,
              help="The newest N runs.")
@json_option()
@click.pass_obj
def runs(env: Env, name: str, limit: int, as_json: bool) -> None:
    """Its runs, newest first: each slot's job and status, or why it was skipped."""
    env.subject = name
    answer = env.scheduler.schedule_runs(name, limit)
    if as_json:
        echo_json(answer)
        return
    if not answer:
        note(f"{name}: no runs yet")
        return
    fmt.emit(fmt.table(["SLOT", "JOB", "STATUS", "SKIPPED"],
                       [[fmt.timestamp(r.get("slot")), r.get("job_id") or "-",
                         fmt.status_cell(r.get("status")) if r.get("status") else "-", r.get("skipped") or ""]
                        for r in answer]))

