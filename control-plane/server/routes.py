"""Each HTTP route declared once: its method, path, handler, access rule and OpenAPI
operation, in one `Route` record made by a `Routes` group's decorator.

A service's resource modules each hold one `Routes` group; the service's
composition (`create_app`) registers the groups on its app, and the access table
(control-plane/server/auth.py) and the OpenAPI paths (control-plane/server/openapi.py)
are generated from the same records, so a route cannot exist without an access
rule or a documented operation. `check_declared` refuses an app whose URL map has
a route the table does not name (one added with `app.route` behind its back).

Handlers take the service's context object (what the routes read: store, settings,
clock...) as their first argument, then the path's variables. Endpoint names are
the handlers' names, without a blueprint prefix: the access table, the tests and
the raw-bytes routes refer to them.

Tried and not used: flask-openapi3 and SpecTree (pydantic-based; APIFlask and
flask-smorest are marshmallow-based). Both parse and validate bodies themselves and
answer their own 422 format, add their validation-error schema to every operation,
and prefix endpoints with the blueprint's name; the services keep their one-line
`{"error": ...}` refusals, their strict JSON reading (json_body.py) and today's
document, so a small record of our own fits better.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Flask

from corral.server import audit_trail
from corral.server.auth import OPEN_PATHS, OPEN_PREFIXES, Access
from corral.shared.credentials import AGENT_ROLE

# A Flask path variable, `<name>` or `<converter:name>`.
_VARIABLE = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


@dataclass(frozen=True)
class Route:
    """One route: what Flask needs (method, path, endpoint, handler), who may call it
    (`access`), whether it takes raw bytes rather than JSON (`raw`), and its OpenAPI
    operation object (models in it become schema references when the document is built)."""

    method: str
    path: str
    endpoint: str
    handler: Callable[..., Any]
    access: Access
    operation: dict = field(hash=False, compare=False)
    raw: bool = False

    @property
    def openapi_path(self) -> str:
        return _VARIABLE.sub(r"{\1}", self.path)

    @property
    def variables(self) -> list[str]:
        return _VARIABLE.findall(self.path)


class Routes:
    """The routes of one resource. `tag`: the OpenAPI tag its operations take unless
    one says otherwise."""

    def __init__(self, tag: str):
        self.tag = tag
        self.routes: list[Route] = []

    def route(self, method: str, path: str, *, access: Access, operation_id: str, summary: str,
              responses: dict, description: str | None = None, parameters: list | None = None,
              request_body: dict | None = None, tag: str | None = None,
              raw: bool = False) -> Callable[[Callable], Callable]:
        """Declare the decorated handler as the route `method path`; `access` (a required
        argument) is who may call it."""
        operation: dict = {"operationId": operation_id, "tags": [tag or self.tag], "summary": summary}
        if description is not None:
            operation["description"] = description
        if parameters is not None:
            operation["parameters"] = parameters
        if request_body is not None:
            operation["requestBody"] = request_body
        operation["responses"] = responses

        def declare(handler: Callable) -> Callable:
            self.routes.append(Route(method.upper(), path, handler.__name__, handler, access, operation, raw))
            return handler

        return declare

    def get(self, path: str, **declared) -> Callable[[Callable], Callable]:
        return self.route("GET", path, **declared)

    def post(self, path: str, **declared) -> Callable[[Callable], Callable]:
        return self.route("POST", path, **declared)

    def put(self, path: str, **declared) -> Callable[[Callable], Callable]:
        return self.route("PUT", path, **declared)

    def patch(self, path: str, **declared) -> Callable[[Callable], Callable]:
        return self.route("PATCH", path, **declared)

    def delete(self, path: str, **declared) -> Callable[[Callable], Callable]:
        return self.route("DELETE", path, **declared)


def every_route(groups: Iterable[Routes]) -> list[Route]:
    """The groups' routes; an endpoint name declared twice is an error."""
    routes = [route for group in groups for route in group.routes]
    seen: set[str] = set()
    for route in routes:
        if route.endpoint in seen:
            raise ValueError(f"the endpoint {route.endpoint!r} is declared twice")
        seen.add(route.endpoint)
    return routes


def register(app: Flask, groups: Iterable[Routes], context: object) -> None:
    """Add every route of `groups` to `app`, its handler called with `context` first."""
    for route in every_route(groups):
        app.add_url_rule(route.path, endpoint=route.endpoint, view_func=_bound(route.handler, context),
                         methods=[route.method])


def _bound(handler: Callable, context: object) -> Callable:
    @functools.wraps(handler)
    def view(**values):
        return handler(context, **values)
    return view


def access_table(groups: Iterable[Routes]) -> dict[str, Access]:
    """Endpoint name -> Access, for auth.access_check."""
    return {route.endpoint: route.access for route in every_route(groups)}


def audited_actions(groups) -> dict[str, tuple[str, int]]:
    """The endpoints whose requests the audit log records (control-plane/server/audit_trail.py):
    those that may change something and that users may call (agents' reports are in
    the jobs' histories), each with its operationId and its success status."""
    return {route.endpoint: (route.operation["operationId"], audit_trail.success_status(route.operation["responses"]))
            for route in every_route(groups)
            if route.method in ("POST", "PUT", "PATCH", "DELETE") and route.access.roles - {AGENT_ROLE}}


def raw_routes(groups: Iterable[Routes]) -> tuple[str, ...]:
    """The endpoints that take application/octet-stream (guards.content_type_check)."""
    return tuple(route.endpoint for route in every_route(groups) if route.raw)


def openapi_paths(groups: Iterable[Routes], path_parameters: Mapping[str, dict]) -> dict:
    """The OpenAPI paths of `groups`: each operation under its path and method, with
    the path's variables described once per path from `path_parameters` (by name)."""
    paths: dict[str, dict] = {}
    for route in every_route(groups):
        item = paths.setdefault(route.openapi_path, {})
        if route.variables:
            item["parameters"] = [path_parameters[name] for name in route.variables]
        item[route.method.lower()] = route.operation
    return paths


def check_declared(app: Flask, access: Mapping[str, Access]) -> None:
    """Refuse (at start-up) an app with a route that has no access rule declared: every
    rule's endpoint is in `access`, or the rule is one of the open paths."""
    for rule in app.url_map.iter_rules():
        if rule.endpoint in access or rule.rule in OPEN_PATHS or rule.rule.startswith(OPEN_PREFIXES):
            continue
        raise RuntimeError(f"the route {rule.rule} ({rule.endpoint}) has no declared access rule")
