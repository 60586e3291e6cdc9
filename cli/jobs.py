"""`corral job …`: submit, list, inspect, follow, cancel and retry jobs (scheduler API)."""
import shlex
import sys

import click

from corral.shared import states, wire
from corral.shared.clients import Rejected

from . import arrays
from . import logs as complete_logs
from . import format as fmt
from . import quotas, selection
from . import scheduling as sched
from .common import CliError, Env, echo_json, json_option, names_first, note
from .job_options import job_options, request_fields
from .polling import SIGINT_EXIT, Poller
from .scheduling import Checked

STATUSES = states.ALL
STATUS_TAIL_LINES = 10  # output lines `job status` shows


# ---- pure helpers ---------------------------------------------------------------------------

def exit_status(job: dict) -> int:
    """The exit code of `corral job run --wait` for a final job."""
    status, code = job.get("status"), job.get("exit_code")
    if status == states.DONE:
        return 0 if not code or not 0 < code < 256 else code
    if status == states.FAILED and isinstance(code, int) and 0 < code < 256:
        return code
    return 1


def progress(job: dict, now: float) -> str:
    """One line on where a job stands: `job-7: running on node-1 (attempt 1)`."""
    status, node = job.get("status"), job.get("node_id")
    line = f"{job['job_id']}: {status}"
    details = []
    if status == states.PENDING:
        reason = job.get("pending_reason") or {}
        if reason.get("code") not in (None, "placed", "backoff"):  # those two are said below
            details.append(reason.get("message"))
        if job.get("retry_count"):
            details.append(f"retry {job['retry_count']} of {job.get('max_retries', '?')}")
        after = fmt.parse_time(job.get("next_attempt_at"))
        if after is not None and after > now:
            details.append(f"next attempt {fmt.relative(job['next_attempt_at'], now)}")
        if node:
            line += f", placed on {node}"
    elif status == states.RUNNING:
        line += f" on {node or '?'}"
        details.append(f"attempt {job.get('attempt')}")
    elif status in (states.DONE, states.FAILED):
        if job.get("exit_code") is not None:
            details.append(f"exit code {job['exit_code']}")
        if job.get("oom_killed"):
            details.append("out of memory")
        details.extend(end_words(job))
        details.append(f"ran {fmt.job_duration(job, now)}")
        if node:
            details.append(f"on {node}")
    return line + (f" ({', '.join(details)})" if details else "")


def end_words(job: dict) -> list[str]:
    """What ended a finished job, when it did not exit on its own: for `progress`."""
    ended_by = job.get("ended_by")
    if ended_by == wire.ENDED_BY_DISK:
        return [f"over its disk limit of {job.get('disk_mb')} MB"]
    if ended_by == wire.ENDED_BY_OOM and not job.get("oom_killed"):  # oom_killed says it already
        return ["out of memory"]
    if ended_by == wire.ENDED_BY_TIMEOUT:
        timeout = job.get("timeout_secs")
        return ["timed out" if timeout is None else f"timed out after {fmt.duration(timeout)}"]
    if ended_by == wire.ENDED_BY_PREEMPTION:
        return ["preempted"]
    if ended_by == wire.ENDED_BY_NODE_LOST:
        return ["its node was lost"]
    return []


def job_row(job: dict, now: float) -> list:
    return [job.get("job_id"), job.get("name"), fmt.status_cell(job.get("status")), job.get("job_type"),
            job.get("node_id"), job.get("attempt"), job.get("exit_code"),
            fmt.relative(job.get("created_at"), now), fmt.job_duration(job, now)]


JOB_HEADERS = ["ID", "NAME", "STATUS", "TYPE", "NODE", "ATTEMPT", "EXIT", "CREATED", "DURATION"]
OWNER_HEADERS = ["TEAM", "SUBMITTED BY"]


def job_headers(jobs: list[dict]) -> list[str]:
    """TEAM and SUBMITTED BY when the jobs say them, WAITING (a pending job's reason) when
    some job has one: schedulers before teams, or before pending reasons, do not send them."""
    headers = JOB_HEADERS + OWNER_HEADERS if any("team" in j for j in jobs) else JOB_HEADERS
    return headers + ["WAITING"] if any(j.get("pending_reason") for j in jobs) else headers


def job_list_row(job: dict, now: float, headers: list[str]) -> list:
    row = job_row(job, now)
    if "TEAM" in headers:
        row += [job.get("team"), job.get("submitted_by")]
    return row + [sched.reason_text(job.get("pending_reason"))] if "WAITING" in headers else row


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# Fields a job shows only when they say something: the GPUs and other resources it asks
# for (0, null, {}: none) and the devices reserved for it (null: none, or not placed).
UNLESS_SET = frozenset({"gpus", "gpu_model", "gpu_memory_mb", "resources", "gpus_assigned"})
# A job of several nodes lists its members after its fields (member_rows), not among them.
MEMBER_HEADERS = ["ATTEMPT", "RANK", "MEMBER", "NODE", "STATUS", "EXIT", "ENDED BY"]


def job_fields(job: dict, now: float) -> list[tuple[str, object]]:
    """The job's fields, in the API's order and names, for people (output tails apart)."""
    pairs = []
    for key, value in job.items():
        if key in ("stdout", "stderr", "members") or (key in UNLESS_SET and not value) or (
                key == "nodes" and value == 1):
            continue
        if key == "status":
            value = fmt.status_cell(value)
        elif (key.endswith("_at") or key == "deadline") and value:
            value = f"{fmt.timestamp(value)} ({fmt.relative(value, now)})"
        elif key == "peak_memory_bytes":
            value = size(value)
        elif key == "disk_mb":
            value = "no limit" if value is None else f"{value} MB"
        elif key == "cpu_seconds" and value is not None:
            value = f"{value:.2f}s"
        elif key == "timeout_secs" and value is not None:
            value = fmt.duration(value)
        elif key == "signal_before_end" and value:
            value = f"{value.get('signal')} {fmt.seconds(value.get('secs'))} before the end"
        elif key == "kill_grace_secs" and value is not None:
            value = fmt.seconds(value)
        elif key == "constraints" and value:
            value = ", ".join(sched.constraint_text(c) for c in value)
        elif key == "depends_on" and value:
            value = ", ".join(f"{d['job_id']} ({d['condition']})" for d in value)
        elif key == "gpu_memory_mb":
            value = f"{value} MB or more each"
        elif key == "resources":
            value = ", ".join(f"{name}={count}" for name, count in value.items())
        elif key == "gpus_assigned":
            value = ", ".join(str(uuid) for uuid in value)
        elif key == "gang" and value:
            value = (f"rank {value.get('rank')} of {value.get('size')} in {value.get('gang_id')}, master "
                     f"{value.get('master_addr')}:{value.get('master_port')}")
        elif key == "pending_reason" and value:
            details = sched.reason_details(value)
            value = sched.reason_text(value) + (f" ({details})" if details else "")
        pairs.append((key, value))
    return pairs


def member_rows(members: list[dict]) -> list[list]:
    """A multi-node job's members (`job status`): every attempt's, each with its node and end."""
    return [[m.get("attempt"), m.get("rank"), m.get("job_id"), m.get("node_id"), fmt.status_cell(m.get("status")),
             m.get("exit_code"), m.get("ended_by")] for m in members]


def event_row(event: dict) -> list:
    change = f"{event.get('from') or '-'} → {event.get('to') or '-'}"
    return [fmt.timestamp(event.get("at")), change, event.get("attempt"), event.get("node_id"), event.get("reason")]


EVENT_HEADERS = ["TIME", "CHANGE", "ATTEMPT", "NODE", "REASON"]


def last_lines(text: str, count: int) -> str:
    lines = text.splitlines()
    return "\n".join(lines[-count:])


# ---- I/O helpers ----------------------------------------------------------------------------

def write_output(text: str, err: bool = False) -> None:
    """A job's output as it is; a missing last newline is added only on a terminal."""
    if not text:
        return
    stream = sys.stderr if err else sys.stdout
    if not text.endswith("\n") and stream.isatty():
        text += "\n"
    click.echo(text, nl=False, err=err)


def shell_command(words: tuple[str, ...]) -> str:
    """CMD words as one /bin/sh command: quoted and joined; one word is a command line as is."""
    return words[0] if len(words) == 1 else shlex.join(words)


# ---- commands -------------------------------------------------------------------------------

@click.group()
def job() -> None:
    """Submit, list, inspect and follow jobs."""


@job.command("run", context_settings={"allow_interspersed_args": False})
@job_options
@click.option("--idempotency-key", metavar="KEY", help="Sending the same request with the same key creates one job.")
@click.option("--at", "start", type=Checked(sched.parse_start, "TIME"),
              help="Not before TIME: ISO-8601 with a zone (2026-12-24T02:00:00Z), or from now: +30s, +10m, +2h, +1d.")
@click.option("--after", "after", multiple=True, type=Checked(sched.parse_dependency, "JOB[:COND]"),
              help="Wait for JOB to be done (repeatable); JOB:failed, JOB:finished (any end) or JOB:done.")
@click.option("--on-dependency-failure", type=sched.choice(*wire.ON_DEPENDENCY_FAILURE),
              help="When an --after condition can never hold: cancel this job (default) or run it anyway.")
@click.option("--array", type=Checked(sched.parse_count(1, sched.MAX_ARRAY), "N"),
              help="Submit N copies (each gets CORRAL_ARRAY_INDEX 0..N-1 and CORRAL_ARRAY_COUNT); prints the array id.")
@click.option("--parallel", type=Checked(sched.parse_count(1, sched.MAX_ARRAY), "M"),
              help="With --array: at most M of its jobs placed or running at once.")
@click.option("--team", type=sched.TEAM, help="The team the job (or every job of an --array) belongs to "
                                        "(default: your default team).")
@click.option("--wait", is_flag=True, help="Follow the job (or every job of an --array) to its end and exit with "
                                           "its exit code (an array: 0 when all are done, else 1).")
@json_option("Print the job's JSON (with --wait: the final job's; an array: its summary).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] CMD [ARG]...")
@click.pass_obj
def run(env: Env, command: tuple[str, ...], idempotency_key, wait, as_json, start, after, on_dependency_failure,
        array, parallel, team, **options) -> None:
    """Submit a job.

    The words of CMD are joined with shell quoting (shlex.join) into the job's command,
    which the node runs with /bin/sh -c; a single word is taken as a whole shell command
    line, so `corral job run -- 'make test | tee log'` works as typed. Options go before
    CMD: everything from CMD on is part of the command."""
    request = request_fields(options)
    request.update(sched.scheduling_fields(start, after, on_dependency_failure, array, parallel))
    if team is not None:
        request["team"] = team
    if command:
        request["command"] = shell_command(command)
    if "command" not in request and "deploy_url" not in request:
        raise click.UsageError("give a command (after --) or --deploy-url")
    submitted = env.scheduler.submit(request, idempotency_key=idempotency_key)
    if "job_id" not in submitted:  # an array's answer (a job's names its array too)
        arrays.submitted(env, submitted, wait, as_json)
        return
    job_id = submitted["job_id"]
    env.subject = job_id
    if not wait:
        if as_json:
            echo_json(submitted)
        else:
            click.echo(job_id)
            what = submitted.get("command") or submitted.get("deploy_url")
            note(f"submitted {job_id} ({submitted.get('job_type')}, {submitted.get('status')}): {what}")
        return
    final = follow(env, submitted, quiet=as_json)
    if as_json:
        echo_json(final)
    else:
        write_output(final.get("stdout") or "")
        write_output(final.get("stderr") or "", err=True)
    if final.get("status") == states.CANCELLED:
        raise CliError(f"{job_id} was cancelled")
    click.get_current_context().exit(exit_status(final))


def follow(env: Env, current: dict, quiet: bool = False) -> dict:
    """Poll the job until it is final, printing each change of status, attempt or node."""
    job_id = current["job_id"]
    poller = Poller(env, job_id, quiet)
    seen = None
    try:
        while True:
            key = (current.get("status"), current.get("attempt"), current.get("node_id"),
                   (current.get("pending_reason") or {}).get("code"))
            if key != seen and not quiet:
                note(progress(current, env.now()))
            seen = key
            if current.get("status") in fmt.FINAL:
                return current
            current = poller.next()
    except KeyboardInterrupt:
        note(f"\ncorral: stopped following {job_id}; it goes on (`corral job cancel {job_id}` stops it)")
        click.get_current_context().exit(SIGINT_EXIT)


@job.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only jobs in this status.")
@click.option("--node", "node_id", metavar="NODE", help="Only jobs placed on this node.")
@click.option("--type", "job_type", type=click.Choice(list(wire.JOB_TYPES)), help="Only jobs of this type.")
@click.option("--pending-reason", type=sched.choice(*sched.PENDING_REASONS),
              help="Only pending jobs waiting for this reason.")
@selection.filter_options
@click.option("--team", type=sched.TEAM, help="Only the jobs of this team.")
@click.option("--mine", is_flag=True, help="Only the jobs you submitted (the user `corral whoami` names).")
@click.option("--limit", type=click.IntRange(1, 1000), help="Jobs per page (default 20; 100 with --all).")
@click.option("--all", "all_pages", is_flag=True, help="Follow the pages to the oldest job.")
@json_option()
@click.pass_obj
def list_jobs(env: Env, status, node_id, job_type, pending_reason, team, mine, limit, all_pages, as_json,
              **filters) -> None:
    """List jobs, newest first (pending ones with why they wait), with their team and submitter."""
    query = {"order": "desc", "status": status, "node_id": node_id, "job_type": job_type,
             "pending_reason": pending_reason, **selection.filter_query(filters, env.now()), "team": team,
             "submitted_by": env.scheduler.whoami()["user"] if mine else None,
             "limit": limit or (100 if all_pages else 20)}
    jobs, next_query = env.scheduler.list_jobs_page(**query)
    while all_pages and next_query:
        page, following = env.scheduler.list_jobs_page(**next_query)
        jobs.extend(page)
        if following == next_query:  # a server that repeats its cursor must not loop us forever
            break
        next_query = following
    if as_json:
        echo_json(jobs)
        return
    if not jobs:
        note("no jobs")
        return
    now = env.now()
    headers = job_headers(jobs)
    rows = [job_list_row(j, now, headers) for j in jobs]
    fmt.emit(fmt.table(headers, rows, wide=("NAME", "WAITING")))
    if next_query and not all_pages:
        note(f"(more jobs: --all, or --limit above {query['limit']})")


@job.command("status")
@click.argument("job_id")
@json_option()
@click.pass_obj
def status(env: Env, job_id: str, as_json: bool) -> None:
    """A job's fields and its history (--json: the job only)."""
    env.subject = job_id
    found = env.scheduler.get_job(job_id)
    if as_json:
        echo_json(found)
        return
    events = env.scheduler.job_events(job_id)
    now = env.now()
    fmt.emit(fmt.key_values(job_fields(found, now)))
    click.echo()
    if found.get("members"):
        fmt.emit(fmt.table(MEMBER_HEADERS, member_rows(found["members"])))
        click.echo()
    if events:
        emit_events(events)
    for stream, flag in ((wire.LOG_STDOUT, ""), (wire.LOG_STDERR, " --stderr")):
        text = found.get(stream) or ""
        if text:
            click.echo(f"\n{stream} (last lines; `corral job logs {job_id}{flag}` for all kept):")
            write_output(last_lines(text, STATUS_TAIL_LINES) + "\n")


@job.command("events")
@click.argument("job_id")
@json_option()
@click.pass_obj
def events(env: Env, job_id: str, as_json: bool) -> None:
    """A job's history: every placement and status change."""
    env.subject = job_id
    found = env.scheduler.job_events(job_id)
    if as_json:
        echo_json(found)
        return
    emit_events(found)


def emit_events(events: list[dict]) -> None:
    """A job's events as a table (`job status`, `job events`)."""
    fmt.emit(fmt.table(EVENT_HEADERS, [event_row(e) for e in events], wide=("REASON",)))


@job.command("logs")
@click.argument("job_id")
@click.option("-f", "--follow", "follow_output", is_flag=True,
              help="Print the complete output's last lines, then new output as it comes, until the job ends.")
@click.option("--full", is_flag=True, help="The complete output (with -f: from its first byte).")
@click.option("--attempt", type=click.IntRange(1), help="With --full: this attempt's output (default: the latest).")
@click.option("--stderr", "use_stderr", is_flag=True, help="The job's stderr instead of its stdout.")
@click.pass_obj
def logs(env: Env, job_id: str, follow_output: bool, full: bool, attempt: int | None, use_stderr: bool) -> None:
    """Print a job's stdout (or stderr).

    Without options: the tail the job record keeps (CORRAL_OUTPUT_TAIL_BYTES). With
    --full: the whole output of the latest attempt (or --attempt N) as its node
    shipped it, byte for byte. With -f: the last lines of the complete output, then
    whatever comes next, across retries, until the job has ended and its node has
    sent all of it."""
    env.subject = job_id
    stream = wire.LOG_STDERR if use_stderr else wire.LOG_STDOUT
    if attempt is not None and (follow_output or not full):
        raise click.UsageError("--attempt goes with --full, without -f")
    try:
        if follow_output:
            complete_logs.follow(env, job_id, stream, full, complete_logs.binary_stdout())
        elif full:
            complete_logs.print_full(env, job_id, stream, attempt, complete_logs.binary_stdout())
        else:
            write_output(env.scheduler.get_job(job_id).get(stream) or "")
    except KeyboardInterrupt:
        click.get_current_context().exit(SIGINT_EXIT)


@job.command("cancel")
@click.argument("job_ids", nargs=-1, metavar="[JOB_ID]...")
@click.option("--status", type=click.Choice(states.ACTIVE),
              help="Without JOB_ID: the jobs in this status (default: pending and running).")
@click.option("--node", "node_id", metavar="NODE", help="Without JOB_ID: the jobs placed on this node.")
@selection.filter_options
@click.option("--yes", "-y", is_flag=True, help="With filters: cancel without asking.")
@json_option("Print the API's answers (one job: its JSON; several: a list).")
@click.pass_obj
def cancel(env: Env, job_ids: tuple[str, ...], status, node_id, yes: bool, as_json: bool, **filters) -> None:
    """Cancel pending or running jobs: those named, or those the filters match (listed
    first, then cancelled once you confirm; --yes where nobody can answer). Each result
    is printed; the exit code is 1 when any cancel failed."""
    query = {"status": status, "node_id": node_id, **selection.filter_query(filters, env.now())}
    given = [flag for flag, value in (("--status", status), ("--node", node_id), ("--name", query["name"]),
                                      ("--schedule", query["schedule"]), ("--array", query["array"]),
                                      ("--since", query["created_after"]), ("--until", query["created_before"]))
             if value is not None]
    if job_ids and given:
        raise sched.usage_error(f"give job ids or filters ({', '.join(given)}), not both")
    if not job_ids and not given:
        raise click.UsageError("give the jobs to cancel: their ids, or filters such as --status, --name, --node")
    if len(job_ids) == 1:  # one job, as always: its answer, or its error
        env.subject = job_ids[0]
        answer = env.scheduler.cancel(job_ids[0])
        echo_json(answer) if as_json else click.echo(progress(answer, env.now()))
        return
    if given:
        job_ids = tuple(selected_ids(env, query, yes))
    cancel_each(env, job_ids, as_json)


def selected_ids(env: Env, query: dict, yes: bool) -> list[str]:
    """The active jobs the filters match, shown, and confirmed."""
    statuses = [query["status"]] if query["status"] else list(states.ACTIVE)
    found = sorted((job for status in statuses for job in selection.every_job(env, dict(query, status=status))),
                   key=lambda job: int(job["job_id"].removeprefix("job-")))
    if not found:
        note("no pending or running job matches")
        return []
    now = env.now()
    note(fmt.render_plain(fmt.table(JOB_HEADERS, [job_row(j, now) for j in found])).rstrip("\n"))
    selection.confirm(f"Cancel these {len(found)} jobs?" if len(found) > 1 else "Cancel this job?", yes)
    return [job["job_id"] for job in found]


def cancel_each(env: Env, job_ids: tuple[str, ...], as_json: bool) -> None:
    """Cancel each job, printing its result (a failure on stderr); exit 1 when any failed."""
    answers, failed = [], 0
    for job_id in job_ids:
        try:
            answer = env.scheduler.cancel(job_id)
        except Rejected as exc:
            failed += 1
            message = exc.message
            note(f"corral: {message if names_first(message, job_id) else f'{job_id}: {message}'}")
            continue
        answers.append(answer)
        if not as_json:
            click.echo(progress(answer, env.now()))
    if as_json:
        echo_json(answers)
    if failed:
        raise CliError(f"{failed} of {len(job_ids)} jobs could not be cancelled")


@job.command("retry")
@click.argument("job_id")
@json_option("Print the API's answer (the job's JSON).")
@click.pass_obj
def retry(env: Env, job_id: str, as_json: bool) -> None:
    """Start a failed job over, with a fresh retry budget."""
    env.subject = job_id
    answer = env.scheduler.retry(job_id)
    echo_json(answer) if as_json else click.echo(progress(answer, env.now()))


@job.command("why")
@click.argument("job_id")
@json_option()
@click.pass_obj
def why(env: Env, job_id: str, as_json: bool) -> None:
    """Why a pending job waits, and what the nodes closest to taking it lack."""
    env.subject = job_id
    answer = env.scheduler.why(job_id)
    if as_json:
        echo_json(answer)
        return
    reason = answer.get("pending_reason")
    click.echo(f"{job_id}: pending: {sched.reason_text(reason) or 'no reason given'}")
    details = sched.reason_details(reason)
    if details:
        click.echo(f"  ({details})")
    if answer.get("quota"):
        click.echo("\nits team's quota:")
        fmt.emit(quotas.quota_table([answer["quota"]]))
    fair = answer.get("fair_share")
    if fair:
        users = ", ".join(f"{u.get('user')} {u.get('factor', 0):.3f}" for u in fair.get("users") or [])
        click.echo(f"\nfair share: team {fair.get('team')} factor {fair.get('factor', 0):.3f} "
                   f"({100 * (fair.get('usage_part') or 0):.1f}% of the usage on "
                   f"{100 * (fair.get('share') or 0):.1f}% of the shares)" + (f"; its user {users}" if users else ""))
    closest = answer.get("closest_nodes") or []
    if not closest:
        return
    click.echo("\nclosest nodes:")
    fmt.emit(fmt.table(["NODE", "LACKS"], [[n.get("node_id"), "; ".join(n.get("lacks") or []) or "nothing"]
                                           for n in closest], wide=("LACKS",)))
