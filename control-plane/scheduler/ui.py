"""The dashboard at /ui: one page of plain HTML, JavaScript and CSS from static/.

There is no build step: the files are served as they are. The page holds no
data; its script reads the JSON API (/stats, /nodes, /schedules, /jobs, ...)
from the same origin, polling every 1.5 s, so every worker serves it alike.
When an API call answers 401 the page asks for a token (a personal token, an
identity provider's JWT or the operator token), keeps it in the tab's
sessionStorage and sends it as `Authorization: Bearer ...`; it never puts a
token into a URL. The job page (/ui#/jobs/job-12), a node's page
(/ui#/nodes/node-2) and a schedule's page (/ui#/schedules/nightly-etl) are hash
routes of the same shell. The charts are SVG the script draws from
GET /stats/history (no chart library).
"""
import os

from flask import Blueprint, Response, send_from_directory

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")

# route → (file in static/, media type, OpenAPI operationId and summary). Fixed names,
# so the routes are listed in the OpenAPI document (openapi.py reads this table), and
# the media type does not depend on the host's mime table. Open to all (auth.OPEN_PATHS).
ASSETS = {
    "/ui": ("index.html", "text/html", "getDashboard", "The dashboard (HTML)."),
    "/ui/dashboard.js": ("dashboard.js", "text/javascript", "getDashboardScript", "The dashboard's script."),
    "/ui/dashboard.css": ("dashboard.css", "text/css", "getDashboardStyle", "The dashboard's style sheet."),
}

# The page loads only its own files and talks only to its own origin; it may not be
# framed (its buttons cancel jobs).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}

blueprint = Blueprint("ui", __name__)


def _serve(filename: str, mimetype: str):
    def view() -> Response:
        response = send_from_directory(STATIC_DIR, filename, mimetype=mimetype)
        response.headers.update(SECURITY_HEADERS)
        return response
    return view


for _rule, (_filename, _mimetype, _, _) in ASSETS.items():
    blueprint.add_url_rule(_rule, endpoint=_filename.replace(".", "_"), view_func=_serve(_filename, _mimetype),
                           methods=["GET"])
