"""Personal tokens and who a credential stands for (docs/security.md, "Personal tokens").

Users make tokens for themselves, cluster admins for anyone; each sees and revokes
their own (cluster admins every one). A token's secret is answered once, when made."""
from flask import request

from corral.server import auth, principals
from corral.server.http import read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.openapi import query as _query
from corral.server.routes import Routes
from corral.shared.contract import built, respond
from corral.shared.errors import BadRequest, Conflict, Forbidden, NotFound
from corral.shared.timeutil import iso

from .. import contract
from ..models import ApiToken
from .context import SchedulerApi

routes = Routes("users")


def token_answer(row: ApiToken, secret: str | None = None):
    fields = {"token_id": row.token_id, "user": row.user, "name": row.name, "scope": row.scope,
              "created_at": iso(row.created_at), "created_by": row.created_by, "expires_at": iso(row.expires_at),
              "revoked_at": iso(row.revoked_at), "last_used_at": iso(row.last_used_at)}
    if secret is None:
        return built(contract.TokenAnswer, fields)
    return built(contract.NewToken, dict(fields, token=secret))


@routes.get("/whoami", access=auth.MEMBER_READ,
            operation_id="whoAmI", summary="Who the request's credential stands for.",
            responses={"200": _json(contract.WhoAmI, "The user, their cluster role and teams.")})
def whoami(api: SchedulerApi):
    who = auth.principal()
    return respond(contract.WhoAmI(
        user=who.user, cluster_role=who.cluster_role, default_team=who.default_team, token_id=who.token_id,
        read_only=who.read_only, teams=[contract.TeamRole(team=t, role=r) for t, r in sorted(who.teams.items())]))


@routes.post("/tokens", access=auth.MEMBER,
             operation_id="createToken", summary="Make a personal token.",
             description="For the caller, or (cluster admins) for the user named. The answer holds the secret "
                         "`token`, shown this once. Needs the cluster's tokens (CORRAL_API_TOKEN): without them "
                         "every request is the admin's and a token would mean nothing (409).",
             request_body=_body(contract.TokenRequest),
             responses={"201": _json(contract.NewToken, "The token, with its secret."),
                        "404": _error("NotFound"), "409": _error("Conflict")})
def create_token(api: SchedulerApi):
    asked = contract.TokenRequest.check(read_json_object())
    who = auth.principal()
    if not api.settings.credentials.enabled:
        raise Conflict("personal tokens need the cluster's tokens (CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN): "
                       "without them every request acts as the admin")
    user = asked.user or who.user
    if user != who.user and not who.is_admin:
        raise Forbidden("only cluster admins make tokens for other users")
    if user in principals.RESERVED_USERS:
        raise BadRequest(f"{user!r} is a bootstrap token's user and holds no personal tokens: name a user "
                         f"('user')")
    now = api.clock()
    expires_at = None if asked.expires_in_secs is None else now + asked.expires_in_secs
    row, secret = api.store.accounts.create_token(user, asked.name, asked.scope or principals.FULL, expires_at,
                                                  who.user, now)
    return respond(token_answer(row, secret), 201)


@routes.get("/tokens", access=auth.MEMBER_READ,
            operation_id="listTokens", summary="Personal tokens, without their secrets.",
            description="The caller's own; a cluster admin's: everyone's (or the `user`'s).",
            parameters=[_query("user", "Only this user's tokens.",
                               {"type": "string", "pattern": principals.USER_PATTERN})],
            responses={"200": _json(list[contract.TokenAnswer], "The tokens, oldest first."),
                       "400": _error("BadRequest")})
def list_tokens(api: SchedulerApi):
    who = auth.principal()
    asked = request.args.get("user") or None
    if asked is not None:
        principals.check_user_name(asked)
    if who.is_admin:
        user = asked  # None: everyone's
    elif asked not in (None, who.user):
        return respond([], of=list[contract.TokenAnswer])  # another user's: nothing to see
    else:
        user = who.user
    return respond([token_answer(t) for t in api.store.accounts.tokens(user)], of=list[contract.TokenAnswer])


@routes.delete("/tokens/<token_id>", access=auth.MEMBER,
               operation_id="revokeToken", summary="Revoke a personal token.",
               description="Its holder's own, or any (cluster admins). Refused on every replica within a few "
                           "seconds, at once by the one that answered. Revoking one twice changes nothing.",
               responses={"200": _json(contract.TokenAnswer, "The token, revoked."), "404": _error("NotFound")})
def revoke_token(api: SchedulerApi, token_id):
    who = auth.principal()
    try:
        row = api.store.accounts.token(token_id)
    except NotFound:
        row = None
    if row is None or not (who.is_admin or row.user == who.user):
        raise NotFound(f"no token {token_id[:64]!r}")
    row = api.store.accounts.revoke_token(token_id, api.clock())
    api.tokens.forget()
    return respond(token_answer(row))
