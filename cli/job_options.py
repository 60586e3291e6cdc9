"""The options that describe a job, defined once for every command that makes one:
`corral job run` (one job or an --array of them) and `corral schedule add` (the job
each slot runs). Each of them takes every field of a job request the API takes;
`job run` adds what only a submission has (a start time, dependencies, an array)."""
from typing import Callable

import click

from corral.shared import wire

from . import scheduling as sched
from .scheduling import Checked

JOB_OPTIONS = (
    click.option("--type", "job_type", type=click.Choice(list(wire.JOB_TYPES)), help="run (default) or service."),
    click.option("--port", type=int, help="The port a service listens on (it gets PORT)."),
    click.option("--env", "env_vars", multiple=True, metavar="K=V", help="An environment variable (repeatable)."),
    click.option("--deploy-url", metavar="URL", help="http(s):// or s3:// zip unpacked into the work dir."),
    click.option("--sha256", "deploy_sha256", metavar="HEX", help="The zip's SHA-256, checked before unpacking."),
    click.option("--node", "instance_id", metavar="NODE", help="Pin the job to this node."),
    # Not `name`: `corral schedule add NAME` has an argument of that name.
    click.option("--name", "job_name", metavar="NAME", help="A name for the job (services are registered under it)."),
    click.option("--max-retries", type=int, help="Retries of a failed attempt (default: the scheduler's)."),
    click.option("--memory-mb", type=int, help="Memory limit in MB."),
    click.option("--cpu-percent", type=int, help="CPU limit, 100 = one CPU."),
    click.option("--max-processes", type=int, help="The most processes and threads at once (default: the node's)."),
    click.option("--disk-mb", type=int, help="The most its work dir may hold, in MB (default: the cluster's)."),
    click.option("--gpus", type=int, help="GPUs it needs on its node; it sees only those."),
    click.option("--gpu-model", metavar="MODEL",
                 help="Only GPUs whose model contains this, ignoring case (a100, h100, \"RTX 4090\")."),
    click.option("--gpu-memory-mb", type=int, help="Only GPUs with at least this much memory each."),
    click.option("--resource", "resources", multiple=True, type=Checked(sched.parse_resource, "NAME=N"),
                 help="A countable resource its node must have free, as the node's agent declares it "
                      "(AGENT_RESOURCES), e.g. fpga=1 (repeatable)."),
    click.option("--nodes", type=int,
                 help="Run jobs: run on this many distinct nodes at once, each with the limits, GPUs and resources "
                      "above; placed all together or not at all (default 1)."),
    click.option("--timeout", "timeout_secs", type=Checked(sched.parse_duration, "DURATION"),
                 help="Run jobs: stop and fail it once it has run this long: 90, 90s, 15m, 2h, 1d (default: the "
                      "scheduler's JOB_TIMEOUT_SECS, or the team's max timeout when lower; at most its "
                      "JOB_TIMEOUT_MAX_SECS and the team's max timeout)."),
    click.option("--signal", "signal_before_end", type=Checked(sched.parse_signal_before_end, "SIG@DURATION"),
                 help="Run jobs: send SIG to the job's processes DURATION before its timeout, to save its work "
                      "(as Slurm's --signal): USR1@60s, USR1@5m; SIG is " + sched.SIGNAL_NAMES + "."),
    click.option("--kill-signal", type=Checked(sched.parse_signal, "SIG"),
                 help="What every end Corral causes (timeout, cancel, preemption) starts with (default TERM)."),
    click.option("--kill-grace", "kill_grace_secs", type=Checked(sched.parse_grace, "DURATION"),
                 help="How long from --kill-signal to SIGKILL: 30, 30s, 2m; 0 for none (default: the "
                      "scheduler's JOB_KILL_GRACE_SECS)."),
    click.option("--health-path", metavar="PATH", help="A service's HTTP health check path."),
    click.option("--on-node-lost", type=click.Choice(list(wire.ON_NODE_LOST)),
                 help="What to do when the node is lost."),
    click.option("--constraint", "constraints", multiple=True, type=Checked(sched.parse_constraint, "EXPR"),
                 help="A condition on the node's labels (repeatable, all must hold): LABEL=V, LABEL!=V, "
                      "LABEL:in=A,B, LABEL:not_in=A,B, LABEL:exists, LABEL:not_exists."),
    click.option("--pool", type=Checked(sched.parse_name, "POOL"),
                 help="Only nodes of this pool (their `pool` label)."),
    click.option("--priority", type=Checked(sched.parse_priority, "N"),
                 help="0-100 (default 50): higher is placed first."),
    click.option("--concurrency-key", type=Checked(sched.parse_name, "KEY"),
                 help="Share the key's limit (`corral concurrency set KEY N`) with the other jobs that name it."),
    click.option("--not-preemptible", "preemptible", flag_value=False, default=None,
                 help="Run only within the team's guaranteed quota, never on borrowed capacity: never preempted."),
)
# The keyword arguments the options above give a command, and the request field of
# each where the two differ.
OPTION_NAMES = ("job_type", "port", "env_vars", "deploy_url", "deploy_sha256", "instance_id", "job_name",
                "max_retries", "memory_mb", "cpu_percent", "max_processes", "disk_mb", "gpus", "gpu_model",
                "gpu_memory_mb", "resources", "nodes", "timeout_secs",
                "signal_before_end", "kill_signal", "kill_grace_secs", "health_path", "on_node_lost", "constraints",
                "pool", "priority", "concurrency_key", "preemptible")
FIELD_NAMES = {"job_name": "name"}


def job_options(command: Callable) -> Callable:
    """The job options on a command, in the order of JOB_OPTIONS in its help."""
    for option in reversed(JOB_OPTIONS):
        command = option(command)
    return command


def parse_env(values: tuple[str, ...]) -> dict[str, str]:
    env_vars = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="'--env'")
        env_vars[key] = value
    return env_vars


def request_fields(options: dict) -> dict:
    """Take the job options out of a command's keyword arguments (`options` keeps the
    others): the request fields of those given."""
    given = {name: options.pop(name) for name in OPTION_NAMES}
    warning, timeout = given["signal_before_end"], given["timeout_secs"]
    if warning is not None and timeout is not None and warning["secs"] >= timeout:
        raise sched.usage_error(f"--signal {warning['signal']}@{warning['secs']}s: it must come before the end, "
                                f"less than --timeout ({timeout}s)")
    fields = {}
    for name, value in given.items():
        if value is None or value == ():
            continue
        if name == "env_vars":
            value = parse_env(value)
        elif name == "constraints":
            value = list(value)
        elif name == "resources":
            value = dict(value)
        fields[FIELD_NAMES.get(name, name)] = value
    return fields
