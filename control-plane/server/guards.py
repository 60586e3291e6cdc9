"""The checks every request of the registry and the scheduler passes before its route
runs, in this order:

1. **Host** (DNS rebinding). A server without tokens answers whoever reaches
   it, and browsers reach it too: a web page whose name an attacker points at
   127.0.0.1 (or at the server's address) could then talk to it as if it were
   the page's own site. So a server that listens on loopback only refuses (400)
   a `Host` that is not a loopback name or address (`localhost`, `*.localhost`,
   `127.0.0.0/8`, `::1`) or one of the names in `CORRAL_ALLOWED_HOSTS` (the
   names a proxy in front uses); a tokenless server on other addresses
   (`--insecure`) also takes any IP address literal, which no rebinding can
   forge, but no other name. A server with tokens checks no Host: a page cannot
   attach the bearer token. A request without `Host` (HTTP/1.0 tools) comes from
   no browser and passes. The header is parsed strictly first (a host name, an
   IPv4 address or a bracketed IPv6 one, then an optional port 1-65535, nothing
   else): a value such as `127.0.0.1:80@evil.example` holds a loopback address,
   but a URL built from it names another host, so it is refused whatever it holds.
2. **Access** (control-plane/server/auth.py): credentials and roles.
3. **Content type** (cross-site requests). A state-changing request (POST, PUT,
   PATCH, DELETE) must say `Content-Type: application/json`, a body-less cancel,
   retry or drain included (415 otherwise). A cross-site HTML form cannot send
   that header, and a cross-site script cannot send it without the browser
   asking the server first (CORS preflight), which Corral never allows; so no
   other site can change anything through a user's browser, even on a tokenless
   local cluster. The routes that take raw bytes (an agent's log chunks, a PUT)
   take `application/octet-stream` instead: a browser asks first (preflight) for
   that type and for every PUT, so the same holds.

All three answer JSON errors and run before the request's database connection is
taken; the access check reads the nodes' credential floors (control-plane/server/revocations.py)
on a short connection of its own, at most once a second per process.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping

from flask import Flask, request

from corral.server.auth import Access, access_check
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
            floors: Callable[[str], int] | None = None) -> None:
    """Put the checks in front of every other before-request function of `app`.
    `loopback_only`: the server listens on loopback only (control-plane/server/serve.py);
    `raw_routes`: the PUT routes that take application/octet-stream; `floors`: each
    node's lowest credential generation accepted (control-plane/server/revocations.py)."""
    checks: list[Callable] = []
    if loopback_only or not credentials.enabled:
        checks.append(host_check(hosts, loopback_only))
    checks += [access_check(credentials, access, floors), content_type_check(frozenset(raw_routes))]
    app.before_request_funcs.setdefault(None, [])[:0] = checks
