"""`corral node …` and `corral service …`: what the registry knows."""
import re

import click

from corral.shared.clients import Rejected, Unreachable

from . import format as fmt
from . import scheduling as sched
from .scheduling import Checked
from .common import CliError, Env, echo_json, json_option, note

# From the scheduler's GET /nodes: the node's pool, and memory (MB) and CPU (100 = one CPU)
# that jobs may reserve there (ALLOC), that its jobs reserve (RSVD) and use (USED).
FIGURE_HEADERS = ["POOL", "MEM_ALLOC", "MEM_RSVD", "MEM_USED", "CPU_ALLOC", "CPU_RSVD", "CPU_USED"]


def node_headers(nodes: list[dict]) -> list[str]:
    headers = ["ID", "STATUS", "ADDRESS", "SLOTS", "RUNNING", "LABELS", "HEARTBEAT"]
    if any("drained" in n for n in nodes):  # registries before drain support do not send it
        headers.append("DRAINED")
    return headers


def node_status(node: dict):
    """Its health; a healthy node whose agent takes no new work (short of disk space) says so
    (the reason is too long for a column: list_nodes prints it below)."""
    if node.get("status") == "healthy" and node.get("refusing_work"):
        return fmt.styled("healthy (no new work)", "yellow")
    return fmt.status_cell(node.get("status"))


def node_row(node: dict, now: float, with_drained: bool) -> list:
    row = [node.get("node_id"), node_status(node), node.get("address"), node.get("slots"),
           node.get("running"), node.get("labels"), fmt.relative(node.get("last_heartbeat"), now)]
    if with_drained:
        drained = node.get("drained")
        row.append(fmt.styled("yes", "yellow") if drained else ("no" if drained is False else "-"))
    return row


def with_capacity(row: list, figures: dict | None) -> list:
    """The row with SLOTS as the scheduler counts them: the jobs the node may hold at once
    (MAX_JOBS_PER_NODE caps what the agent advertises), the advertised ones beside when fewer."""
    capacity, slots = (figures or {}).get("capacity"), (figures or {}).get("slots")
    if not isinstance(capacity, int):
        return row  # a scheduler that does not say: what the agent advertises
    cell = f"{capacity} (advertises {slots})" if isinstance(slots, int) and slots != capacity else capacity
    return row[:3] + [cell] + row[4:]


def service_row(svc: dict, now: float) -> list:
    healthy = svc.get("healthy")
    health = "healthy" if healthy else ("unhealthy" if healthy is False else "unknown")
    return [svc.get("name"), svc.get("job_id"), svc.get("node_id"), svc.get("address"), svc.get("port"),
            fmt.status_cell(health), fmt.relative(svc.get("checked_at"), now)]


def figure_cells(node: dict | None) -> list:
    """The scheduler's figures of one node ('-' where unknown, or for a node it has not synced yet)."""
    node = node or {}

    def part(kind: str, key: str, unit: str) -> str | None:
        value = (node.get(kind) or {}).get(key)
        return None if value is None else f"{value}{unit}"

    return [node.get("pool")] + [part(kind, key, unit) for key, unit in (("memory_mb", "M"), ("cpu_percent", "%"))
                                 for kind in ("allocatable", "reserved", "used")]


# ---- GPUs and other countable resources -----------------------------------------------------

# Words a GPU's model can do without in a column: the vendor and brand, the form factor,
# the memory and its kind (a device's memory has a column of its own in `node show`).
MODEL_NOISE = re.compile(r"nvidia|tesla|geforce|sxm[0-9]*|pcie|[0-9]+gb|hbm[0-9]*e?", re.IGNORECASE)


def short_model(model: str | None) -> str:
    """A GPU model as a column has room for: `NVIDIA A100-SXM4-80GB` is `A100`, `NVIDIA H100
    80GB HBM3` `H100`, `NVIDIA GeForce RTX 4090` `RTX 4090`, and a MIG instance's `NVIDIA
    A100-SXM4-40GB MIG 1g.5gb` `A100 MIG 1g.5gb`; a model of noise alone stays as it is."""
    words = [word for word in re.split(r"[\s-]+", model or "") if word]
    return " ".join(word for word in words if not MODEL_NOISE.fullmatch(word)) or (model or "").strip() or "?"


def gpu_cell(gpus: list[dict] | None, counted: bool) -> str | None:
    """`2/8 A100`: 2 of the node's 8 devices reserved by jobs (`counted`: the scheduler's
    list, which says who holds each), and their models shortened (several: `A100,A100 MIG
    1g.5gb`); `8 A100` from the registry's list, which does not say; None without GPUs."""
    if not gpus:
        return None
    models = ",".join(dict.fromkeys(short_model(g.get("model")) for g in gpus))
    if not counted:
        return f"{len(gpus)} {models}"
    return f"{sum(1 for g in gpus if g.get('job_id'))}/{len(gpus)} {models}"


def resources_cell(declared: dict | None, reserved: dict | None, counted: bool) -> str | None:
    """`fpga=1/2,licence.matlab=0/4`: reserved of declared, by name (`counted`: the
    scheduler's figures); `fpga=2` from the registry's; None without resources."""
    declared, reserved = declared or {}, reserved or {}
    names = list(dict.fromkeys([*declared, *reserved]))
    if not names:
        return None
    if not counted:
        return ",".join(f"{name}={declared.get(name, 0)}" for name in names)
    return ",".join(f"{name}={reserved.get(name, 0)}/{declared.get(name, 0)}" for name in names)


def device_headers(nodes: list[dict], figures: dict[str, dict] | None) -> list[str]:
    """GPUS when some node has GPUs, RESOURCES when some node has other resources (by the
    registry's list or the scheduler's): a cluster without them has no such columns."""
    known = [*nodes, *(figures or {}).values()]
    headers = ["GPUS"] if any(n.get("gpus") for n in known) else []
    return headers + (["RESOURCES"] if any(n.get("resources") for n in known) else [])


def device_cells(node: dict, figures: dict | None, headers: list[str]) -> list:
    """A node's GPUS and RESOURCES cells (those of `headers`): the scheduler's, which count
    what jobs reserve, for a node it has synced; else the registry's."""
    source, counted = (figures, True) if figures is not None and "gpus" in figures else (node, False)
    cells = []
    if "GPUS" in headers:
        cells.append(gpu_cell(source.get("gpus"), counted))
    if "RESOURCES" in headers:
        cells.append(resources_cell(source.get("resources"), source.get("resources_reserved"), counted))
    return cells


def gpu_row(gpu: dict) -> list:
    memory = gpu.get("memory_mb")
    job_id = gpu.get("job_id")
    return [gpu.get("index"), gpu.get("model"), None if memory is None else f"{memory} MB", gpu.get("uuid"),
            job_id if job_id else fmt.styled("free", "green")]


GPU_HEADERS = ["INDEX", "MODEL", "MEMORY", "UUID", "JOB"]


def figure_text(node: dict, key: str, unit: str) -> str:
    """`1024M reserved of 3584M, 300M used`: the scheduler's figures of one kind."""
    def part(kind: str):
        value = (node.get(kind) or {}).get(key)
        return None if value is None else f"{value}{unit}"

    reserved, allocatable, used = part("reserved"), part("allocatable"), part("used")
    text = f"{reserved or '0' + unit} reserved " + (f"of {allocatable}" if allocatable else "(allocatable unknown)")
    return text + (f", {used} used" if used else "")


def node_fields(node: dict, now: float) -> list[tuple[str, object]]:
    """`corral node show`: the scheduler's node, for people."""
    capacity, slots = node.get("capacity"), node.get("slots")
    gpus = node.get("gpus") or []
    held = sum(1 for g in gpus if g.get("job_id"))
    declared, reserved = node.get("resources") or {}, node.get("resources_reserved") or {}
    pairs: list[tuple[str, object]] = [
        ("node_id", node.get("node_id")), ("status", node_status(node))]
    if node.get("refusing_work"):
        pairs.append(("refusing_work", node.get("refusing_work")))
    pairs += [
        ("drained", fmt.styled("yes", "yellow") if node.get("drained") else "no"),
        ("address", node.get("address")), ("kind", node.get("kind")), ("pool", node.get("pool")),
        ("labels", node.get("labels")),
        ("slots", f"{node.get('slots_used')} used of {capacity}"
                  + (f" (advertises {slots})" if slots is not None and slots != capacity else "")),
        ("memory", figure_text(node, "memory_mb", "M")), ("cpu", figure_text(node, "cpu_percent", "%")),
        ("gpus", f"{held} of {len(gpus)} reserved" if gpus else "none"),
        ("resources", ", ".join(f"{name} {reserved.get(name, 0)} of {declared.get(name, 0)} reserved"
                                for name in dict.fromkeys([*declared, *reserved])) or "none"),
    ]
    for key in ("last_heartbeat", "synced_at"):
        value = node.get(key)
        pairs.append((key, f"{fmt.timestamp(value)} ({fmt.relative(value, now)})" if value else None))
    return pairs


def scheduler_nodes(env: Env) -> dict[str, dict] | None:
    """The scheduler's nodes by id; None (and a note why) when it cannot tell: the registry's
    columns are still worth showing."""
    try:
        return {str(n.get("node_id")): n for n in env.scheduler.list_nodes()}
    except Unreachable as exc:
        why = env.unreachable(exc).message
    except Rejected as exc:
        why = env.rejected(exc).message
    note(f"corral: no pools or resources: {why}")
    return None


SERVICE_HEADERS = ["NAME", "JOB", "NODE", "ADDRESS", "PORT", "HEALTH", "CHECKED"]


@click.group()
def node() -> None:
    """List and show nodes; drain and undrain them (registry)."""


@node.command("list")
@click.option("--status", type=click.Choice(["healthy", "unhealthy"]), help="Only nodes in this status.")
@json_option("Print the registry's JSON (one document) instead of a table.")
@click.pass_obj
def list_nodes(env: Env, status: str | None, as_json: bool) -> None:
    """The nodes the registry knows, with their health, and from the scheduler their pool and
    memory (MB) and CPU (%, 100 = one CPU): ALLOC what jobs may reserve, RSVD what its jobs
    reserve, USED what they use. Where nodes have GPUs or other resources: GPUS (`2/8 A100`:
    2 of 8 reserved) and RESOURCES (`fpga=1/2`: reserved of declared)."""
    nodes = env.registry.list_nodes(status=status)
    if as_json:
        echo_json(nodes)
        return
    if not nodes:
        click.echo("no nodes", err=True)
        return
    headers = node_headers(nodes)
    figures = scheduler_nodes(env)
    now = env.now()
    rows = [node_row(n, now, "DRAINED" in headers) for n in nodes]
    known = [(figures or {}).get(str(n.get("node_id"))) for n in nodes]
    if figures is not None:
        headers = headers + FIGURE_HEADERS
        rows = [with_capacity(row, f) + figure_cells(f) for row, f in zip(rows, known)]
    devices = device_headers(nodes, figures)
    if devices:
        headers = headers + devices
        rows = [row + device_cells(n, f, devices) for row, n, f in zip(rows, nodes, known)]
    fmt.emit(fmt.table(headers, rows, wide=("LABELS", "RESOURCES")))
    for n in nodes:
        if n.get("status") == "healthy" and n.get("refusing_work"):
            note(f"{n.get('node_id')} takes no new work: {n['refusing_work']}")


@node.command("show")
@click.argument("node_id")
@json_option("Print the scheduler's JSON of the node (one element of its GET /nodes).")
@click.pass_obj
def show_node(env: Env, node_id: str, as_json: bool) -> None:
    """A node as the scheduler sees it: health, pool, slots, memory and CPU, its resources
    (reserved of declared), and each GPU with its model, memory, UUID and the job it is
    reserved for."""
    env.subject = node_id
    found = next((n for n in env.scheduler.list_nodes() if str(n.get("node_id")) == node_id), None)
    if found is None:
        raise CliError(f"{node_id}: no node {node_id!r} in the scheduler's node list "
                       f"(`corral node list` shows the registry's)")
    if as_json:
        echo_json(found)
        return
    fmt.emit(fmt.key_values(node_fields(found, env.now())))
    gpus = found.get("gpus") or []
    if gpus:
        click.echo()
        fmt.emit(fmt.table(GPU_HEADERS, [gpu_row(g) for g in gpus]))


def _set_drained(env: Env, node_id: str, drained: bool, as_json: bool, deadline_secs: float | None = None) -> None:
    env.subject = node_id
    # Through the scheduler: it writes the registry's flag and its own copy, so the drain
    # holds for every placement from the answer on (the registry's alone waits for a refresh).
    answer = env.scheduler.drain(node_id, deadline_secs) if drained else env.scheduler.undrain(node_id)
    if as_json:
        echo_json(answer)
    elif drained and answer.get("deadline"):
        click.echo(f"{node_id}: drained (no new jobs go to it; the {answer.get('stopping', 0)} it runs are "
                   f"stopped and requeued at {fmt.timestamp(answer['deadline'])} unless they finish first)")
    elif drained:
        click.echo(f"{node_id}: drained (no new jobs go to it; what it runs finishes)")
    else:
        click.echo(f"{node_id}: undrained (it takes jobs again)")


@node.command("drain")
@click.argument("node_id")
@click.option("--deadline", "deadline_secs", type=Checked(sched.parse_grace, "DURATION"),
              help="Stop what it still runs this long from now (each job's kill signal and grace) and "
                   "requeue it elsewhere, no retry spent: 90s, 10m, 2h; 0: now.")
@json_option("Print the API's answer (the node's JSON).")
@click.pass_obj
def drain(env: Env, node_id: str, deadline_secs: float | None, as_json: bool) -> None:
    """Send no new jobs to a node; the jobs it runs finish, or are stopped at --deadline."""
    _set_drained(env, node_id, True, as_json, deadline_secs)


@node.command("undrain")
@click.argument("node_id")
@json_option("Print the API's answer (the node's JSON).")
@click.pass_obj
def undrain(env: Env, node_id: str, as_json: bool) -> None:
    """Let a drained node take jobs again."""
    _set_drained(env, node_id, False, as_json)


@node.command("revoke-credential")
@click.argument("node_id")
@click.option("--min-generation", type=click.IntRange(2, 999_999_999), metavar="N",
              help="Refuse the node's credentials below generation N (default: one more than now). "
                   "Sending the same N again changes nothing.")
@json_option("Print the API's answer ({node_id, min_generation, revoked_at}).")
@click.pass_obj
def revoke_credential(env: Env, node_id: str, min_generation: int | None, as_json: bool) -> None:
    """Revoke a node's credential (CORRAL_NODE_TOKEN) alone, on the scheduler and the registry,
    without rotating the agent secret; prints how to issue its next one."""
    env.subject = node_id
    answer = env.scheduler.revoke_credential(node_id, min_generation)
    if as_json:
        echo_json(answer)
        return
    generation = answer.get("min_generation")
    click.echo(f"{node_id}: credentials below generation {generation} are refused from now on "
               f"(the scheduler and the registry answer them 401; other nodes are not affected)")
    note(f"issue its next credential on a server host (with CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN set):\n"
         f"  corral-scheduler node-token {node_id} --generation {generation}\n"
         f"and set it as CORRAL_NODE_TOKEN in that node's agent.env, then restart its agent")


@click.group()
def service() -> None:
    """List the services recorded in the registry."""


@service.command("list")
@click.option("--healthy", is_flag=True, help="Only services whose last health check passed.")
@click.option("--name", help="Only services of this name.")
@click.option("--node", "node_id", metavar="NODE", help="Only services on this node.")
@json_option()
@click.pass_obj
def list_services(env: Env, healthy: bool, name: str | None, node_id: str | None, as_json: bool) -> None:
    """Services (from service jobs) and their health."""
    filters = {k: v for k, v in (("healthy", "true" if healthy else None), ("name", name), ("node_id", node_id)) if v}
    services = env.registry.list_services(**filters)
    if as_json:
        echo_json(services)
        return
    if not services:
        click.echo("no services", err=True)
        return
    now = env.now()
    fmt.emit(fmt.table(SERVICE_HEADERS, [service_row(s, now) for s in services]))
