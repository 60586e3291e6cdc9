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
   no browser and passes.
2. **Access** (shared/auth.py): credentials and roles.
3. **Content type** (cross-site requests). A state-changing request (POST, PUT,
   PATCH, DELETE) must say `Content-Type: application/json`, a body-less cancel,
   retry or drain included (415 otherwise). A cross-site HTML form cannot send
   that header, and a cross-site script cannot send it without the browser
   asking the server first (CORS preflight), which Corral never allows; so no
   other site can change anything through a user's browser, even on a tokenless
   local cluster. The routes that take raw bytes (an agent's log chunks, a PUT)
   take `application/octet-stream` instead: a browser asks first (preflight) for
   that type and for every PUT, so the same holds.

All three answer JSON errors and run before the database connection is opened.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping

from flask import Flask, request

from .auth import Access, access_check
from .credentials import Credentials
from .errors import BadRequest
from .http import UnsupportedMediaType
from .settings import Setting

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def allowed_hosts(env: Mapping[str, str]) -> frozenset[str]:
    """CORRAL_ALLOWED_HOSTS: comma-separated host names (no ports), lower-cased."""
    return ALLOWED_HOSTS.read(env)


def _host_names(name: str, value: str) -> frozenset[str]:
    return frozenset(host.strip().lower().rstrip(".") for host in value.split(",") if host.strip())


ALLOWED_HOSTS = Setting("CORRAL_ALLOWED_HOSTS", "allowed_hosts", "text", "",
                        "host names a loopback-only server accepts besides loopback ones (a proxy's names)",
                        parse=_host_names, form="host names, comma-separated", shown="unset")


def host_name(header: str) -> str:
    """The host of a Host header, without port or brackets, lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") > 1:  # a bare IPv6 address (not a valid Host, but harmless to read)
        return header
    return header.partition(":")[0].rstrip(".")


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
        if is_loopback_name(host) or host in allowed or (not loopback_only and is_address(host)):
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
            hosts: Iterable[str], loopback_only: bool, raw_routes: Iterable[str] = ()) -> None:
    """Put the checks in front of every other before-request function of `app`.
    `loopback_only`: the server listens on loopback only (shared/server.py);
    `raw_routes`: the PUT routes that take application/octet-stream."""
    checks: list[Callable] = []
    if loopback_only or not credentials.enabled:
        checks.append(host_check(hosts, loopback_only))
    checks += [access_check(credentials, access), content_type_check(frozenset(raw_routes))]
    app.before_request_funcs.setdefault(None, [])[:0] = checks
