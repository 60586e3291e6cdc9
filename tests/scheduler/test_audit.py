"""The audit log (control-plane/server/audit_trail.py, store/audit.py, api/audit.py): every
state-changing request of a user is recorded with who, what, where and the answer,
in the same transaction as the change, never with a secret; GET /audit shows it to
those who may see it. On each backend."""
import pytest
from teams_support import submit, three_teams

from corral.scheduler.models import AuditEvent


@pytest.fixture
def cluster(database_url):
    return three_teams(database_url)


def entries(cluster, who="operator", **params):
    answer = cluster(who, "GET", "/audit", query_string=params)
    assert answer.status_code == 200, answer.json
    return answer.json["events"]


def test_submits_cancels_and_refusals_are_recorded_with_who_what_where_and_the_answer(cluster):
    job = submit(cluster, "bob", env_vars={"API_KEY": "s3cret-value"})["job_id"]
    assert cluster("carol", "POST", f"/jobs/{job}/cancel", json={}).status_code == 404  # another team's: refused
    assert cluster("alice", "POST", f"/jobs/{job}/cancel", json={}).status_code == 200  # her team's admin
    cluster("alice", "GET", f"/jobs/{job}")  # reads are not recorded
    log = entries(cluster)
    assert [(e["user"], e["action"], e["status"], e["team"]) for e in log] == [
        ("alice", "cancelJob", 200, "ml"), ("carol", "cancelJob", 404, None), ("bob", "submitJob", 201, "ml")]
    cancel, refused, submitted = log
    assert submitted["target"] == job and cancel["target"] == job and submitted["method"] == "POST"
    assert cancel["path"] == f"/jobs/{job}/cancel" and cancel["address"] == "127.0.0.1"
    assert submitted["token_id"].startswith("tok-") and submitted["at"].endswith("Z")
    assert log[0]["id"] > log[1]["id"] > log[2]["id"]


def test_no_secret_reaches_the_log(cluster):
    """Neither env var values, nor the secret of a token made, nor a bearer token."""
    submit(cluster, "bob", env_vars={"API_KEY": "s3cret-value"})
    made = cluster("alice", "POST", "/tokens", json={"name": "ci"}).json
    cluster.app.test_client().post("/jobs", json={"command": "true", "env_vars": {"X": "another-s3cret"}},
                                   headers={"Authorization": f"Bearer {cluster.tokens['operator']}",
                                            "X-Extra": "s3cret-header"})
    rows = [tuple(str(value) for value in row) for row in AuditEvent.select().tuples()]
    assert rows
    for secret in ("s3cret-value", made["token"], "another-s3cret", "s3cret-header",
                   *cluster.tokens.values()):
        assert not any(secret in value for row in rows for value in row)
    assert any(e["action"] == "createToken" and e["target"] is None and e["user"] == "alice"
               for e in entries(cluster))


def test_the_entry_commits_with_the_change_and_not_without_it(cluster, monkeypatch):
    """A failed write leaves no entry of success: the entry is in the change's transaction."""
    # The entry is written just before COMMIT: a failure there rolls the change back too.
    monkeypatch.setattr(cluster.store.audit, "_insert", lambda: "INSERT INTO no_such_table VALUES (1)")
    before = cluster("operator", "GET", "/jobs").json
    answer = cluster("bob", "POST", "/jobs", json={"command": "true"})
    assert answer.status_code >= 500
    assert cluster("operator", "GET", "/jobs").json == before  # no job without its record
    assert AuditEvent.select().count() == 0


def test_a_refusal_by_role_is_recorded_and_a_request_without_credential_is_not(cluster):
    assert cluster("dave", "POST", "/teams", json={"name": "ops"}).status_code == 403  # a reader
    assert cluster("bob-read", "POST", "/jobs", json={"command": "true"}).status_code == 403  # read-only token
    answer = cluster.app.test_client().post("/teams", json={"name": "ops"})
    assert answer.status_code == 401
    log = entries(cluster)
    assert [(e["user"], e["action"], e["status"]) for e in log] == [
        ("bob", "submitJob", 403), ("dave", "createTeam", 403)]
    assert log[0]["token_id"] is not None


def test_membership_team_and_token_changes_are_recorded_with_their_team_and_target(cluster):
    assert cluster("operator", "POST", "/teams", json={"name": "ops"}).status_code == 201
    assert cluster("alice", "PUT", "/teams/ml/members/carol", json={"role": "member"}).status_code == 200
    token = cluster("alice", "POST", "/tokens", json={"name": "laptop2"}).json["token_id"]
    assert cluster("alice", "DELETE", f"/tokens/{token}", json={}).status_code == 200
    log = entries(cluster)
    assert [(e["action"], e["team"], e["target"]) for e in log] == [
        ("revokeToken", None, token), ("createToken", None, None), ("setMember", "ml", "ml/carol"),
        ("createTeam", None, None)]


def test_who_sees_the_log_and_its_filters(cluster):
    submit(cluster, "bob")
    submit(cluster, "carol", team="web")
    cluster("operator", "POST", "/teams", json={"name": "ops"})
    # Cluster admins and the cluster-wide reader see all; a team's admin their team's.
    assert len(entries(cluster)) == len(entries(cluster, "dave")) == len(entries(cluster, "reader")) == 3
    assert [e["user"] for e in entries(cluster, "alice")] == ["bob"]
    for who in ("bob", "carol"):
        answer = cluster(who, "GET", "/audit")
        assert answer.status_code == 403 and "audit log" in answer.json["error"]
    assert [e["user"] for e in entries(cluster, user="carol")] == ["carol"]
    assert [e["team"] for e in entries(cluster, team="web")] == ["web"]
    assert [e["action"] for e in entries(cluster, action="createTeam")] == ["createTeam"]
    assert entries(cluster, team="web", user="bob") == []
    now = cluster.clock()
    assert len(entries(cluster, since=str(now - 1))) == 3 and entries(cluster, until=str(now - 1)) == []
    # Pages, newest first.
    first = cluster("operator", "GET", "/audit", query_string={"limit": 2}).json
    second = cluster("operator", "GET", "/audit", query_string={"limit": 2, "before": first["next_before"]}).json
    assert [e["action"] for e in first["events"] + second["events"]] == ["createTeam", "submitJob", "submitJob"]
    assert second["next_before"] is None


@pytest.mark.parametrize("params", [{"user": "a b"}, {"team": "a:b"}, {"action": "drop table"},
                                    {"since": "yesterday"}, {"limit": "0"}, {"before": "-1"}])
def test_bad_filters_are_refused(cluster, params):
    answer = cluster("operator", "GET", "/audit", query_string=params)
    assert answer.status_code == 400 and answer.json["error"].startswith("query parameter")


def test_agents_reports_are_not_recorded_and_old_entries_are_purged(cluster):
    submit(cluster, "bob")
    assert AuditEvent.select().count() == 1
    cluster.clock.now += 8 * 86400
    assert cluster.store.audit.purge(cluster.clock() - 7 * 86400, 100) == 1
    assert AuditEvent.select().count() == 0
