"""Access control for the registry and the scheduler: who may call each route
(docs/security.md, "Deny by default").

Each route declares its `Access` (control-plane/server/routes.py); `access_check`,
installed by guards.py, checks every request against its service's table: no
credential or a wrong one is 401, a valid one of another role 403. A node's
credential names its node: the check compares it with a node in the path or query
here, and a route whose node is in its body or a stored record calls `require_node`.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flask import g, request

from corral.server import principals
from corral.server.http import error_response
from corral.server.principals import Principal
from corral.server.revocations import refusal as revocation_refusal
from corral.shared.credentials import AGENT_ROLE, OPERATOR_ROLE, READER_ROLE, Caller, Credentials
from corral.shared.errors import Forbidden
from corral.shared.settings import Setting

OPEN_PATHS = ("/healthz", "/readyz", "/metrics", "/openapi.json", "/ui")
OPEN_PREFIXES = ("/ui/",)

# Where an agent's request names its node: checked here ("path": the node_id path
# parameter; "query": every node_id query parameter, at least one) or by the route
# ("body", "record": the route calls require_node).
NODE_IN_PATH, NODE_IN_QUERY, NODE_IN_BODY, NODE_IN_RECORD = "path", "query", "body", "record"


@dataclass(frozen=True)
class Access:
    """Who may call a route, and where an agent's request names its node (None: the
    route concerns no node in particular)."""

    roles: frozenset[str]
    node: str | None = None


# A user of a personal token (scheduler/personal_tokens.py) who is no cluster admin or
# reader: what they may do on a route of this role is decided by their teams, in the route.
USER_ROLE = "user"
READS = ("GET", "HEAD")

OPEN = Access(frozenset())
OPERATOR = Access(frozenset({OPERATOR_ROLE}))
# Routes users of teams may call too (the route checks the team).
MEMBER = Access(frozenset({OPERATOR_ROLE, USER_ROLE}))


def readable(access: Access) -> Access:
    """`access`, and the read-only token too: for routes that read and change nothing."""
    return Access(access.roles | {READER_ROLE}, access.node)


# Reads the operator and the read-only token may make.
READ = readable(OPERATOR)
MEMBER_READ = readable(MEMBER)
# Reads every role may make (the node list, services).
EITHER = readable(Access(frozenset({OPERATOR_ROLE, AGENT_ROLE})))


def agent(node: str) -> Access:
    """A route for agents only, about the node named `node` (NODE_IN_*)."""
    return Access(frozenset({AGENT_ROLE}), node)


def either(node: str, users: bool = False) -> Access:
    """Operators see everything; an agent only what concerns its own node; with `users`,
    team users too (the route checks their teams)."""
    return Access(frozenset({OPERATOR_ROLE, AGENT_ROLE} | ({USER_ROLE} if users else set())), node)


ROLE_NAMES = {OPERATOR_ROLE: "the operator token (or a cluster admin)",
              AGENT_ROLE: "a node credential (CORRAL_NODE_TOKEN)",
              READER_ROLE: "the read-only token (or a cluster-wide reader)",
              USER_ROLE: "a team member's token"}


INSECURE = Setting("CORRAL_INSECURE", "insecure", "bool", False,
                     "serve a non-loopback address with neither token set (also `--insecure`)")


def insecure_allowed(env: Mapping[str, str]) -> bool:
    """CORRAL_INSECURE: serve on non-loopback addresses without any token."""
    return INSECURE.read(env)


# ---- the request check ----------------------------------------------------------------

def access_check(credentials: Credentials, access: Mapping[str, Access],
                 floors: Callable[[str], int] | None = None,
                 users: Callable[[str], Principal | None] | None = None) -> Callable[[], object]:
    """The before-request function that checks every request against `access`
    (Flask endpoint name -> Access). It reads no body; `floors(node_id)`, the lowest
    generation of that node's credentials still accepted (control-plane/server/revocations.py), is
    asked of node credentials only (its own short read of the database, cached);
    `users(token)`, who a personal token stands for (None: nobody), of tokens that are
    none of the cluster's own (also cached)."""

    def check():
        g.corral_role = None
        g.corral_node = None
        g.corral_principal = None  # until the credential is checked
        if request.url_rule is None or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES):
            return None  # unknown routes answer 404/405 on their own
        rule = access.get(request.endpoint, OPERATOR)
        if not rule.roles or not credentials.enabled:
            g.corral_principal = principals.BOOTSTRAP_ADMIN_PRINCIPAL  # the tokenless local mode
            return None  # an open route, or the tokenless local mode
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return _unauthorized("this endpoint needs a bearer token (Authorization: Bearer TOKEN)")
        caller = credentials.identify(presented.strip())
        principal = _principal_of(caller) if caller is not None else (
            users(presented.strip()) if users is not None else None)
        if caller is None and principal is None:
            return _unauthorized("the bearer token is not valid")
        role = caller.role if caller is not None else route_role(principal)
        g.corral_refused_principal = principal  # who a refusal below is recorded for (audit_trail.py)
        if role not in rule.roles:
            wanted = " or ".join(ROLE_NAMES[r] for r in sorted(rule.roles))
            raise Forbidden(f"{ROLE_NAMES[role]} may not do this; it takes {wanted}")
        if principal is not None and principal.read_only and request.method not in READS:
            raise Forbidden("a read-only token may not change anything")
        if caller is not None and caller.role == AGENT_ROLE and floors is not None and caller.node_id is not None:
            revoked = revocation_refusal(caller.node_id, caller.generation, floors(caller.node_id))
            if revoked is not None:
                return _unauthorized(revoked)
        g.corral_role, g.corral_principal = role, principal
        g.corral_node = caller.node_id if caller is not None else None
        if role == AGENT_ROLE:
            _check_named_node(rule.node)
        return None

    return check


def _principal_of(caller: Caller) -> Principal | None:
    if caller.role == OPERATOR_ROLE:
        return principals.BOOTSTRAP_ADMIN_PRINCIPAL
    if caller.role == READER_ROLE:
        return principals.BOOTSTRAP_READER_PRINCIPAL
    return None  # a node's agent acts for no user


def route_role(principal: Principal) -> str:
    """The role a user's request is checked as against a route's Access: a cluster admin
    is the operator (a read-only token of one, the reader), a cluster-wide reader the
    reader, anyone else a team user."""
    if principal.is_admin:
        return READER_ROLE if principal.read_only else OPERATOR_ROLE
    if principal.cluster_role == principals.READER:
        return READER_ROLE
    return USER_ROLE


def _unauthorized(message: str):
    response = error_response(401, message)
    response.headers["WWW-Authenticate"] = 'Bearer realm="corral"'
    return response


def _check_named_node(where: str | None) -> None:
    if where == NODE_IN_PATH:
        require_node((request.view_args or {}).get("node_id"))
    elif where == NODE_IN_QUERY:
        named = request.args.getlist("node_id")
        if not named:
            raise Forbidden("a node may only ask about its own work: name it (node_id=...)")
        for node_id in named:
            require_node(node_id)


def require_node(node_id) -> None:
    """An agent may act only for the node its credential names. No-op for operators and
    in the tokenless mode. Routes whose node is in the body or a record call this."""
    if g.get("corral_role") != AGENT_ROLE:
        return
    if node_id != g.corral_node:
        raise Forbidden(f"the credential of node {g.corral_node!r} may not act for node {str(node_id)[:128]!r}")


def calling_node() -> str | None:
    """The node whose credential made this request (None: an operator, or no tokens)."""
    return g.get("corral_node")


def read_only() -> bool:
    """The request came with the read-only token: it sees no secrets (env var values)."""
    return g.get("corral_role") == READER_ROLE


def principal() -> Principal:
    """Who this request acts for (an agent's request: nobody; it never asks)."""
    found = calling_principal()
    if found is None:
        raise Forbidden("a node credential acts for no user")
    return found


def calling_principal() -> Principal | None:
    """Who this request acts for; None for a node's agent."""
    return g.get("corral_principal")


# ---- listening addresses -----------------------------------------------------------------

def bind_refusal(binds: list[str]) -> str | None:
    """The reason to refuse serving on `binds` without any token: the first address
    that is not loopback, or None when all are (unix sockets and fd:// count as local:
    who may connect is up to whoever made them)."""
    for bind in binds:
        if not _is_local(bind):
            return (f"refusing to listen on {bind} without CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN: "
                    f"anyone who reaches it could submit jobs that run on every node; "
                    f"set the tokens (docs/security.md), or pass --insecure (CORRAL_INSECURE=1)")
    return None


def _is_local(bind: str) -> bool:
    if bind.startswith(("unix:", "fd://")):
        return True
    host = bind_host(bind)
    if not host:
        return False  # ":9000" is every interface
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    return resolves_to_loopback(host)


def bind_host(bind: str) -> str:
    """The host part of a gunicorn TCP bind ("127.0.0.1:9000", "[::1]:9000", "tcp://h:p")."""
    address = bind[len("tcp://"):] if bind.startswith("tcp://") else bind
    if address.startswith("["):  # [::1]:9000
        return address[1:].partition("]")[0]
    if address.count(":") > 1:  # a bare IPv6 address
        return address
    return address.rpartition(":")[0] if ":" in address else address


def resolves_to_loopback(host: str) -> bool:
    """A host name is local only when every address it stands for is loopback."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)
