"""Access control for the registry and the scheduler: bearer tokens and two roles.

`CORRAL_API_TOKEN` is the operators' token (submit, read, cancel, drain...),
`CORRAL_AGENT_TOKEN` the agents' (claims, leases, reports, registration,
heartbeats). Each route is given an `Access` in one table per service
(`ACCESS` in the service's app.py); `install` checks every request against it
before the route runs:

- no `Authorization: Bearer …` or a token that is neither role's: 401 with
  `WWW-Authenticate: Bearer`;
- the other role's token: 403;
- a role whose token is unset is not checked at all, so a cluster without
  tokens works as before (the servers then refuse non-loopback binds, see
  `bind_refusal`).

Tokens are compared with `hmac.compare_digest` and never written to a log or
an error message. `/healthz`, `/readyz`, `/metrics`, `/openapi.json` and the
dashboard shell `/ui` (whose data calls go through the API) are always open.

Agents share one token, which cannot tell which node is speaking, so an agent
also names its node in the `X-Corral-Node` header and the server refuses (403)
an agent request that names another node in its path, query or body. This
keeps a misconfigured or buggy agent away from other nodes' work; an agent
token holder that lies about its node is not stopped (it is trusted, as the
README says).
"""
from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from flask import Flask, g, request

from .errors import Forbidden, SettingError
from .http import error_response
from .settings import env_bool, env_str

OPERATOR_ROLE = "operator"
AGENT_ROLE = "agent"
NODE_HEADER = "X-Corral-Node"
OPEN_PATHS = ("/healthz", "/readyz", "/metrics", "/openapi.json", "/ui")
OPEN_PREFIXES = ("/ui/",)
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class Access:
    """Who may call a route. `own_node`: an agent must name its own node (the
    X-Corral-Node header) wherever the request names a node, and name one."""

    roles: frozenset[str]
    own_node: bool = False


OPEN = Access(frozenset())
OPERATOR = Access(frozenset({OPERATOR_ROLE}))
AGENT = Access(frozenset({AGENT_ROLE}), own_node=True)
# Reads both roles may make (nodes, services).
EITHER = Access(frozenset({OPERATOR_ROLE, AGENT_ROLE}))
# Operators see everything; an agent only what concerns its own node (GET /jobs?node_id=X).
EITHER_OWN_NODE = Access(frozenset({OPERATOR_ROLE, AGENT_ROLE}), own_node=True)


@dataclass(frozen=True)
class Tokens:
    """The servers' bearer tokens; None: that role is not checked."""

    operator: str | None = field(default=None, repr=False)
    agent: str | None = field(default=None, repr=False)

    @property
    def any(self) -> bool:
        return self.operator is not None or self.agent is not None

    def token_of(self, role: str) -> str | None:
        return self.operator if role == OPERATOR_ROLE else self.agent

    def role_of(self, presented: str) -> str | None:
        """The role whose token `presented` is, compared in constant time (both
        comparisons always run, so timing does not tell which role nearly matched)."""
        found = None
        given = presented.encode("utf-8", "surrogateescape")
        for role in (OPERATOR_ROLE, AGENT_ROLE):
            token = self.token_of(role)
            if token is not None and hmac.compare_digest(given, token.encode()):
                found = role
        return found


def server_tokens(env: Mapping[str, str]) -> Tokens:
    """CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN, checked. Errors never show a token."""
    operator = _token(env, "CORRAL_API_TOKEN")
    agent = _token(env, "CORRAL_AGENT_TOKEN")
    if operator is not None and operator == agent:
        raise SettingError("CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN must differ: with one value, "
                           "an agent could act as an operator")
    return Tokens(operator, agent)


def _token(env: Mapping[str, str], name: str) -> str | None:
    value = env_str(env, name, None)
    if value is None:
        return None
    if len(value) < MIN_TOKEN_CHARS:
        raise SettingError(f"{name} must be at least {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 32`)")
    if not all("!" <= c <= "~" for c in value):
        raise SettingError(f"{name} may hold only printable ASCII characters without spaces")
    return value


def insecure_allowed(env: Mapping[str, str]) -> bool:
    """CORRAL_INSECURE: serve on non-loopback addresses without any token."""
    return env_bool(env, "CORRAL_INSECURE", False)


# ---- the request check ----------------------------------------------------------------

def install(app: Flask, tokens: Tokens, access: Mapping[str, Access]) -> None:
    """Check every request against `access` (Flask endpoint name -> Access) before
    anything else runs. An endpoint missing from the table is operator-only."""
    app.extensions["corral.auth"] = tokens

    def check():
        g.corral_role = None
        g.corral_node = None
        if request.url_rule is None or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES):
            return None  # unknown routes answer 404/405 on their own
        rule = access.get(request.endpoint, OPERATOR)
        if not rule.roles or any(tokens.token_of(role) is None for role in rule.roles):
            return None  # open, or a role without a token: not checked
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return _unauthorized("this endpoint needs a bearer token (Authorization: Bearer TOKEN)")
        role = tokens.role_of(presented.strip())
        if role is None:
            return _unauthorized("the bearer token is not valid")
        if role not in rule.roles:
            wanted = " or ".join(sorted(rule.roles))
            raise Forbidden(f"an {role} token may not do this; it takes the {wanted} token")
        g.corral_role = role
        if role == AGENT_ROLE and rule.own_node:
            _check_named_nodes()
        return None

    # First of the before_request functions: a refused request opens no database connection.
    app.before_request_funcs.setdefault(None, []).insert(0, check)


def _unauthorized(message: str):
    response = error_response(401, message)
    response.headers["WWW-Authenticate"] = 'Bearer realm="corral"'
    return response


def _check_named_nodes() -> None:
    node = request.headers.get(NODE_HEADER, "").strip()
    if not node:
        raise Forbidden(f"an agent must name its node in the {NODE_HEADER} header")
    named = _named_nodes()
    if not named:
        raise Forbidden("an agent may only ask about its own node; name it (node_id)")
    for other in named:
        check_own_node(other, node)
    g.corral_node = node


def _named_nodes() -> list:
    """Every node id the request names: path, query string, body (and batch items)."""
    named = []
    if request.view_args and "node_id" in request.view_args:
        named.append(request.view_args["node_id"])
    named.extend(request.args.getlist("node_id"))
    body = request.get_json(silent=True) if request.is_json else None
    if isinstance(body, dict):
        if "node_id" in body:
            named.append(body["node_id"])
        for batch in ("reports", "outputs"):  # POST /jobs/reports, POST /jobs/output
            items = body.get(batch)
            if isinstance(items, list):
                named.extend(item["node_id"] for item in items if isinstance(item, dict) and "node_id" in item)
        claim = body.get("claim")  # the claim that may ride on POST /jobs/reports
        if isinstance(claim, dict) and "node_id" in claim:
            named.append(claim["node_id"])
    return named


def check_own_node(node_id, node: str | None = None) -> None:
    """An agent may act only for its own node. Routes whose node is known only after a
    lookup (a service record) call this themselves. No-op for operators and open servers."""
    if g.get("corral_role") != AGENT_ROLE:
        return
    node = node if node is not None else request.headers.get(NODE_HEADER, "").strip()
    if node_id != node:
        raise Forbidden(f"an agent may act only for the node in its {NODE_HEADER} header, "
                        f"not for node {str(node_id)[:128]!r}")


# ---- listening addresses -----------------------------------------------------------------

def bind_refusal(binds: list[str]) -> str | None:
    """The reason to refuse serving on `binds` without any token: the first address
    that is not loopback, or None when all are (unix sockets and fd:// count as local:
    who may connect is up to whoever made them)."""
    for bind in binds:
        if not _is_local(bind):
            return (f"refusing to listen on {bind} without CORRAL_API_TOKEN or CORRAL_AGENT_TOKEN: "
                    f"anyone who reaches it could submit jobs that run as the agents' job user; "
                    f"set the tokens (README: Security), or pass --insecure (CORRAL_INSECURE=1)")
    return None


def _is_local(bind: str) -> bool:
    if bind.startswith(("unix:", "fd://")):
        return True
    address = bind[len("tcp://"):] if bind.startswith("tcp://") else bind
    if address.startswith("["):  # [::1]:9000
        host = address[1:].partition("]")[0]
    elif address.count(":") > 1:  # a bare IPv6 address
        host = address
    else:
        host = address.rpartition(":")[0] if ":" in address else address
    if not host:
        return False  # ":9000" is every interface
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:  # a host name: local only when every address it stands for is loopback
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)
