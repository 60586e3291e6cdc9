"""Who changed what: the audit entry of every state-changing request a user makes,
written in the same transaction as the change (docs/security.md, "Audit log").

A request that may change something (POST, PUT, PATCH, DELETE) by a user (a
bootstrap token, a personal token, an OIDC token; never a node's agent) gets a
pending `Entry` once the access check has passed. The first transaction the request
commits writes it just before its COMMIT (`AuditedCommits`, mixed into the
databases' classes), so the change and its record commit together or not at all,
and a request that changed nothing by the time it answered (a refusal, an idempotent
repeat) has it written on its own at the end. The entry's status is the route's
success status, as declared; an answer that ends otherwise corrects it afterwards.

Routes add what only they know with `note(team=..., target=...)`: the team a job
belongs to, the id of what a submit made. Nothing here holds a secret: no body, no
header, no token value is recorded, only the token's id.
"""
from __future__ import annotations

import contextvars
import dataclasses
import logging
from collections.abc import Callable, Mapping

import peewee
from flask import Flask, Response, g, request

READS = frozenset({"GET", "HEAD", "OPTIONS"})
LOGIN_ACTION = "oidcLogin"  # a subject of the identity provider seen for the first time
MAX_TARGET_CHARS = 256

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Entry:
    """One state-changing request: who (`user`, their `token_id`), what (`action`: the
    route's OpenAPI operationId; `target`: what it acted on), in which team, when,
    from where, and the answer's `status`. `id`: its row once written."""

    at: float
    user: str
    action: str
    method: str
    path: str
    address: str | None
    status: int
    team: str | None = None
    target: str | None = None
    token_id: str | None = None
    id: int | None = None

    def row(self) -> dict:
        """The entry's columns (not dataclasses.asdict: its deep copy cost a submit 2%)."""
        return {name: getattr(self, name) for name in ROW_FIELDS}


ROW_FIELDS = tuple(f.name for f in dataclasses.fields(Entry) if f.name != "id")


@dataclasses.dataclass
class _Pending:
    entry: Entry
    write: Callable[[dict], int]


_pending: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar("corral_audit_pending", default=None)


def note(team: str | None = None, target: str | None = None) -> None:
    """What the current request acts on, for its audit entry (no-op outside one, or
    once its entry is written: the first commit already said what it changed)."""
    pending = _pending.get()
    if pending is None or pending.entry.id is not None:
        return
    if team is not None:
        pending.entry.team = team
    if target is not None:
        pending.entry.target = str(target)[:MAX_TARGET_CHARS]


def pending() -> bool:
    """Whether the current request has an entry still to write: a write that would
    commit alone (one statement, no transaction) runs in one, so that the entry is
    written with it."""
    waiting = _pending.get()
    return waiting is not None and waiting.entry.id is None


def write_before_commit() -> None:
    """Write the current request's entry, if still pending, into the transaction about
    to commit (AuditedCommits calls it)."""
    pending = _pending.get()
    if pending is not None and pending.entry.id is None:
        pending.entry.id = pending.write(pending.entry.row())


def commit_failed() -> None:
    """The COMMIT that carried the entry failed: it is pending again."""
    pending = _pending.get()
    if pending is not None:
        pending.entry.id = None


class AuditedCommits:
    """Mixed into a peewee database class: every commit first writes the pending audit
    entry of the request that commits (write_before_commit)."""

    def commit(self):
        write_before_commit()
        try:
            return super().commit()
        except BaseException:
            commit_failed()
            raise


def login_entry(user: str, subject: str, now: float) -> Entry:
    """The entry of a first login by an identity provider's subject, in this request."""
    return Entry(at=now, user=user, action=LOGIN_ACTION, method=request.method, path=request.path[:MAX_TARGET_CHARS],
                 address=request.remote_addr, status=200, target=subject[:MAX_TARGET_CHARS])


def success_status(responses: Mapping) -> int:
    """The status a route answers when it committed a change: 201 where it declares it (a
    route that may also answer 200 does so for a repeat that changed nothing, whose entry
    is written as it answers), else its lowest 2xx (200 when it declares none)."""
    codes = sorted(int(code) for code in responses if str(code).isdigit() and str(code).startswith("2"))
    return 201 if 201 in codes else (codes[0] if codes else 200)


def install(app: Flask, db: peewee.Database, actions: Mapping[str, tuple[str, int]],
            write: Callable[[dict], int], update: Callable[[int, int], None], clock: Callable[[], float]) -> None:
    """Record the state-changing requests of users to `app`'s routes. `actions`: each
    endpoint's (OpenAPI operationId, success status); `write(row)` inserts an entry
    into `db` and answers its id, `update(id, status)` corrects a written entry's status."""

    def begin() -> None:
        _pending.set(None)
        user, endpoint = _acting_user(), request.endpoint or ""
        if request.method in READS or user is None or endpoint not in actions:
            return
        action, status = actions[endpoint]
        _pending.set(_Pending(_entry(user, action, status, clock()), write))

    def finish(response: Response) -> Response:
        pending = _pending.get()
        if pending is None:
            pending = _refused(response)
        try:
            if pending is None:
                return response
            entry = pending.entry
            if entry.id is None:
                entry.status = response.status_code
                write_alone(entry)
            elif entry.status != response.status_code:
                update(entry.id, response.status_code)
        except Exception:  # the answer stands; the log says the record is missing
            log.exception("could not record the audit entry of %s %s", request.method, request.path)
        return response

    def write_alone(entry: Entry) -> None:
        _pending.set(None)  # written here, not by the commit below
        with db.atomic():
            entry.id = write(entry.row())

    def _refused(response: Response) -> _Pending | None:
        """A refused state-changing request of a known user: recorded too (a request with
        no valid credential has no user to record; 401s go to the server's log only)."""
        principal, endpoint = g.get("corral_principal") or g.get("corral_refused_principal"), request.endpoint or ""
        if (request.method in READS or principal is None or g.get("corral_node") is not None
                or endpoint not in actions or response.status_code < 400):
            return None
        return _Pending(_entry(principal.user, actions[endpoint][0], response.status_code, clock()), write)

    def forget(exc: BaseException | None = None) -> None:
        _pending.set(None)

    app.before_request(begin)
    app.after_request(finish)
    app.teardown_request(forget)


def _acting_user() -> str | None:
    """The user the request acts for (None: an agent, or the access check refused it)."""
    principal = g.get("corral_principal")
    if principal is None or g.get("corral_node") is not None:
        return None
    return principal.user


def _entry(user: str, action: str, status: int, now: float) -> Entry:
    principal = g.get("corral_principal") or g.get("corral_refused_principal")
    args = request.view_args or {}
    target = "/".join(str(value) for value in args.values())[:MAX_TARGET_CHARS] or None
    return Entry(at=now, user=user, action=action, method=request.method, path=request.path[:MAX_TARGET_CHARS],
                 address=request.remote_addr, status=status, team=args.get("team"), target=target,
                 token_id=getattr(principal, "token_id", None))
