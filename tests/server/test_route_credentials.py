"""Every route of the scheduler against every kind of caller a cluster shared by teams
has: no credential, a wrong one, an expired and a revoked personal token, the
read-only token, a member of the team whose work the request names, a member of
another team, that team's admin, a cluster admin, the node whose work it is, and
another node; with and without the read-only token configured.

What each caller may do is derived from the routes' own declarations (their
Access, control-plane/server/routes.py): a route added tomorrow is tried here with
no change, and one that users may call needs a line in USER_RULES saying what a
team's members, its admin and another team's members get, or the first test fails."""
import pytest
from test_auth import (AGENT_SECRET, NODE, OPERATOR_TOKEN, READER_TOKEN, SCHEDULER_ROUTES, WRONG_TOKEN, bearer,
                       call)

from corral.scheduler import routes
from corral.scheduler.app import create_app as create_scheduler
from corral.scheduler.settings import SchedulerSettings
from corral.server.auth import USER_ROLE
from corral.shared import credentials as cred
from corral.shared.credentials import AGENT_ROLE, OPERATOR_ROLE, READER_ROLE

NOW = 1_800_000_000.0

# What users get on the routes they may call, the request's example being about the
# team `ml`'s work (bob submitted it; alice is ml's admin; carol is in `web`):
# all: every user gets through (lists show them their teams' part only);
# team: ml's members and admin get through, carol 404 (as if it did not exist);
# admin: alice gets through, bob is 403, carol is refused (403, 404 or 409, naming nothing of ml).
USER_RULES = {
    "list_jobs": "all", "submit": "all", "submit_batch": "all", "list_schedules": "all",
    "list_concurrency": "all", "whoami": "all", "list_tokens": "all", "create_token": "all",
    "revoke_token": "all", "list_teams": "all", "list_users": "all",
    "read_job": "team", "job_events": "team", "why_it_waits": "team", "read_logs": "team",
    "events_stream": "team", "read_array": "team", "cancel_array": "team", "cancel": "team", "retry": "team",
    "read_schedule": "team", "schedule_runs": "team",
    "create_schedule": "admin", "change_schedule": "admin", "delete_schedule": "admin",
    "set_concurrency": "admin", "remove_concurrency": "admin", "set_member": "admin", "remove_member": "admin",
    "list_audit": "admin", "get_usage": "all", "get_fair_share": "all", "get_quota": "team",
}
# The examples where the route table's own is about no team's work in particular.
EXAMPLES = {
    "events_stream": ("GET", "/events?job_id=job-1", None),
    "set_member": ("PUT", "/teams/ml/members/erin", {"role": "member"}),
    "remove_member": ("DELETE", "/teams/ml/members/erin", None),
    "get_quota": ("GET", "/teams/ml/quota", None),
}
CALLERS = ("none", "wrong", "expired", "revoked", "reader", "member", "other team", "team admin",
           "cluster admin", "operator", "node", "other node")


def scheduler(tmp_path, with_reader: bool):
    credentials = cred.Credentials(OPERATOR_TOKEN, AGENT_SECRET, reader=READER_TOKEN if with_reader else None)
    app = create_scheduler(SchedulerSettings(database_url=f"sqlite:///{tmp_path}/scheduler.db",
                                             credentials=credentials, events_stream_max_secs=0.0,
                                             registry_url="http://127.0.0.1:1"), clock=lambda: NOW)
    store = app.extensions["corral.store"]
    accounts = store.accounts
    for team in ("ml", "web"):
        accounts.create_team(team, NOW)
    accounts.create_user("alice", None, "ml", {"ml": "admin"}, NOW)
    accounts.create_user("bob", None, None, {"ml": "member"}, NOW)
    accounts.create_user("carol", None, None, {"web": "member"}, NOW)
    accounts.create_user("erin", None, None, {}, NOW)
    accounts.create_user("root", "admin", None, {}, NOW)
    tokens = {"operator": OPERATOR_TOKEN, "wrong": WRONG_TOKEN, "none": None,
              "reader": READER_TOKEN, "node": cred.node_token(AGENT_SECRET, NODE),
              "other node": cred.node_token(AGENT_SECRET, "auth-n2")}
    for caller, user in (("member", "bob"), ("other team", "carol"), ("team admin", "alice"),
                         ("cluster admin", "root")):
        tokens[caller] = accounts.create_token(user, "laptop", "full", None, "admin", NOW)[1]
    tokens["expired"] = accounts.create_token("bob", "old", "full", NOW - 1, "admin", NOW - 100)[1]
    revoked, tokens["revoked"] = accounts.create_token("bob", "lost", "full", None, "admin", NOW)
    accounts.revoke_token(revoked.token_id, NOW)
    client = app.test_client()
    as_bob, as_alice = bearer(tokens["member"]), bearer(tokens["team admin"])
    for body in ({"command": "true"}, {"command": "true"}, {"command": "true", "array": {"count": 2}}):
        assert client.post("/jobs", json=body, headers=as_bob).status_code == 201
    assert client.post("/schedules", json={"name": "nightly", "cron": "@daily", "job": {"command": "true"}},
                       headers=as_alice).status_code == 201
    assert client.put("/concurrency/migrations", json={"limit": 2}, headers=as_alice).status_code == 200
    return client, tokens


def refused(status: int, caller: str) -> bool:
    return status in ((401,) if caller in ("none", "wrong", "expired", "revoked") else (403, 404, 409))


def expected(endpoint: str, caller: str) -> str:
    """`through` (anything but 401 and 403), or the refusal it must be: `401`, `403`,
    `404` or `hidden` (403, 404 or 409)."""
    access = routes.ACCESS[endpoint]
    if not access.roles:
        return "through"
    if caller in ("none", "wrong", "expired", "revoked"):
        return "401"
    role = {"reader": READER_ROLE, "operator": OPERATOR_ROLE, "cluster admin": OPERATOR_ROLE,
            "node": AGENT_ROLE, "other node": AGENT_ROLE}.get(caller, USER_ROLE)
    if role not in access.roles:
        return "403"
    if caller == "other node" and access.node is not None:
        return "403"  # the request is about NODE's work
    if role != USER_ROLE:
        return "through"
    rule = USER_RULES[endpoint]
    if rule == "all" or (rule == "team" and caller != "other team") or (rule == "admin" and caller == "team admin"):
        return "through"
    if rule == "team":
        return "404"
    return "403" if caller == "member" else "hidden"


def test_every_route_users_may_call_says_what_each_user_gets():
    """Generated from the declarations: a route users may call is not forgotten here."""
    user_routes = {endpoint for endpoint, access in routes.ACCESS.items() if USER_ROLE in access.roles}
    assert user_routes == set(USER_RULES), "a route users may call was added or removed: say who gets what"
    assert set(routes.ACCESS) <= set(SCHEDULER_ROUTES) | {"ui.index_html"}


@pytest.mark.slow
@pytest.mark.parametrize("with_reader", [True, False], ids=["with the read-only token", "without it"])
def test_every_route_against_every_caller(tmp_path, with_reader):
    client, tokens = scheduler(tmp_path, with_reader)
    failures = []
    # Deletions last (they remove what other routes name), each route's refused callers first.
    for endpoint in sorted(SCHEDULER_ROUTES, key=lambda e: SCHEDULER_ROUTES[e][0] == "DELETE"):
        if endpoint not in routes.ACCESS:
            continue  # the servers' own routes (/healthz, /ui...): test_auth.py
        method, path, body = EXAMPLES.get(endpoint, SCHEDULER_ROUTES[endpoint][:3])
        for caller in sorted(CALLERS, key=lambda c: expected(endpoint, c) == "through"):
            want = expected(endpoint, caller)
            if caller == "reader" and not with_reader:
                want = "401"  # an unknown token
            response = call(client, method, path, body, bearer(tokens[caller]))
            status = response.status_code
            leaks = "ml" in response.get_data(as_text=True) and "ml" not in path  # names what it did not
            ok = {"through": status not in (401, 403, 500), "401": status == 401,  # 503: the registry is down
                  "403": status == 403, "404": status == 404, "hidden": refused(status, caller) and not leaks}[want]
            if ok and want != "through":
                ok = isinstance(response.json, dict) and bool(response.json.get("error"))
            if not ok:
                failures.append((endpoint, caller, want, status, response.get_data(as_text=True)[:160]))
    assert not failures, "\n".join(map(str, failures))
