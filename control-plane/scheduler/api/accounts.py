"""Users, teams and memberships (docs/security.md, "Users and teams").

Cluster admins make and remove users and teams; a team's admins add and remove its
members too. Everyone who may call the scheduler may list teams and users (names
and roles, nothing secret)."""
from flask import current_app

from corral.server import auth, principals
from corral.server.http import read_json_object
from corral.server.openapi import body as _body
from corral.server.openapi import error as _error
from corral.server.openapi import json_response as _json
from corral.server.routes import Routes
from corral.shared.contract import built, respond
from corral.shared.timeutil import iso

from .. import contract, fairshare
from .context import SchedulerApi, require_team_admin

routes = Routes("users")


def team_answer(team, members) -> contract.TeamAnswer:
    return built(contract.TeamAnswer, {"name": team.name, "created_at": iso(team.created_at),
                                       "max_timeout_secs": team.max_timeout_secs,
                                       "share": fairshare.DEFAULT_SHARE if team.share is None else team.share,
                                       "members": [contract.Member(user=m.user, role=m.role) for m in members]})


def user_answer(user, memberships) -> contract.UserAnswer:
    return built(contract.UserAnswer, {
        "name": user.name, "cluster_role": user.cluster_role, "default_team": user.default_team,
        "created_at": iso(user.created_at),
        "teams": [contract.TeamRole(team=m.team, role=m.role) for m in memberships]})


@routes.get("/teams", access=auth.MEMBER_READ, operation_id="listTeams", summary="Every team and its members.",
            responses={"200": _json(list[contract.TeamAnswer], "The teams, by name.")})
def list_teams(api: SchedulerApi):
    return respond([team_answer(*t) for t in api.store.accounts.teams()], of=list[contract.TeamAnswer])


@routes.post("/teams", access=auth.OPERATOR, operation_id="createTeam", summary="Make a team (cluster admins).",
             request_body=_body(contract.TeamRequest),
             responses={"201": _json(contract.TeamAnswer, "The team."), "409": _error("Conflict")})
def create_team(api: SchedulerApi):
    name = contract.TeamRequest.check(read_json_object()).name
    api.store.accounts.create_team(name, api.clock())
    return respond(team_answer(*api.store.accounts.team(name)), 201)


@routes.patch("/teams/<team>", access=auth.OPERATOR, operation_id="updateTeam",
              summary="Change a team's limits and fair-share weight (cluster admins).",
              request_body=_body(contract.TeamChange),
              responses={"200": _json(contract.TeamAnswer, "The team."), "400": _error("BadRequest"),
                         "404": _error("NotFound")})
def update_team(api: SchedulerApi, team):
    name = principals.check_team_name(team)
    changes = contract.TeamChange.check(read_json_object()).model_dump(exclude_unset=True)
    answer = team_answer(*api.store.accounts.update_team(name, changes))
    api.store.context.teams.forget()  # this process's next submit and placement read the change
    return respond(answer)


@routes.delete("/teams/<team>", access=auth.OPERATOR, operation_id="deleteTeam",
               summary="Remove a team without members or jobs (cluster admins).",
               responses={"204": {"description": "Removed."}, "400": _error("BadRequest"),
                          "404": _error("NotFound"), "409": _error("Conflict")})
def delete_team(api: SchedulerApi, team):
    api.store.accounts.delete_team(principals.check_team_name(team))
    return current_app.response_class(status=204)


@routes.put("/teams/<team>/members/<user>", access=auth.MEMBER, operation_id="setMember",
            summary="Add a user to a team, or change their role in it (cluster admins, the team's admins).",
            request_body=_body(contract.MemberRequest),
            responses={"200": _json(contract.TeamAnswer, "The team."), "404": _error("NotFound")})
def set_member(api: SchedulerApi, team, user):
    role = contract.MemberRequest.check(read_json_object()).role or principals.MEMBER
    require_team_admin(principals.check_team_name(team), "change its members")
    api.store.accounts.set_member(team, principals.check_user_name(user), role)
    api.tokens.forget()
    return respond(team_answer(*api.store.accounts.team(team)))


@routes.delete("/teams/<team>/members/<user>", access=auth.MEMBER, operation_id="removeMember",
               summary="Take a user out of a team (cluster admins, the team's admins).",
               responses={"204": {"description": "Removed."}, "400": _error("BadRequest"),
                          "404": _error("NotFound")})
def remove_member(api: SchedulerApi, team, user):
    require_team_admin(principals.check_team_name(team), "change its members")
    api.store.accounts.remove_member(team, principals.check_user_name(user))
    api.tokens.forget()
    return current_app.response_class(status=204)


@routes.get("/users", access=auth.MEMBER_READ, operation_id="listUsers", summary="Every user and their teams.",
            responses={"200": _json(list[contract.UserAnswer], "The users, by name.")})
def list_users(api: SchedulerApi):
    return respond([user_answer(*u) for u in api.store.accounts.users()], of=list[contract.UserAnswer])


@routes.post("/users", access=auth.OPERATOR, operation_id="createUser", summary="Make a user (cluster admins).",
             description="With their cluster role, teams and default team; then make them a token "
                         "(POST /tokens with `user`).",
             request_body=_body(contract.UserRequest),
             responses={"201": _json(contract.UserAnswer, "The user."), "409": _error("Conflict")})
def create_user(api: SchedulerApi):
    asked = contract.UserRequest.check(read_json_object())
    made = api.store.accounts.create_user(asked.name, asked.cluster_role, asked.default_team, asked.teams or {},
                                          api.clock())
    return respond(user_answer(*made), 201)


@routes.delete("/users/<user>", access=auth.OPERATOR, operation_id="deleteUser",
               summary="Remove a user and revoke their tokens (cluster admins); their jobs stay theirs.",
               responses={"204": {"description": "Removed."}, "400": _error("BadRequest"),
                          "404": _error("NotFound")})
def delete_user(api: SchedulerApi, user):
    api.store.accounts.delete_user(principals.check_user_name(user), api.clock())
    api.tokens.forget()
    return current_app.response_class(status=204)


