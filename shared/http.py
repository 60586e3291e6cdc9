"""Flask plumbing shared by the registry and the scheduler.

Every error leaves as JSON `{"error": "..."}` with the right status, and the
request-body checks (415 not JSON, 400 malformed, 413 too large) live here so
both services answer bad input the same way.
"""
import json
import logging

import peewee
from flask import Flask, Response, jsonify, request
from playhouse.pool import MaxConnectionsExceeded
from werkzeug.exceptions import HTTPException

from .errors import BadRequest, CorralError

log = logging.getLogger(__name__)

# Room for a status report carrying two full output tails (validation.MAX_OUTPUT_CHARS).
DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024


def error_response(status: int, message: str, errors: list | None = None) -> Response:
    body = {"error": message}
    if errors:
        body["errors"] = errors  # a batch: what was wrong with each bad item
    response = jsonify(body)
    response.status_code = status
    return response


def install_error_handlers(app: Flask) -> None:
    @app.errorhandler(CorralError)
    def _corral_error(exc: CorralError):
        return error_response(exc.status, exc.message, getattr(exc, "errors", None))

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
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    if not raw.strip():
        raise BadRequest("the request body is empty; a JSON object is required")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


class UnsupportedMediaType(CorralError):
    status = 415


def query_int(name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name!r} must be a whole number") from None
    if not minimum <= value <= maximum:
        raise BadRequest(f"query parameter {name!r} must be between {minimum} and {maximum}")
    return value


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
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.json.sort_keys = False
    install_error_handlers(app)

    @app.get("/healthz")
    def healthz():
        return jsonify({"status": "ok"})

    return app
