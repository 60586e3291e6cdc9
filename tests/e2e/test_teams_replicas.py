"""Three users on two teams share one cluster served by two scheduler replicas (each a
gunicorn master with two workers) on one PostgreSQL database: alice (ml's admin)
and bob (an ml member) with personal tokens, carol (web) signed in through an
OpenID Connect provider on loopback. Each sees and changes only what their role
allows, whichever replica they reach; a revocation on one replica is in force on
the other within seconds; the audit log, read on either, says who did what."""
import pytest
import requests

from cluster import Cluster
from helpers import wait_for
from oidc_support import AUDIENCE, Provider

from corral.scheduler import personal_tokens

pytestmark = pytest.mark.e2e

OPERATOR_TOKEN = "replicas-operator-6d1c9e3a"
AGENT_SECRET = "replicas-agent-2f8b7a41"
TOKENS = {"CORRAL_API_TOKEN": OPERATOR_TOKEN, "CORRAL_AGENT_TOKEN": AGENT_SECRET}


def as_(token):
    return {"Authorization": f"Bearer {token}"}


def test_three_users_on_two_teams_share_two_replicas(tmp_path, pg_url, request):
    provider = Provider()
    provider.add_key("k1")
    sso = {"CORRAL_OIDC_ISSUER": provider.issuer, "CORRAL_OIDC_AUDIENCE": AUDIENCE}
    c = Cluster(tmp_path, database_url=pg_url, **TOKENS, **sso)
    try:
        c.start_registry(**TOKENS)
        a, b = c.start_scheduler(), c.start_scheduler(name="scheduler-b")
        admin = requests.Session()
        admin.headers.update(as_(OPERATOR_TOKEN))
        for team in ("ml", "web"):
            assert admin.post(f"{a}/teams", json={"name": team}, timeout=10).status_code == 201
        tokens = {}
        for user, teams in (("alice", {"ml": "admin"}), ("bob", {"ml": "member"})):
            assert admin.post(f"{b}/users", json={"name": user, "teams": teams}, timeout=10).status_code == 201
            made = admin.post(f"{a}/tokens", json={"name": "laptop", "user": user}, timeout=10).json()
            tokens[user] = made["token"]
        tokens["carol"] = provider.token(sub="00u-carol", preferred_username="carol", groups=["corral:web"])

        def call(who, method, url, **kwargs):
            return requests.request(method, url, headers=as_(tokens[who]), timeout=10, **kwargs)

        # bob submits on one replica; carol, through the provider, on the other, in her team.
        job = call("bob", "POST", f"{a}/jobs", json={"command": "sleep 60", "env_vars": {"KEY": "s3cret"}}).json()
        assert (job["team"], job["submitted_by"]) == ("ml", "bob")
        theirs = call("carol", "POST", f"{b}/jobs", json={"command": "true"}).json()
        assert (theirs["team"], theirs["submitted_by"]) == ("web", "carol")
        # Each sees their team's jobs only, on either replica; another team's job is not found.
        for url in (a, b):
            assert [j["job_id"] for j in call("carol", "GET", f"{url}/jobs").json()] == [theirs["job_id"]]
            assert call("carol", "GET", f"{url}/jobs/{job['job_id']}").status_code == 404
            assert call("carol", "POST", f"{url}/jobs/{job['job_id']}/cancel", json={}).status_code == 404
            assert [j["job_id"] for j in call("alice", "GET", f"{url}/jobs").json()] == [job["job_id"]]
        # Secrets for the submitter and the team's admin; the team's admin cancels.
        assert call("alice", "GET", f"{b}/jobs/{job['job_id']}").json()["env_vars"] == {"KEY": "s3cret"}
        assert call("alice", "POST", f"{b}/jobs/{job['job_id']}/cancel", json={}).status_code == 200

        # A token revoked on one replica is refused on the other within seconds.
        assert call("bob", "GET", f"{b}/whoami").status_code == 200  # cached there now
        token_id = call("bob", "GET", f"{a}/whoami").json()["token_id"]
        assert call("bob", "DELETE", f"{a}/tokens/{token_id}", json={}).status_code == 200
        wait_for(lambda: call("bob", "GET", f"{b}/whoami").status_code == 401,
                 timeout=3 * personal_tokens.TTL_SECS + 5, message="the other replica to refuse the revoked token")

        # The audit log says who did all of it, read on either replica.
        log = admin.get(f"{b}/audit", params={"limit": 100}, timeout=10).json()["events"]
        done = {(e["user"], e["action"], e["status"]) for e in log}
        assert {("bob", "submitJob", 201), ("carol", "submitJob", 201), ("carol", "cancelJob", 404),
                ("alice", "cancelJob", 200), ("bob", "revokeToken", 200), ("carol", "oidcLogin", 200),
                ("admin", "createTeam", 201), ("admin", "createToken", 201)} <= done
        assert admin.get(f"{a}/audit", params={"user": "carol"}, timeout=10).json()["events"][0]["user"] == "carol"
    finally:
        c.stop()
        provider.close()
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(c.logs())
