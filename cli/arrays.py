"""`corral array …`: an array's jobs counted by status, cancelling what has not finished,
and following an array submitted with `corral job run --array N --wait`."""
import click

from corral.shared import states

from . import format as fmt
from .common import CliError, Env, echo_json, json_option, note
from .polling import SIGINT_EXIT, Poller

COUNTED = states.ALL


def counts(summary: dict) -> str:
    """`3 pending, 2 running, 5 done, 0 failed, 0 cancelled`."""
    jobs = summary.get("jobs") or {}
    return ", ".join(f"{jobs.get(status, 0)} {status}" for status in COUNTED)


def unfinished(summary: dict) -> bool:
    jobs = summary.get("jobs") or {}
    return bool(jobs.get(states.PENDING) or jobs.get(states.RUNNING))


def job_range(summary: dict) -> str:
    first, last = summary.get("first_job_id"), summary.get("last_job_id")
    return str(first) if first == last else f"{first} to {last}"


def submitted(env: Env, answer: dict, wait: bool, as_json: bool) -> None:
    """What `job run --array` prints: the array's id on stdout (its JSON with --json); with
    --wait, it follows the array until none of its jobs is pending or running."""
    array_id = answer["array_id"]
    env.subject = array_id
    if not wait:
        if as_json:
            echo_json(answer)
        else:
            click.echo(array_id)
            note(f"submitted {array_id}: {answer.get('count')} jobs ({job_range(answer)}), "
                 f"at most {answer.get('parallel')} at once")
        return
    if not as_json:
        note(f"submitted {array_id}: {job_range(answer)}")
    final = follow(env, array_id, quiet=as_json)
    if as_json:
        echo_json(final)
    jobs = final.get("jobs") or {}
    if jobs.get(states.DONE, 0) != final.get("count"):
        raise CliError(f"{array_id}: not every job is done ({counts(final)})")


def follow(env: Env, array_id: str, quiet: bool = False) -> dict:
    """Poll the array until none of its jobs is pending or running, printing each change of counts."""
    poller = Poller(env, array_id, quiet, fetch=lambda: env.scheduler.get_array(array_id))
    current, seen = env.scheduler.get_array(array_id), None
    try:
        while True:
            line = f"{array_id}: {counts(current)}"
            if line != seen and not quiet:
                note(line)
            seen = line
            if not unfinished(current):
                return current
            current = poller.next()
    except KeyboardInterrupt:
        note(f"\ncorral: stopped following {array_id}; it goes on (`corral array cancel {array_id}` stops it)")
        click.get_current_context().exit(SIGINT_EXIT)


def summary_fields(summary: dict, now: float) -> list[tuple[str, object]]:
    created = summary.get("created_at")
    return [("array_id", summary.get("array_id")), ("jobs", job_range(summary)),
            ("count", summary.get("count")), ("parallel", summary.get("parallel")),
            ("created_at", f"{fmt.timestamp(created)} ({fmt.relative(created, now)})" if created else None),
            ("status", counts(summary))]


@click.group()
def array() -> None:
    """Follow and cancel job arrays (`corral job run --array N`)."""


@array.command("show")
@click.argument("array_id")
@json_option()
@click.pass_obj
def show(env: Env, array_id: str, as_json: bool) -> None:
    """An array's jobs, counted by status."""
    env.subject = array_id
    summary = env.scheduler.get_array(array_id)
    if as_json:
        echo_json(summary)
        return
    fmt.emit(fmt.key_values(summary_fields(summary, env.now())))


@array.command("cancel")
@click.argument("array_id")
@json_option("Print the API's answer (the array's summary).")
@click.pass_obj
def cancel(env: Env, array_id: str, as_json: bool) -> None:
    """Cancel every job of the array that has not finished."""
    env.subject = array_id
    summary = env.scheduler.cancel_array(array_id)
    echo_json(summary) if as_json else click.echo(f"{array_id}: {counts(summary)}")
