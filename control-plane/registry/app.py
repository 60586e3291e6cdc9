"""The registry's HTTP API (Flask). Run by `corral-registry` under gunicorn."""
import time
from collections.abc import Callable
from dataclasses import dataclass

from flask import Flask, request
from peewee import fn

from corral.server import auth, guards, revocations, serve as server
from corral.server import db as dbmod
from corral.server import migrations
from corral.shared.contract import respond
from corral.shared.errors import Conflict, Forbidden, NotFound
from corral.server.http import base_app, query_choice, query_int, read_json_object, serve_openapi, serve_readiness
from corral.server.metrics import serve_metrics
from corral.shared.timeutil import iso

from . import contract, discovery, metrics, openapi
from .migrations import MIGRATIONS
from .models import Node, NodeCredential, Service, database
from .settings import RegistrySettings

SERVICE = "registry"  # its PostgreSQL schema: corral_registry

# Who may call each route (control-plane/server/auth.py); a route missing here is operator-only.
# Agents register, heartbeat and record services for the node of their credential
# only (services of their own jobs: the scheduler's grant); operators drain and
# forget nodes; both read.
ACCESS = {
    "register_node": auth.agent(auth.NODE_IN_BODY),
    "heartbeat": auth.agent(auth.NODE_IN_PATH),
    "register_service": auth.agent(auth.NODE_IN_BODY),
    "remove_service": auth.either(auth.NODE_IN_RECORD),
    "list_nodes": auth.EITHER,
    "read_node": auth.EITHER,
    "list_services": auth.EITHER,
    "sd_services": auth.READ,
    "sd_nodes": auth.READ,
    "drain": auth.OPERATOR,
    "undrain": auth.OPERATOR,
    "deregister_node": auth.OPERATOR,
    "revoke_credential": auth.OPERATOR,
}


@dataclass(frozen=True)
class Liveness:
    """Which heartbeats count as recent enough for a node to be healthy.

    A node is healthy while its last heartbeat is at most `timeout` seconds old.
    After a registry restart, nodes that were healthy when it stopped (judged by
    `last_up`, the newest heartbeat it had recorded) stay healthy for one more
    timeout from the start, so they can heartbeat again before any is declared
    unhealthy because the registry itself was away.
    """

    timeout: float
    started_at: float = 0.0
    last_up: float | None = None

    def cutoff(self, now: float) -> float:
        cutoff = now - self.timeout
        if self.last_up is not None and now <= self.started_at + self.timeout:
            cutoff = min(cutoff, self.last_up - self.timeout)
        return cutoff

    def status(self, last_heartbeat: float, now: float) -> str:
        return "healthy" if last_heartbeat >= self.cutoff(now) else "unhealthy"


def open_store(settings: RegistrySettings):
    db = dbmod.open_database(settings.database_url, settings.sqlite_synchronous, service=SERVICE,
                             options=settings.db_options)
    database.initialize(db)
    return db


def create_schema(settings: RegistrySettings, check: bool = False) -> list[str]:
    """Apply the database's pending schema migrations (the gunicorn master before the
    workers fork, and `corral-registry migrate`); the steps applied. With `check`,
    only the steps pending. A database newer than this code is a SettingError."""
    db = open_store(settings)
    dbmod.check_server(db, processes=1)
    try:
        return (migrations.pending if check else migrations.apply)(db, MIGRATIONS, settings.db_options.init)
    finally:
        dbmod.close_idle(db)  # the master forks the workers next


def create_app(settings: RegistrySettings | None = None, clock: Callable[[], float] = time.time) -> Flask:
    settings = settings or RegistrySettings.from_env()
    db = open_store(settings)
    clock = dbmod.deciding_clock(db, clock)  # PostgreSQL: the database's clock
    if not dbmod.in_a_worker():  # a server's master migrated before forking its workers
        migrations.apply(db, MIGRATIONS, settings.db_options.init)
    with db.connection_context():
        last_up = Node.select(fn.MAX(Node.last_heartbeat)).scalar()
        last_checked = Service.select(fn.MAX(Service.checked_at)).scalar()
    liveness = Liveness(settings.heartbeat_timeout_secs, clock(), last_up)
    # A health check older than SERVICE_CHECK_MAX_AGE_SECS says nothing any more: its
    # agent stopped sending it (the same grace after a registry restart as for nodes).
    freshness = Liveness(settings.service_check_max_age_secs, clock(), last_checked)
    app = base_app(__name__, settings.max_body_bytes)
    floors = revocations.Floors(lambda: revocations.load_floors(db, NodeCredential))
    guards.install(app, settings.credentials, ACCESS, settings.allowed_hosts, server.loopback_only(), floors=floors)
    dbmod.init_app(app, db)
    serve_openapi(app, openapi.DOCUMENT)

    def ready(checks: dict) -> None:
        dbmod.check_ready(db, checks)

    serve_readiness(app, ready)
    serve_metrics(app, metrics.FAMILIES, lambda: metrics.scrape(liveness.cutoff(clock()), db))

    def node_view(node: Node, now: float) -> contract.Node:
        return contract.Node.model_validate({
            "node_id": node.node_id, "address": node.address, "kind": node.kind,
            "slots": node.slots, "cpus": node.cpus, "memory_mb": node.memory_mb,
            "max_memory_mb": node.max_memory_mb, "max_cpu_percent": node.max_cpu_percent,
            "labels": node.labels or {}, "default_limits": node.default_limits,
            "reserved_memory_mb": node.reserved_memory_mb or 0, "reserved_cpu_percent": node.reserved_cpu_percent or 0,
            "running": node.running, "drained": node.drained, "refusing_work": node.refusing_work,
            "status": liveness.status(node.last_heartbeat, now),
            "registered_at": iso(node.registered_at), "last_heartbeat": iso(node.last_heartbeat),
        })

    def healthy_node_ids(now: float):
        return Node.select(Node.node_id).where(Node.last_heartbeat >= liveness.cutoff(now))

    def service_view(svc: Service, node_healthy: bool, now: float) -> contract.Service:
        """A service is healthy when its check passes, recently, and its node is healthy:
        a lost node's services are not served to load balancers, whatever they said
        last (false), nor one whose check is stale (null: unknown)."""
        healthy = svc.healthy
        if healthy is not None and not node_healthy:
            healthy = False
        elif healthy is not None and (svc.checked_at is None or svc.checked_at < freshness.cutoff(now)):
            healthy = None
        return contract.Service.model_validate({
            "job_id": svc.job_id, "name": svc.name, "node_id": svc.node_id, "address": svc.address,
            "port": svc.port, "attempt": svc.attempt, "healthy": healthy,
            "node_healthy": node_healthy, "checked_at": iso(svc.checked_at),
            "registered_at": iso(svc.registered_at),
        })

    def one_service_view(svc: Service) -> contract.Service:
        node = Node.get_or_none(Node.node_id == svc.node_id)
        now = clock()
        return service_view(svc, node is not None and liveness.status(node.last_heartbeat, now) == "healthy", now)

    def checked_healthy(now: float):
        """The services whose last check, recent enough, passed, on healthy nodes (a where clause)."""
        return ((Service.healthy == True) & (Service.checked_at >= freshness.cutoff(now))  # noqa: E712
                & Service.node_id.in_(healthy_node_ids(now)))

    @app.post("/nodes")
    def register_node():
        registration = contract.NodeRegistration.check(read_json_object())
        node_id, fields = registration.node_id, registration.columns()
        auth.require_node(node_id)
        now = clock()
        with db.atomic():
            is_new = Node.get_or_none(Node.node_id == node_id) is None
            # One upsert: two registrations at once (an agent retrying, a replica each)
            # both succeed; a re-registration updates what the node says of itself and
            # keeps registered_at and the operator's drain.
            Node.insert(node_id=node_id, registered_at=now, last_heartbeat=now, **fields).on_conflict(
                conflict_target=[Node.node_id], update={"last_heartbeat": now, **fields}).execute()
            node = Node.get_by_id(node_id)
        metrics.registered(is_new)  # after the commit
        return respond(node_view(node, now), 201 if is_new else 200)

    @app.get("/nodes")
    def list_nodes():
        kind = request.args.get("type") or None
        status = query_choice("status", ("healthy", "unhealthy"))
        drained = query_choice("drained", ("true", "false"))
        now = clock()
        query = Node.select().order_by(Node.node_id)
        if kind:
            query = query.where(Node.kind == kind)
        if status == "healthy":
            query = query.where(Node.last_heartbeat >= liveness.cutoff(now))
        elif status == "unhealthy":
            query = query.where(Node.last_heartbeat < liveness.cutoff(now))
        if drained is not None:
            query = query.where(Node.drained == (drained == "true"))
        return respond([node_view(n, now) for n in query], of=list[contract.Node])

    def get_node(node_id: str) -> Node:
        node = Node.get_or_none(Node.node_id == node_id)
        if node is None:
            raise NotFound(f"no node {node_id!r}")
        return node

    @app.get("/nodes/<node_id>")
    def read_node(node_id):
        return respond(node_view(get_node(node_id), clock()))

    @app.post("/nodes/<node_id>/heartbeat")
    def heartbeat(node_id):
        beat = contract.Heartbeat.check(read_json_object() if request.get_data(cache=True).strip() else {})
        now = clock()
        with db.atomic():
            # Every heartbeat says the node's whole state: one without `refusing_work` clears it.
            changed = Node.update(last_heartbeat=now, running=beat.running, refusing_work=beat.refusing_work).where(
                Node.node_id == node_id).execute()
        if not changed:
            raise NotFound(f"no node {node_id!r}; register it first (POST /nodes)")
        metrics.heartbeat()
        return respond(node_view(get_node(node_id), now))

    def set_drained(node_id: str, drained: bool):
        with db.atomic():
            if not Node.update(drained=drained).where(Node.node_id == node_id).execute():
                raise NotFound(f"no node {node_id!r}")
        return respond(node_view(get_node(node_id), clock()))

    @app.post("/nodes/<node_id>/drain")
    def drain(node_id):
        """No new work goes to the node; what it runs finishes."""
        return set_drained(node_id, True)

    @app.post("/nodes/<node_id>/undrain")
    def undrain(node_id):
        return set_drained(node_id, False)

    @app.delete("/nodes/<node_id>")
    def deregister_node(node_id):
        node = get_node(node_id)
        with db.atomic():
            node.delete_instance()
        return respond(node_view(node, clock()))

    @app.post("/nodes/<node_id>/credential/revoke")
    def revoke_credential(node_id):
        """Refuse the node's credentials below a generation, here (control-plane/server/revocations.py)."""
        wanted = revocations.revocation_request(node_id, request.get_data(cache=True), read_json_object)
        return respond(revocations.revoke(db, NodeCredential, floors, node_id, wanted, clock()))

    @app.post("/services")
    def register_service():
        registration = contract.ServiceRegistration.check(read_json_object())
        job_id, fields, grant = registration.job_id, registration.columns(), registration.grant
        auth.require_node(fields["node_id"])
        by_node = auth.calling_node() is not None
        if by_node and (fields["attempt"] is None or grant is None or not settings.credentials.grant_valid(
                grant, job_id, fields["attempt"], fields["node_id"])):
            raise Forbidden(f"a node may record services of its own jobs only; {job_id} attempt "
                            f"{fields['attempt']} is not one the scheduler handed to node {fields['node_id']!r} "
                            f"(send the job's attempt and the service_grant that came with it)")
        now = clock()
        if fields["healthy"] is not None:
            fields["checked_at"] = now
        with db.atomic():
            existing = Service.get_or_none(Service.job_id == job_id)
            if existing is not None:
                _check_replace(existing, fields, by_node)
            # An upsert, so that two recordings at once never collide on the key.
            Service.insert(job_id=job_id, registered_at=now, **fields).on_conflict(
                conflict_target=[Service.job_id], update=fields).execute()
            svc = Service.get_by_id(job_id)
        return respond(one_service_view(svc), 200 if existing is not None else 201)

    def _check_replace(existing: Service, fields: dict, by_node: bool) -> None:
        """An older attempt never replaces a newer one's record; a node replaces another
        node's record only for a newer attempt (the job moved there)."""
        old, new = existing.attempt, fields["attempt"]
        if old is not None and new is not None and new < old:
            raise Conflict(f"the service of {existing.job_id} is recorded for attempt {old}; "
                           f"attempt {new} is stale")
        if by_node and existing.node_id != fields["node_id"] and (old is None or new <= old):
            raise Conflict(f"the service of {existing.job_id} belongs to node {existing.node_id!r} "
                           f"(attempt {old}); only a newer attempt replaces it")

    @app.get("/services")
    def list_services():
        now = clock()
        healthy_nodes = {row.node_id for row in healthy_node_ids(now)}
        query = Service.select().order_by(Service.name, Service.job_id)
        healthy = query_choice("healthy", ("true", "false"))
        if healthy == "true":
            query = query.where(checked_healthy(now))
        elif healthy == "false":
            query = query.where(~checked_healthy(now) | Service.healthy.is_null() | Service.checked_at.is_null())
        for name in ("name", "node_id"):
            if request.args.get(name):
                query = query.where(getattr(Service, name) == request.args[name])
        return respond([service_view(s, s.node_id in healthy_nodes, now) for s in query], of=list[contract.Service])

    # ---- Prometheus HTTP service discovery (discovery.py) ----------------------

    def node_meta(node: Node) -> dict[str, str]:
        return discovery.node_labels(node.node_id, node.kind, node.drained, node.labels or {})

    @app.get("/sd/prometheus/services")
    def sd_services():
        """The service jobs whose last check, recent enough, passed, on healthy nodes."""
        now = clock()
        nodes = {n.node_id: n for n in Node.select().where(Node.last_heartbeat >= liveness.cutoff(now))}
        query = Service.select().where(checked_healthy(now) & Service.node_id.in_(list(nodes))).order_by(
            Service.name, Service.job_id)
        groups = [discovery.service_group(s.job_id, s.name, s.address, s.port, s.attempt, node_meta(nodes[s.node_id]))
                  for s in query]
        return respond([contract.TargetGroup.model_validate(g) for g in groups], of=list[contract.TargetGroup])

    @app.get("/sd/prometheus/nodes")
    def sd_nodes():
        """The healthy nodes (drained ones too: they still run, and export), at SD_NODE_PORT."""
        query = Node.select().where(Node.last_heartbeat >= liveness.cutoff(clock())).order_by(Node.node_id)
        groups = [discovery.node_group(n.address, settings.sd_node_port, node_meta(n)) for n in query]
        return respond([contract.TargetGroup.model_validate(g) for g in groups], of=list[contract.TargetGroup])

    @app.delete("/services/<job_id>")
    def remove_service(job_id):
        """With ?attempt=N, only while the record is that attempt's: an agent removing the
        record of an attempt that ended never removes a newer attempt's, on another node."""
        attempt = query_int("attempt", -1, 0, 1_000_000_000)
        svc = Service.get_or_none(Service.job_id == job_id)
        if svc is None:
            raise NotFound(f"no service for job {job_id!r}")
        auth.require_node(svc.node_id)
        with db.atomic():
            query = Service.delete().where(Service.job_id == job_id)
            if attempt >= 0:
                query = query.where(Service.attempt.is_null() | (Service.attempt == attempt))
            if not query.execute():
                current = Service.get_or_none(Service.job_id == job_id)
                if current is None:
                    raise NotFound(f"no service for job {job_id!r}")
                raise Conflict(f"the service of {job_id} is recorded for attempt {current.attempt}, "
                               f"not attempt {attempt}; nothing was removed")
        return respond(one_service_view(svc))

    return app
