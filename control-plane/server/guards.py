"""The checks every request of the registry and the scheduler passes before its route
runs (and before it takes a database connection), in this order, each answering a
JSON error (docs/security.md, "Browsers cannot be turned against a cluster"):

1. **Host** (DNS rebinding): a server without tokens takes only loopback names,
   CORRAL_ALLOWED_HOSTS, and (`--insecure`) IP literals; 400 otherwise.
2. **Access** (auth.py): credentials and roles.
3. **Content type** (cross-site requests): a state-changing request must say
   `application/json` (a raw-bytes route `application/octet-stream`); 415 otherwise.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping

from flask import Flask, request

from corral.server.auth import Access, access_check
from corral.server.principals import Principal
from corral.shared.credentials import Credentials
from corral.shared.errors import BadRequest
from corral.server.http import UnsupportedMediaType
from corral.shared.settings import Setting

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def allowed_hosts(env: Mapping[str, str]) -> frozenset[str]:
    """CORRAL_ALLOWED_HOSTS: comma-separated host names (no ports), lower-cased."""
    return ALLOWED_HOSTS.read(env)


def _host_names(name: str, value: str) -> frozenset[str]:
    return frozenset(host.strip().lower().rstrip(".") for host in value.split(",") if host.strip())


ALLOWED_HOSTS = Setting("CORRAL_ALLOWED_HOSTS", "allowed_hosts", "text", "",
                        "host names a loopback-only server accepts besides loopback ones (a proxy's names)",
                        parse=_host_names, form="host names, comma-separated", shown="unset")


# RFC 9110 7.2 / RFC 3986 3.2.2, narrowed to what names a server: DNS labels (letters,
# digits, `-`, `_`; an IPv4 address is one such name) with an optional final dot, or
# an IPv6 address in brackets (no zone), then an optional port of digits. ASCII only:
# nothing may come before the host (no `user@`) or after the port (no path, no space).
HOST_RE = re.compile(r"(?:(?P<name>(?:[A-Za-z0-9_-]{1,63}\.)*[A-Za-z0-9_-]{1,63}\.?)|\[(?P<ipv6>[0-9A-Fa-f:.]+)\])"
                     r"(?::(?P<port>[0-9]{1,5}))?", re.ASCII)
MAX_NAME_CHARS = 253


def host_name(header: str) -> str | None:
    """The host of a Host header, without port, brackets or final dot, lower-cased; None
    when the header is not a host with an optional port (1-65535) and nothing else."""
    match = HOST_RE.fullmatch(header)
    if match is None or (match["port"] is not None and not 1 <= int(match["port"]) <= 65535):
        return None
    if match["ipv6"] is not None:
        try:
            return str(ipaddress.IPv6Address(match["ipv6"]))
        except ValueError:
            return None
    name = match["name"].lower().rstrip(".")
    return name if len(name) <= MAX_NAME_CHARS else None


def is_loopback_name(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True  # RFC 6761: such names always resolve to loopback
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def host_check(allowed: Iterable[str], loopback_only: bool) -> Callable[[], None]:
    allowed = frozenset(allowed)
    where = "listens on loopback only" if loopback_only else "has no tokens (--insecure)"
    takes = "a loopback name or address" if loopback_only else "an IP address, a loopback name"

    def check() -> None:
        header = request.headers.get("Host")
        if header is None:
            return
        host = host_name(header)
        if host is not None and (is_loopback_name(host) or host in allowed
                                 or (not loopback_only and is_address(host))):
            return
        raise BadRequest(f"the Host header {header[:100]!r} is not a name of this server, which {where}: it "
                         f"takes {takes} or a name listed in CORRAL_ALLOWED_HOSTS (a proxy in front passes one)")

    return check


def content_type_check(raw_routes: frozenset[str]) -> Callable[[], None]:
    """State-changing requests say application/json, or application/octet-stream on
    the PUT routes named in `raw_routes` (endpoint names)."""

    def check() -> None:
        if request.url_rule is None or request.method not in STATE_CHANGING:
            return  # no such route or method: answered 404/405 on its own
        if request.endpoint in raw_routes and request.method == "PUT":
            if request.mimetype != "application/octet-stream":
                raise UnsupportedMediaType(f"a {request.method} of raw bytes needs Content-Type: "
                                           f"application/octet-stream")
        elif request.mimetype != "application/json":
            raise UnsupportedMediaType(
                f"a {request.method} needs Content-Type: application/json, even without a body (a browser "
                f"cannot send that header across sites, so no other web site can make this request)")

    return check


def install(app: Flask, credentials: Credentials, access: Mapping[str, Access],
            hosts: Iterable[str], loopback_only: bool, raw_routes: Iterable[str] = (),
            floors: Callable[[str], int] | None = None,
            users: Callable[[str], Principal | None] | None = None) -> None:
    """Put the checks in front of every other before-request function of `app`.
    `loopback_only`: the server listens on loopback only (control-plane/server/serve.py);
    `raw_routes`: the PUT routes that take application/octet-stream; `floors`: each
    node's lowest credential generation accepted (control-plane/server/revocations.py);
    `users`: who a personal token stands for (the scheduler's personal_tokens.py)."""
    checks: list[Callable] = []
    if loopback_only or not credentials.enabled:
        checks.append(host_check(hosts, loopback_only))
    checks += [access_check(credentials, access, floors, users), content_type_check(frozenset(raw_routes))]
    app.before_request_funcs.setdefault(None, [])[:0] = checks
