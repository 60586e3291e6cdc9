"""Flask plumbing shared by the registry and the scheduler.

Every error leaves as JSON `{"error": "..."}` with the right status, and the
request-body checks (415 not JSON, 400 malformed, 413 too large) live here so
both services answer bad input the same way.
"""
import logging
from collections.abc import Callable
from typing import TypeVar

import peewee
from flask import Flask, Response, jsonify, request
from gunicorn.http.errors import NoMoreData, ParseException
from playhouse.pool import MaxConnectionsExceeded
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestEntityTooLarge

from corral.server import json_body
from corral.shared.errors import BadRequest, CorralError

N = TypeVar("N", int, float)

log = logging.getLogger(__name__)

# Room for a status report carrying two full output tails (validation.MAX_OUTPUT_CHARS).
DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024

# Reading a body the client framed wrongly: gunicorn's parser raises ParseException
# subclasses for a malformed chunked body (bad chunk size, missing terminator) and
# NoMoreData when it ends early, which werkzeug turns into ClientDisconnected.
BODY_READ_ERRORS = (ParseException, NoMoreData, ClientDisconnected)


# Messages often quote what the client sent (an id, a value): a 100 KB id must not
# come back as a 100 KB error.
MAX_ERROR_CHARS = 1000


def error_response(status: int, message: str, errors: list | None = None, fields: dict | None = None) -> Response:
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "…"
    body = {"error": message, **(fields or {})}
    if errors:
        body["errors"] = errors  # a batch: what was wrong with each bad item
    response = jsonify(body)
    response.status_code = status
    return response


def install_error_handlers(app: Flask) -> None:
    @app.errorhandler(CorralError)
    def _corral_error(exc: CorralError):
        response = error_response(exc.status, exc.message, getattr(exc, "errors", None), exc.fields)
        if exc.status == 503:
            response.headers["Retry-After"] = "1"
        if getattr(exc, "retry_after", None) is not None:  # TooManyRequests
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        message = {
            404: "no such resource",
            405: f"method {request.method} is not allowed here",
            413: "request body too large",
        }.get(exc.code, exc.description or exc.name)
        response = error_response(exc.code or 500, message)
        if exc.code == 405 and exc.valid_methods:
            response.headers["Allow"] = ", ".join(exc.valid_methods)
        return response

    @app.errorhandler(ParseException)
    @app.errorhandler(NoMoreData)
    @app.errorhandler(ClientDisconnected)
    def _unreadable_body(exc: Exception):
        # Where a body is read outside read_json_object (get_json, get_data in a route).
        return error_response(400, body_read_message(exc))

    @app.errorhandler(peewee.OperationalError)
    @app.errorhandler(MaxConnectionsExceeded)
    def _database_busy(exc: Exception):
        # The write lock stayed taken past the busy timeout (an overloaded SQLite)
        # or the database went away: the request did nothing, and may be retried.
        log.warning("database unavailable on %s %s: %s", request.method, request.path, exc)
        response = error_response(503, "the database is busy or unavailable; nothing was changed, retry shortly")
        response.headers["Retry-After"] = "1"
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal error; see the server log")


def read_json_object() -> dict:
    """The request body as a JSON object, or a BadRequest / 415 / 413."""
    if not request.is_json:
        raise UnsupportedMediaType("the body must be JSON (Content-Type: application/json)")
    raw = request_body()
    if not raw.strip():
        raise BadRequest("the request body is empty; a JSON object is required")
    try:
        body = json_body.decode(raw)
    except json_body.JSONBodyError as exc:
        raise BadRequest(str(exc)) from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def request_body() -> bytes:
    """The raw body (read once, then cached): 413 past MAX_CONTENT_LENGTH, sized or
    chunked, and a BadRequest when the client's chunked framing is broken."""
    try:
        raw = request.get_data(cache=True)  # 413 when Content-Length is past the limit
        limit = request.max_content_length
        # A chunked body (no Content-Length) is cut at the limit without an error
        # (werkzeug's LimitedStream): whether more was sent decides between "exactly
        # the limit" and 413. The server's own stream says so without reading past it.
        if (limit is not None and request.content_length is None and len(raw) >= limit
                and request.environ["wsgi.input"].read(1)):
            raise RequestEntityTooLarge()
    except BODY_READ_ERRORS as exc:
        raise BadRequest(body_read_message(exc)) from None
    return raw


def body_read_message(exc: Exception) -> str:
    if isinstance(exc, ParseException):
        return f"the chunked request body is malformed: {exc}"
    return "the request body ended before it was complete"


class UnsupportedMediaType(CorralError):
    status = 415


def query_int(name: str, default: int, minimum: int, maximum: int) -> int:
    value = _query_number(name, int, "a whole number", minimum, maximum)
    return default if value is None else value


def query_float(name: str, minimum: float, maximum: float) -> float | None:
    """A number in the query (unix seconds, for instance); None when it is not given."""
    return _query_number(name, float, "a number", minimum, maximum)


def _query_number(name: str, parse: Callable[[str], N], what: str, minimum: N, maximum: N) -> N | None:
    """The query parameter `name` as `parse` reads it, within [minimum, maximum]; None
    when it is not given (or empty); else a BadRequest that says what it must be."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = parse(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name!r} must be {what}") from None
    if not minimum <= value <= maximum:  # also refuses nan and the infinities
        raise BadRequest(f"query parameter {name!r} must be between {_plain(minimum)} and {_plain(maximum)}")
    return value


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def query_choice(name: str, choices: tuple[str, ...]) -> str | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    if raw not in choices:
        raise BadRequest(f"query parameter {name!r} must be one of {', '.join(choices)}")
    return raw


def serve_openapi(app: Flask, document: dict) -> None:
    @app.get("/openapi.json")
    def openapi():
        return jsonify(document)


def serve_readiness(app: Flask, check) -> None:
    """GET /readyz: 200 when `check()` (a dict of what was checked) passes; 503 with
    the reason when it raises. /healthz only says the process is up."""

    @app.get("/readyz")
    def readyz():
        checks: dict = {}
        try:
            check(checks)
        except Exception as exc:  # any failed check means "do not send traffic here"
            response = jsonify({"status": "not ready", "error": str(exc) or exc.__class__.__name__,
                                "checks": checks})
            response.status_code = 503
            return response
        return jsonify({"status": "ready", "checks": checks})


def base_app(name: str, max_body_bytes: int) -> Flask:
    app = Flask(name, static_folder=None)  # the dashboard serves its own files (scheduler ui.py)
    # A path with an empty segment (`/jobs//events`, or `%2f` as an id) is a JSON 404,
    # not werkzeug's HTML redirect to the path with the slashes merged.
    app.url_map.merge_slashes = False
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.json.sort_keys = False
    install_error_handlers(app)

    @app.get("/healthz")
    def healthz():
        return jsonify({"status": "ok"})

    return app
